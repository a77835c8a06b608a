"""A batch handler's process killed (SIGKILL) inside the batch's transaction, and between its commit and its
offset commit: every occurrence of the batch is applied exactly once afterwards, and the engine ends SUCCEEDED.

The engine side runs in this process on the manual clock; the consumer under test runs in its own process
(``tests/e2e/consumer_process.py --batch``) and stops at a handoff of the batch's first occurrence, with the
whole batch at that point.
"""

from __future__ import annotations

import signal
import uuid

import asyncpg

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from tests.e2e.test_consumer_faults import ConsumerProcess, all_succeeded
from tests.support.rows import attempt_rows, due_occurrence
from tests.support.services import Running
from tests.support.waiting import wait_for

BATCH = 5


def recovering_batch_app(kafka_bootstrap: str, consumer_db: str, group: str, target: str) -> ConsumerApp:
    """A second member of the same group, in this process, with the same batch effect."""
    app = ConsumerApp(
        ConsumerConfig(
            group, kafka_bootstrap, consumer_db, session_timeout=2.0, heartbeat_interval=0.4, redelivery_backoff=0.05
        )
    )

    @app.handler(target, batch=BATCH)
    async def apply(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
        await conn.executemany(
            "INSERT INTO effects (occurrence_id, attempt, lease_token) VALUES ($1, $2, $3)",
            [(o.occurrence_id, o.attempt, o.lease_token) for o in occurrences],
        )

    return app


async def published(pool: asyncpg.Pool, ids: set[uuid.UUID]) -> bool:
    unsent = "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND occurrence_id = ANY($1)"
    return await pool.fetchval(unsent, list(ids)) == 0


async def killed_in_batch(point, pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path, target):
    occurrences = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(BATCH)]
    ids = {o.occurrence_id for o in occurrences}
    await wait_for(lambda: published(pool, ids))  # in the topic before the consumer starts: one batch
    group = f"batch-crash-{uuid.uuid4().hex[:8]}"
    victim = await ConsumerProcess.start(
        tmp_path, kafka_bootstrap, consumer_db, group, target, "--batch", str(BATCH), "--pause-at", point
    )
    try:
        batch = await victim.expect("BATCH")
        await victim.expect(f"AT {point}")
        victim.send(signal.SIGKILL)
        await victim.exit_code()
    finally:
        await victim.kill()
    assert int(batch[1]) == BATCH
    committed = await effects.fetchval("SELECT count(*) FROM effects WHERE occurrence_id = ANY($1)", list(ids))
    assert committed == (0 if point == "before_commit" else BATCH), point  # all or nothing: one transaction
    killed_tokens = {ident: token for ident, token in await _dedupe_tokens(effects, ids)}

    async with Running(recovering_batch_app(kafka_bootstrap, consumer_db, group, target)) as app:
        await wait_for(lambda: all_succeeded(pool, ids), timeout=30)
        if point == "after_report":
            # The engine knew every occurrence SUCCEEDED before the kill; the redelivery (the offset was never
            # committed) must still come, and be recognised as already applied.
            await wait_for(lambda: app.stats.duplicates >= BATCH, timeout=30)
    rows = await effects.fetch("SELECT occurrence_id FROM effects WHERE occurrence_id = ANY($1)", list(ids))
    assert sorted(r["occurrence_id"] for r in rows) == sorted(ids), point  # every one, each exactly once
    for occurrence in occurrences:
        attempts = await attempt_rows(pool, occurrence.occurrence_id)
        if point == "before_commit":
            # The redelivery took the same delivery over with a new lease; the dead worker's attempt is fenced.
            assert [a["result"] for a in attempts] == ["fenced", "succeeded"], point
        else:
            # The effects were the killed worker's: its attempts succeeded, nothing else ran.
            assert [(a["lease_token"], a["result"]) for a in attempts] == [
                (killed_tokens[occurrence.occurrence_id], "succeeded")
            ], point


async def _dedupe_tokens(effects: asyncpg.Pool, ids: set[uuid.UUID]) -> list:
    return await effects.fetch(
        "SELECT occurrence_id, lease_token FROM chronoq_consumer_dedupe WHERE occurrence_id = ANY($1)", list(ids)
    )


async def test_a_batch_killed_inside_its_transaction_is_applied_once_by_the_next_owner(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target, tmp_path
):
    """SIGKILL after the batch's effects and dedupe rows were written, before the commit."""
    await killed_in_batch("before_commit", pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path, target)


async def test_a_batch_killed_between_its_commit_and_its_offset_commit_is_not_applied_again(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target, tmp_path
):
    """SIGKILL after the commit and the succeeded reports, before the Kafka offset commit."""
    await killed_in_batch("after_report", pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path, target)

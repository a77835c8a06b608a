"""The consumer runtime with the engine in the loop: retries, dead letters and replay, infrastructure errors,
concurrency and offsets, timeouts, version checks and cooperative cancellation."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import orjson
import pytest
from aiokafka import TopicPartition

from consumers import (
    ConsumerApp,
    ConsumerConfig,
    ConsumerHooks,
    Occurrence,
    PermanentError,
)
from consumers.attempt_reports import AttemptReporter
from consumers.errors import InfrastructureError
from schemas.dead_letter_messages import decode_dead_occurrence
from schemas.messages import MalformedMessage, ScheduleStateMessage
from schemas.topics import DEAD_LETTER_TOPIC, SCHEDULE_STATES_TOPIC, occurrence_topic
from tests.support.kafka import attempt_events, occurrence_message, produce, read_topic
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row
from tests.support.services import Running
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def new_app(consumer_db, kafka_bootstrap, **config) -> ConsumerApp:
    hooks = config.pop("hooks", None)
    return ConsumerApp(
        ConsumerConfig(
            f"rt-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            redelivery_backoff=0.05,
            shutdown_grace=2.0,
            **config,
        ),
        hooks=hooks,
    )


async def state_is(pool, ident, expected: str, attempt_count: int | None = None) -> bool:
    row = await occurrence_row(pool, ident)
    return row["state"] == expected and (attempt_count is None or row["attempt_count"] == attempt_count)


async def test_a_handler_failing_transiently_twice_succeeds_on_attempt_three_with_one_effect(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target
):
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=5, base=1.0, cap=1.0)
    app = new_app(consumer_db, kafka_bootstrap)
    calls = []

    @app.handler(target)
    async def flaky(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        calls.append(occurrence.attempt)
        await conn.execute(
            "INSERT INTO effects (occurrence_id, attempt) VALUES ($1, $2)", occurrence.occurrence_id, occurrence.attempt
        )
        if len(calls) <= 2:
            raise ConnectionRefusedError("downstream unavailable")  # the handler's own dependency: transient

    async with Running(app):
        for attempt in (1, 2):
            await wait_for(functools.partial(state_is, pool, sent.occurrence_id, "RETRY_WAIT", attempt))
            clock.advance(1)  # past the backoff (cap 1 s): the relay publishes the retry
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED", 3))
    attempts = await attempt_rows(pool, sent.occurrence_id)
    assert [(a["attempt_number"], a["result"], a["error_class"]) for a in attempts] == [
        (1, "failed", "ConnectionRefusedError"),
        (2, "failed", "ConnectionRefusedError"),
        (3, "succeeded", None),
    ]
    assert len({a["lease_token"] for a in attempts}) == 3
    assert calls == [1, 2, 3]
    assert await effects.fetch("SELECT occurrence_id, attempt FROM effects") == [(sent.occurrence_id, 3)]
    assert await effects.fetchval("SELECT lease_token FROM chronoq_consumer_dedupe") == attempts[2]["lease_token"]


async def test_a_permanent_error_is_dead_after_one_attempt_listed_and_replayed_with_the_same_id(
    engine, engine_db, pool, clock, kafka_bootstrap, consumer_db, effects, target
):
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=5)
    app = new_app(consumer_db, kafka_bootstrap)
    seen = []

    class InvoiceRejected(Exception):
        pass

    @app.handler(target, permanent_errors=(InvoiceRejected,))
    async def invoice(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        seen.append((occurrence.occurrence_id, occurrence.attempt))
        await conn.execute(
            "INSERT INTO effects (occurrence_id, attempt) VALUES ($1, $2)", occurrence.occurrence_id, occurrence.attempt
        )
        if len(seen) == 1:
            raise InvoiceRejected("customer 42 does not exist")  # the app's own type, mapped to permanent

    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")} | {
        "CHRONOQ_DATABASE_URL": engine_db,
        "CHRONOQ_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    async with Running(app):
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "DEAD", 1))
        listed = await asyncio.to_thread(cli, ["dlq", "list", "--tenant", "acme", "--json"], env)
        (item,) = orjson.loads(listed)["items"]
        assert (item["occurrence_id"], item["reason"], item["error_class"], item["attempts"]) == (
            str(sent.occurrence_id),
            "permanent_error",
            "InvoiceRejected",
            1,
        )
        dead = [
            decode_dead_occurrence(r.value)
            for r in await read_topic(kafka_bootstrap, DEAD_LETTER_TOPIC, 0, settle=0.3)
            if is_dead(r.value)
        ]
        assert [d.error_message for d in dead if d.occurrence.occurrence_id == sent.occurrence_id] == [
            "customer 42 does not exist"
        ]

        replayed = orjson.loads(
            await asyncio.to_thread(cli, ["dlq", "replay", str(sent.occurrence_id), "--tenant", "acme", "--json"], env)
        )
        assert (replayed["occurrence_id"], replayed["attempt"]) == (str(sent.occurrence_id), 2)
        # The CLI replays on the database's clock; bring the test's engine clock up to that instant.
        due = await pool.fetchval("SELECT max(available_at) FROM outbox WHERE occurrence_id = $1", sent.occurrence_id)
        clock.set(max(clock.now(), due))
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED", 2))
    assert seen == [(sent.occurrence_id, 1), (sent.occurrence_id, 2)]  # the same occurrence_id again
    assert await effects.fetch("SELECT occurrence_id, attempt FROM effects") == [(sent.occurrence_id, 2)]


def cli(args: list[str], env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "engine.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def is_dead(value: bytes | None) -> bool:
    try:
        decode_dead_occurrence(value)
    except MalformedMessage:
        return False
    return True


async def test_a_replayed_occurrence_whose_effect_exists_is_not_applied_again(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target
):
    """The effect committed, then the worker stalled past its last lease: DEAD, its late success fenced.
    Replay delivers the same occurrence_id; the dedupe row says it was applied; no second effect."""
    from engine.control.dead_letters import replay_dead_letter

    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=1)
    committed, resume = asyncio.Event(), asyncio.Event()

    async def stall_once(occurrence: Occurrence) -> None:
        if not committed.is_set():
            committed.set()
            await resume.wait()

    app = new_app(consumer_db, kafka_bootstrap, hooks=ConsumerHooks(after_commit=stall_once))
    calls = []

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        calls.append(occurrence.attempt)
        await conn.execute(
            "INSERT INTO effects (occurrence_id, attempt) VALUES ($1, $2)", occurrence.occurrence_id, occurrence.attempt
        )

    async with Running(app):
        await committed.wait()
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "RUNNING"))
        clock.advance(31)  # past the 30 s lease, no heartbeat
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "DEAD"))
        resume.set()  # its late "succeeded" is fenced
        (first,) = await attempt_rows(pool, sent.occurrence_id)
        await attempt_events(kafka_bootstrap, sent.occurrence_id, 2)  # started, succeeded (late)
        await asyncio.sleep(0.5)
        assert await state_is(pool, sent.occurrence_id, "DEAD") and first["result"] == "timed_out"

        await replay_dead_letter(pool, "acme", sent.occurrence_id, clock)
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED"))
    assert calls == [1] and app.stats.duplicates == 1
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1


async def test_an_unreachable_app_database_does_not_consume_an_attempt(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target, servers
):
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=1)
    database = urlsplit(consumer_db).path.lstrip("/")
    admin = await asyncpg.connect(servers.admin_url)
    entered, outage = asyncio.Event(), asyncio.Event()
    app = new_app(consumer_db, kafka_bootstrap)

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        if not entered.is_set():
            entered.set()
            await outage.wait()  # the database goes away under the running handler
        await conn.execute(
            "INSERT INTO effects (occurrence_id, attempt) VALUES ($1, $2)", occurrence.occurrence_id, occurrence.attempt
        )

    try:
        async with Running(app):
            await entered.wait()
            await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                database,
            )
            outage.set()
            await wait_for(lambda: app.stats.infrastructure_errors >= 2)  # retried in place, with backoff
            await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
            await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED", 1))
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
    # max_attempts=1 and still SUCCEEDED: the outage consumed no attempt. The interrupted try's lease was
    # taken over by the retry of the same delivery.
    attempts = await attempt_rows(pool, sent.occurrence_id)
    assert [(a["attempt_number"], a["result"]) for a in attempts] == [(1, "fenced"), (1, "succeeded")]
    assert app.stats.failures == 0
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1


async def test_an_unavailable_broker_for_reports_does_not_consume_an_attempt(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target, monkeypatch
):
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=1)
    real_send, refusals = AttemptReporter.send, [2]

    async def flaky_send(self, event, target):  # the broker refuses the first two reports ("started")
        if refusals[0] > 0:
            refusals[0] -= 1
            raise InfrastructureError("broker unavailable")
        await real_send(self, event, target)

    monkeypatch.setattr(AttemptReporter, "send", flaky_send)
    app = new_app(consumer_db, kafka_bootstrap)
    calls = []

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        calls.append(occurrence.attempt)
        await conn.execute(
            "INSERT INTO effects (occurrence_id, attempt) VALUES ($1, $2)", occurrence.occurrence_id, occurrence.attempt
        )

    async with Running(app):
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED", 1))
    # The handler ran only once the start was acknowledged; max_attempts=1 and still SUCCEEDED.
    assert calls == [1] and app.stats.infrastructure_errors == 2
    assert [a["result"] for a in await attempt_rows(pool, sent.occurrence_id)] == ["succeeded"]


async def test_concurrent_handlers_are_bounded_and_offsets_never_pass_an_unfinished_message(
    kafka_bootstrap, consumer_db, target
):
    sent = [occurrence_message(target, when=datetime(2026, 11, 29, 10, i, tzinfo=UTC)) for i in range(6)]
    await produce(kafka_bootstrap, occurrence_topic(target), [m.encode() for m in sent])  # one partition
    app = new_app(consumer_db, kafka_bootstrap, attempt_barrier=False)
    running: set[uuid.UUID] = set()
    release = {m.occurrence_id: asyncio.Event() for m in sent}
    most = [0]

    @app.handler(target, concurrency=3)
    async def slow(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        running.add(occurrence.occurrence_id)
        most[0] = max(most[0], len(running))
        await release[occurrence.occurrence_id].wait()
        running.discard(occurrence.occurrence_id)

    async def committed() -> int | None:
        (tp,) = [lane.tp for lane in app._lanes.values() if lane.offsets.committable() is not None]
        assert app._consumer is not None
        return await app._consumer.committed(TopicPartition(tp.topic, tp.partition))

    async with Running(app):
        await wait_for(lambda: len(running) == 3)
        assert running == {m.occurrence_id for m in sent[:3]}  # started in offset order
        release[sent[1].occurrence_id].set()
        release[sent[2].occurrence_id].set()
        await wait_for(lambda: app.stats.applied == 2)
        await wait_for(lambda: len(running) == 3)  # two more started
        await asyncio.sleep(0.3)
        assert await committed() in (None, 0)  # message 0 still runs: the commit never passes it
        release[sent[0].occurrence_id].set()
        await wait_for(lambda: committed_is(committed, 3))  # 0, 1, 2 done; 3 still runs
        for m in sent[3:]:
            release[m.occurrence_id].set()
        await wait_for(lambda: committed_is(committed, 6))
    assert most[0] == 3 and app.stats.applied == 6


async def committed_is(committed, expected: int) -> bool:
    return await committed() == expected


async def test_timeouts_and_mapped_permanent_errors_are_reported_as_failures(kafka_bootstrap, consumer_db, target):
    slow, bad = occurrence_message(target), occurrence_message(target, when=datetime(2026, 11, 29, 11, tzinfo=UTC))
    await produce(kafka_bootstrap, occurrence_topic(target), [slow.encode(), bad.encode()])
    app = new_app(consumer_db, kafka_bootstrap, attempt_barrier=False)

    @app.handler(target, timeout=0.3, permanent_errors=(KeyError,))
    async def handle(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        if occurrence.occurrence_id == slow.occurrence_id:
            await asyncio.sleep(10)
        raise KeyError("customer")

    async with Running(app):
        await wait_for(lambda: app.stats.failures == 2)
    (_, timed_out) = await attempt_events(kafka_bootstrap, slow.occurrence_id, 2)
    (_, rejected) = await attempt_events(kafka_bootstrap, bad.occurrence_id, 2)
    assert (timed_out.error_class, timed_out.permanent) == ("HandlerTimeout", False)
    assert (rejected.error_class, rejected.permanent) == ("KeyError", True)
    with pytest.raises(PermanentError):
        raise PermanentError("exported for apps")


async def test_obsolete_versions_are_skipped_and_a_canceled_schedule_interrupts_its_running_handler(
    kafka_bootstrap, consumer_db, effects, target
):
    at = datetime(2026, 11, 29, 10, tzinfo=UTC)
    stale, doomed = occurrence_message(target), occurrence_message(target, when=datetime(2026, 11, 29, 11, tzinfo=UTC))
    updated = ScheduleStateMessage(stale.schedule_id, "acme", 2, "active", at)
    await produce(kafka_bootstrap, SCHEDULE_STATES_TOPIC, [updated.encode()], key=updated.key)
    app = new_app(consumer_db, kafka_bootstrap, attempt_barrier=False)
    started = asyncio.Event()
    calls = []

    @app.handler(target)
    async def handle(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        calls.append(occurrence.occurrence_id)
        await conn.execute(
            "INSERT INTO effects (occurrence_id, attempt) VALUES ($1, $2)", occurrence.occurrence_id, occurrence.attempt
        )
        started.set()
        await occurrence.cancellation.wait()  # a long job that checks its signal
        occurrence.cancellation.raise_if_canceled()

    async with Running(app):
        await produce(kafka_bootstrap, occurrence_topic(target), [stale.encode(), doomed.encode()])
        await started.wait()
        canceled = ScheduleStateMessage(doomed.schedule_id, "acme", 2, "canceled", at)
        await produce(kafka_bootstrap, SCHEDULE_STATES_TOPIC, [canceled.encode()], key=canceled.key)
        await wait_for(lambda: app.stats.canceled == 2)
    assert calls == [doomed.occurrence_id]  # the obsolete version never ran
    (skip,) = await attempt_events(kafka_bootstrap, stale.occurrence_id, 1)
    assert (skip.event, skip.reason, skip.lease_token) == ("canceled", "stale_version", None)
    _, interrupted = await attempt_events(kafka_bootstrap, doomed.occurrence_id, 2)
    assert (interrupted.event, interrupted.reason) == ("canceled", "cooperative")
    assert interrupted.lease_token is not None
    assert await effects.fetchval("SELECT count(*) FROM effects") == 0  # rolled back

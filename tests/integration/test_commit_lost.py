"""The connection drops during the COMMIT of a delivery's transaction: its outcome is unknown to the app.

TESTING.md: "Connection lost during COMMIT: outcome unknown, re-check by key." The app database sits behind a
TCP gate that cuts the connection on the COMMIT of the transaction holding the handler's effect and its dedupe
row — before the server sees the COMMIT (the transaction aborts) or just after (it commits; the app never hears
so). Either way the delivery is retried, the dedupe key decides, and the effect exists exactly once; the engine
hears of one applied attempt.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from consumers import ConsumerApp, Occurrence
from schemas.topics import occurrence_topic
from tests.integration.test_consumer import engineless_config, run_until
from tests.support.kafka import attempt_events, occurrence_message, produce
from tests.support.tcp_gate import Gate


def gated_app(url: str, kafka_bootstrap: str, target: str, gate: Gate, cut: str, batch: bool) -> Any:
    app: Any = ConsumerApp(engineless_config(url, kafka_bootstrap))
    app.calls = 0

    async def effect(conn: asyncpg.Connection, occurrence: Occurrence) -> None:
        app.calls += 1
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)
        if app.calls == 1:
            gate.cut_commit = cut  # this transaction's COMMIT is the next one the app sends

    if batch:

        @app.handler(target, batch=10)
        async def apply_batch(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
            for occurrence in occurrences:
                await effect(conn, occurrence)
    else:

        @app.handler(target)
        async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
            await effect(conn, occurrence)

    return app


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("cut", ["before", "after"])
async def test_a_connection_lost_during_the_commit_applies_the_effect_exactly_once(
    cut, batch, consumer_db, kafka_bootstrap, target, effects
):
    gate = Gate(consumer_db)
    gate.open = True
    app = gated_app(await gate.start(), kafka_bootstrap, target, gate, cut, batch)
    sent = occurrence_message(target)
    await produce(kafka_bootstrap, occurrence_topic(target), [sent.encode()])
    try:
        await run_until(app, lambda: app.stats.applied + app.stats.duplicates >= 1 and gate.commits_cut == 1, 30)
    finally:
        await gate.stop()
    assert gate.commits_cut == 1
    # before: the first try aborted and the second applied it; after: the first committed, the retry found it.
    assert app.calls == (2 if cut == "before" else 1)
    assert await effects.fetchval("SELECT count(*) FROM effects WHERE occurrence_id = $1", sent.occurrence_id) == 1
    assert await effects.fetchval("SELECT count(*) FROM chronoq_consumer_dedupe") == 1
    # The engine hears of one applied attempt and of no failure: a started per try, one succeeded.
    events = [e.event for e in await attempt_events(kafka_bootstrap, sent.occurrence_id, 2 + (cut == "before"))]
    assert sorted(events) == sorted(["started"] * app.calls + ["succeeded"]), events

"""Consumer timeouts on the real stack: a handler that works outside the database for longer than its lease
(heartbeating all along) still commits, with the default transaction limits."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from schemas.topics import ATTEMPTS_TOPIC, create_missing_topics, occurrence_topic
from tests.support.kafka import attempt_events, occurrence_message, produce
from tests.support.waiting import wait_for


async def test_a_handler_idle_in_its_transaction_longer_than_the_lease_commits(
    consumer_db, kafka_bootstrap, target, effects
):
    """Why: "Timeouts disagree". Before, PostgreSQL ended any transaction idle for lease_ttl: the attempt failed."""
    app = idle_app(consumer_db, kafka_bootstrap, lease_ttl=2.0, handler_timeout=30.0)
    # Renewed every 2/3 s: 4 heartbeats are well past the 2 s lease of idle time.
    await assert_an_idle_handler_commits(app, kafka_bootstrap, target, effects, heartbeats=4)


async def test_a_handler_whose_own_timeout_exceeds_the_apps_idle_limit_commits(
    consumer_db, kafka_bootstrap, target, effects
):
    """Why: the per-target timeout (`@app.handler(target, timeout=...)`) could exceed the app's
    transaction_idle_timeout, and PostgreSQL ended the transaction of a handler inside its own timeout. The
    target's transaction now gets its own limit (timeout + lease ttl, SET LOCAL in that transaction)."""
    app = idle_app(consumer_db, kafka_bootstrap, lease_ttl=1.0, handler_timeout=1.0)  # idle limit: 1 + 1 = 2 s
    assert app.config.idle_timeout == 2.0
    # Its own limit: 10 + 1 = 11 s. Renewed every 1/3 s: 9 heartbeats are 3 s idle, past the app's 2 s limit.
    await assert_an_idle_handler_commits(app, kafka_bootstrap, target, effects, heartbeats=9, timeout=10.0)


def idle_app(consumer_db: str, kafka_bootstrap: str, lease_ttl: float, handler_timeout: float) -> ConsumerApp:
    return ConsumerApp(
        ConsumerConfig(
            f"idle-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            attempt_barrier=False,  # no attempt processor runs here: nobody answers started
            session_timeout=2.0,
            heartbeat_interval=0.4,
            lease_ttl=lease_ttl,
            handler_timeout=handler_timeout,
        )
    )


async def assert_an_idle_handler_commits(
    app: ConsumerApp,
    kafka_bootstrap: str,
    target: str,
    effects: asyncpg.Pool,
    heartbeats: int,
    timeout: float | None = None,
) -> None:
    """One occurrence whose handler writes, then waits outside the database (its transaction idle) until
    ``heartbeats`` heartbeats were sent, then writes again: applied once, nothing failed."""
    message = occurrence_message(target)
    await create_missing_topics(kafka_bootstrap, [ATTEMPTS_TOPIC])  # where the heartbeats are counted
    await produce(kafka_bootstrap, occurrence_topic(target), [message.encode()])
    outside_the_database = asyncio.Event()

    @app.handler(target, timeout=timeout)
    async def slow(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)
        await outside_the_database.wait()  # the transaction sits idle meanwhile
        await conn.execute("UPDATE effects SET amount = 1 WHERE occurrence_id = $1", occurrence.occurrence_id)

    async def idle_long_enough() -> bool:
        beats = [e for e in await attempt_events(kafka_bootstrap, message.occurrence_id, 0) if e.event == "heartbeat"]
        return len(beats) >= heartbeats

    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        await wait_for(idle_long_enough, timeout=30)
        outside_the_database.set()
        await wait_for(lambda: app.stats.applied + app.stats.failures >= 1 or task.done(), timeout=20)
    finally:
        stop.set()
        await task
    assert (app.stats.applied, app.stats.failures) == (1, 0)
    assert await effects.fetchval("SELECT amount FROM effects WHERE occurrence_id = $1", message.occurrence_id) == 1

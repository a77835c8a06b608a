"""Schedule → occurrence → outbox → Kafka → consumer effect, on the real stack."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.control.schedules import ControlPlane
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.service import run_services
from relay.dispatcher import Relay, RelayConfig
from relay.outbox import OutboxStore
from relay.publisher import KafkaPublisher, PublisherConfig
from schemas import observability as obs
from tests.support.services import fast_services
from tests.support.waiting import wait_for

OCCURRENCE_ROWS = "SELECT count(*) FROM outbox WHERE occurrence_id IS NOT NULL"


def recording_app(consumer_db, kafka_bootstrap, target, barrier: bool = True, **instruments) -> ConsumerApp:
    app = ConsumerApp(
        ConsumerConfig(
            f"e2e-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            attempt_barrier=barrier,
        ),
        **instruments,
    )

    @app.handler(target)
    async def record(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        # No unique key on effects: a second application would show as a second row.
        await conn.execute(
            "INSERT INTO effects (occurrence_id, scheduled_for) VALUES ($1, $2)",
            occurrence.occurrence_id,
            occurrence.scheduled_for,
        )

    return app


async def test_a_one_time_schedule_is_consumed_exactly_once(
    engine_db, pool, consumer_db, kafka_bootstrap, clock, target, effects, acme
):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        "acme", {"kind": "once", "target": target, "expression": "2026-11-29T10:00:05Z"}
    )
    stop = asyncio.Event()
    services = asyncio.create_task(run_services(engine_db, kafka_bootstrap, stop, fast_services(), clock))
    app = recording_app(consumer_db, kafka_bootstrap, target)
    consumer = asyncio.create_task(app.run(stop))
    try:
        # Materialized ahead (into the ahead lane: this process leases the shards), not published before due.
        await wait_for(lambda: pool.fetchval("SELECT count(*) FROM dispatch_queue"))
        await asyncio.sleep(0.3)  # the relay polls: not due yet
        assert app.stats.applied == 0
        assert await pool.fetchval("SELECT count(*) FROM dispatch_log") == 0
        clock.advance(timedelta(seconds=5))
        await wait_for(lambda: app.stats.applied == 1)
        await asyncio.sleep(1.0)  # give a duplicate every chance to show up
        await wait_for(lambda: pool.fetchval("SELECT state = 'SUCCEEDED' FROM occurrences"))  # attempt reported
    finally:
        stop.set()
        await asyncio.gather(services, consumer)
    rows = await effects.fetch("SELECT * FROM effects")
    assert len(rows) == 1 and app.stats.duplicates == 0
    occurrence = await pool.fetchrow("SELECT * FROM occurrences WHERE schedule_id = $1::uuid", schedule["schedule_id"])
    assert rows[0]["occurrence_id"] == occurrence["occurrence_id"]
    assert occurrence["state"] == "SUCCEEDED" and occurrence["enqueued_at"] == clock.now()
    assert (await control.get_schedule("acme", schedule["schedule_id"]))["state"] == "completed"


async def test_trace_context_travels_from_the_relay_to_the_consumer_span(
    pool, consumer_db, kafka_bootstrap, clock, target, effects, telemetry, acme
):
    control = ControlPlane(pool, clock)
    await control.create_schedule("acme", {"kind": "once", "target": target, "expression": "2026-11-29T10:00:00Z"})
    await Materializer(pool, MaterializerConfig(), clock).run_once()
    publisher = KafkaPublisher(PublisherConfig(kafka_bootstrap))
    await publisher.start()
    try:
        relay = Relay(OutboxStore(pool, clock), publisher, RelayConfig(), **telemetry.instruments("relay"))
        assert (await relay.run_once()).published == 3  # the occurrence, the schedule's state, the target's binding
    finally:
        await publisher.stop()
    # No attempt processor runs here: nobody would answer started.
    app = recording_app(consumer_db, kafka_bootstrap, target, barrier=False, **telemetry.instruments("consumer"))
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    await wait_for(lambda: app.stats.applied == 1)
    stop.set()
    await task
    (publish,) = telemetry.spans(obs.SPAN_PUBLISH)
    (consume,) = telemetry.spans(obs.SPAN_CONSUME)
    assert consume.context.trace_id == publish.context.trace_id
    assert consume.parent.span_id == publish.context.span_id
    assert [p.value for p in telemetry.points(obs.OCCURRENCES_APPLIED)] == [1]

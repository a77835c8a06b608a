"""Cancel versus start, both orders, against the guarantee the runtime gives today (docs/state-machine.md,
"Cancel and the consumer's view").

The consumer never asks the engine whether an occurrence is still live: it checks the delivery against
its view of ``chronoq.schedule-states`` (eventually consistent) right before the handler, and the engine
accepts reports only for live occurrences. So:

* cancel first, and the consumer has read the cancellation: the delivery is skipped, nothing applied;
* cancel first, and the cancellation has not reached the consumer yet: the effect **can** be applied
  (once: the dedupe row), the engine keeps the occurrence CANCELED and fences the consumer's reports —
  the window is the schedule-state topic's lag;
* start first (the engine applied ``started`` before the cancel): the cancel answers ``still_running``
  and the handler's cancellation signal is set when the view learns it; giving up is CANCELED, finishing
  counts as success.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.control.schedules import ControlPlane
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.service import PIPELINE_ROLES, Role
from schemas.messages import decode_occurrence
from schemas.topics import SCHEDULE_STATES_TOPIC, occurrence_topic
from tests.support.kafka import produce
from tests.support.rows import attempt_rows, occurrence_row
from tests.support.services import Running, fast_services, services_running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


async def published_occurrence(control: ControlPlane, pool, clock, kafka_bootstrap: str, target: str):
    """A schedule whose first occurrence is in Kafka already (produced as the relay would)."""
    schedule = await control.create_schedule("acme", {"kind": "rate", "expression": "1m", "target": target})
    clock.advance(timedelta(seconds=45))
    await Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock).run_once()
    raw = await pool.fetchval("SELECT message FROM outbox WHERE occurrence_id IS NOT NULL")
    await produce(kafka_bootstrap, occurrence_topic(target), [raw])
    return schedule["schedule_id"], decode_occurrence(raw)


def recording_app(
    kafka_bootstrap: str, consumer_db: str, target: str, calls: list[uuid.UUID] | None = None, **config: Any
) -> ConsumerApp:
    app = ConsumerApp(
        ConsumerConfig(
            f"cancel-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            **config,
        )
    )

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        if calls is not None:
            calls.append(occurrence.occurrence_id)
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)

    return app


async def states_published(pool) -> bool:
    return not await pool.fetchval(
        "SELECT count(*) FROM outbox WHERE topic = $1 AND sent_at IS NULL", SCHEDULE_STATES_TOPIC
    )


async def test_cancel_before_start_that_the_consumer_has_read_is_a_barrier(
    engine_db, pool, clock, kafka_bootstrap, consumer_db, effects, target, acme
):
    """The cancellation is in chronoq.schedule-states before the consumer checks the delivery: skipped,
    reported canceled, no effect."""
    control = ControlPlane(pool, clock)
    schedule_id, message = await published_occurrence(control, pool, clock, kafka_bootstrap, target)
    answer = await control.cancel_schedule("acme", schedule_id)
    assert answer["canceled_occurrences"] == 1
    app = recording_app(kafka_bootstrap, consumer_db, target)
    engine = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER})  # the relay publishes the state
    async with services_running(engine_db, kafka_bootstrap, engine, clock):
        await wait_for(lambda: states_published(pool), timeout=30)
        async with Running(app):
            await wait_for(lambda: app.stats.canceled >= 1, timeout=30)
    assert app.stats.applied == 0
    assert await effects.fetchval("SELECT count(*) FROM effects") == 0
    assert (await occurrence_row(pool, message.occurrence_id))["state"] == "CANCELED"


async def test_cancel_before_start_that_the_consumer_has_not_read_is_refused_by_the_engine(
    engine_db, pool, clock, kafka_bootstrap, consumer_db, effects, target, acme
):
    """The barrier: the cancellation has not left the engine (no relay runs), so the consumer's view says
    the schedule is live — but the engine answers the consumer's `started` `refused: canceled` (the cancel
    committed first under the same row lock), and the runtime rolls back without calling the handler. On
    main this was the documented window: the effect was applied once."""
    control = ControlPlane(pool, clock)
    schedule_id, message = await published_occurrence(control, pool, clock, kafka_bootstrap, target)
    answer = await control.cancel_schedule("acme", schedule_id)
    assert answer["canceled_occurrences"] == 1
    calls: list[uuid.UUID] = []
    app = recording_app(kafka_bootstrap, consumer_db, target, calls)
    engine_without_relay = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER, Role.RELAY})
    async with services_running(engine_db, kafka_bootstrap, engine_without_relay, clock), Running(app):
        await wait_for(lambda: app.stats.canceled + app.stats.applied >= 1, timeout=30)
    assert app.view.verdict(schedule_id, message.schedule_version) is None  # the view never had the cancel
    assert calls == [] and app.stats.applied == 0
    assert app.stats.refused == 1
    assert await effects.fetchval("SELECT count(*) FROM effects") == 0
    assert await effects.fetchval("SELECT count(*) FROM chronoq_consumer_dedupe") == 0  # rolled back
    assert (await occurrence_row(pool, message.occurrence_id))["state"] == "CANCELED"
    assert await attempt_rows(pool, message.occurrence_id) == []


async def test_without_the_barrier_a_cancel_the_consumer_has_not_read_can_still_be_applied_once(
    engine_db, pool, clock, kafka_bootstrap, consumer_db, effects, target, acme
):
    """`attempt_barrier=False` falls back to the view-only guarantee: the window is the schedule-state
    topic's lag. The effect is applied once; the engine keeps the occurrence CANCELED and records no
    attempt (the consumer's `started` and `succeeded` for a CANCELED occurrence are fenced)."""
    control = ControlPlane(pool, clock)
    schedule_id, message = await published_occurrence(control, pool, clock, kafka_bootstrap, target)
    answer = await control.cancel_schedule("acme", schedule_id)
    assert answer["canceled_occurrences"] == 1
    app = recording_app(kafka_bootstrap, consumer_db, target, attempt_barrier=False)
    engine_without_relay = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER, Role.RELAY})
    async with services_running(engine_db, kafka_bootstrap, engine_without_relay, clock), Running(app):
        await wait_for(lambda: app.stats.applied >= 1, timeout=30)  # reported, too
        clock.advance(timedelta(seconds=1))
        reported_by = clock.now()
        # Every attempt event produced before `reported_by` is applied (the processor's progress).
        await wait_for(
            lambda: pool.fetchval("SELECT min(applied_through) >= $1 FROM attempt_event_progress", reported_by),
            timeout=30,
        )
    assert await effects.fetchval("SELECT count(*) FROM effects WHERE occurrence_id = $1", message.occurrence_id) == 1
    assert (await occurrence_row(pool, message.occurrence_id))["state"] == "CANCELED"
    assert await attempt_rows(pool, message.occurrence_id) == []


async def test_start_before_cancel_reports_still_running_and_signals_the_handler(
    engine_db, pool, clock, kafka_bootstrap, consumer_db, effects, target, acme
):
    """The engine applied `started` first: the cancel answers still_running: 1; the handler learns it
    from the view (occurrence.cancellation), gives up, and the occurrence is CANCELED without an effect."""
    control = ControlPlane(pool, clock)
    schedule_id, message = await published_occurrence(control, pool, clock, kafka_bootstrap, target)
    running = asyncio.Event()
    app = ConsumerApp(
        ConsumerConfig(
            f"cancel-{uuid.uuid4().hex[:8]}", kafka_bootstrap, consumer_db, session_timeout=2.0, heartbeat_interval=0.4
        )
    )

    @app.handler(target)
    async def cooperative(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        running.set()
        await asyncio.wait_for(occurrence.cancellation.wait(), 60)
        occurrence.cancellation.raise_if_canceled()
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)

    engine = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER})
    async with services_running(engine_db, kafka_bootstrap, engine, clock), Running(app):
        await wait_for(running.wait, timeout=30)
        await wait_for(
            lambda: pool.fetchval(
                "SELECT state = 'RUNNING' FROM occurrences WHERE occurrence_id = $1", message.occurrence_id
            ),
            timeout=30,
        )
        answer = await control.cancel_schedule("acme", schedule_id)
        assert (answer["canceled_occurrences"], answer["still_running"]) == (0, 1)
        await wait_for(
            lambda: pool.fetchval(
                "SELECT state = 'CANCELED' FROM occurrences WHERE occurrence_id = $1", message.occurrence_id
            ),
            timeout=30,
        )
    assert await effects.fetchval("SELECT count(*) FROM effects") == 0
    assert [(a["result"]) for a in await attempt_rows(pool, message.occurrence_id)] == ["canceled"]

"""The consumer dedupes by slot as well as by occurrence (consumer migration 0003), on real Kafka and PostgreSQL.

Two occurrence ids of one slot (schedule_id, scheduled_for) — versions 1 and 2 of the same instant —
reach an app: the engine never publishes both (engine migration 0014), but a delivery published before
that rule, or by a dispatch that broke it, must still not run the slot twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import asyncpg

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from schemas.identity import occurrence_id
from schemas.topics import occurrence_topic
from tests.support.kafka import attempt_events, occurrence_message, produce
from tests.support.waiting import wait_for


async def test_a_second_occurrence_of_an_applied_slot_is_a_duplicate(consumer_db, kafka_bootstrap, target, effects):
    first = occurrence_message(target)
    second = dataclasses.replace(
        first,
        occurrence_id=occurrence_id(first.schedule_id, 2, first.scheduled_for),
        schedule_version=2,
        payload={"amount": 8},
    )
    other_slot = dataclasses.replace(
        first,
        occurrence_id=occurrence_id(first.schedule_id, 2, first.available_at.replace(minute=1)),
        schedule_version=2,
        scheduled_for=first.scheduled_for.replace(minute=1),
    )
    await produce(kafka_bootstrap, occurrence_topic(target), [m.encode() for m in (first, second, other_slot)])
    app = ConsumerApp(
        ConsumerConfig(
            f"slot-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            attempt_barrier=False,  # no attempt processor runs here: nobody answers started
        )
    )

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await conn.execute(
            "INSERT INTO effects (occurrence_id, amount, scheduled_for) VALUES ($1, $2, $3)",
            occurrence.occurrence_id,
            occurrence.payload["amount"],
            occurrence.scheduled_for,
        )

    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        await wait_for(lambda: app.stats.applied + app.stats.duplicates == 3 or task.done())
    finally:
        stop.set()
        await task
    assert (app.stats.applied, app.stats.duplicates) == (2, 1)
    rows = await effects.fetch("SELECT occurrence_id, amount FROM effects ORDER BY scheduled_for")
    applied = [(r["occurrence_id"], r["amount"]) for r in rows]
    assert applied == [(first.occurrence_id, 7), (other_slot.occurrence_id, 7)]
    (duplicate,) = await attempt_events(kafka_bootstrap, second.occurrence_id, 1)
    assert duplicate.event == "already_applied"  # the engine settles version 2's occurrence: the slot ran

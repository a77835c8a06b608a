"""The consumer runtime against real Kafka and a real app database (no engine: messages are produced here)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import asyncpg
import pytest

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from consumers.dead_letters import HEADER_REASON
from schemas.identity import occurrence_id
from schemas.messages import OccurrenceMessage
from schemas.topics import DEAD_LETTER_TOPIC, occurrence_topic
from tests.support.kafka import (
    attempt_events,
    occurrence_message,
    produce,
    read_topic,
)
from tests.support.waiting import wait_for


def engineless_config(
    consumer_db: str, kafka_bootstrap: str, group: str | None = None, **config: Any
) -> ConsumerConfig:
    """A consumer app's configuration for tests without an engine (nobody answers ``started``), quick to retry
    in place and to notice a member gone."""
    return ConsumerConfig(
        group or f"group-{uuid.uuid4().hex[:8]}",
        kafka_bootstrap,
        consumer_db,
        attempt_barrier=False,  # no attempt processor runs here: nobody answers started
        redelivery_backoff=0.05,
        session_timeout=2.0,
        heartbeat_interval=0.4,
        **config,
    )


def effect_app(consumer_db, kafka_bootstrap, target, fail_times: int = 0, group: str | None = None, **config) -> Any:
    """A ConsumerApp whose handler records the effect; ``app.calls["n"]`` counts its calls."""
    app: Any = ConsumerApp(engineless_config(consumer_db, kafka_bootstrap, group, **config))
    calls = {"n": 0}

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        calls["n"] += 1
        await conn.execute(
            "INSERT INTO effects (occurrence_id, amount) VALUES ($1, $2)",
            occurrence.occurrence_id,
            occurrence.payload["amount"],
        )
        if calls["n"] <= fail_times:
            raise RuntimeError("downstream unavailable")

    app.calls = calls
    app.apply = apply
    return app


async def run_until(app: ConsumerApp, condition, timeout: float = 20.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        await wait_for(lambda: condition() or task.done(), timeout)
        if task.done():
            task.result()
    finally:
        stop.set()
        await task


async def test_the_same_message_delivered_twice_applies_the_effect_once(consumer_db, kafka_bootstrap, target, effects):
    sent = occurrence_message(target)
    value = sent.encode()
    await produce(kafka_bootstrap, occurrence_topic(target), [value, value])
    app = effect_app(consumer_db, kafka_bootstrap, target)

    await run_until(app, lambda: app.stats.applied + app.stats.duplicates == 2)

    assert (app.stats.applied, app.stats.duplicates) == (1, 1)
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1
    assert await effects.fetchval("SELECT count(*) FROM chronoq_consumer_dedupe") == 1
    # The engine hears of one attempt that succeeded, then of the duplicate, naming the attempt that applied it.
    started, succeeded, duplicate = await attempt_events(kafka_bootstrap, sent.occurrence_id, 3)
    assert [e.event for e in (started, succeeded, duplicate)] == ["started", "succeeded", "already_applied"]
    assert started.lease_token == succeeded.lease_token == duplicate.applied_by
    assert await effects.fetchval("SELECT lease_token FROM chronoq_consumer_dedupe") == started.lease_token


async def test_a_failed_handler_leaves_no_effect_and_the_occurrence_comes_again(
    consumer_db, kafka_bootstrap, target, effects
):
    """The runtime reports the failure; the engine's retry (attempt 2, same occurrence) is applied once."""
    first = occurrence_message(target)
    await produce(kafka_bootstrap, occurrence_topic(target), [first.encode()])
    app = effect_app(consumer_db, kafka_bootstrap, target, fail_times=1)
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        await wait_for(lambda: app.stats.failures == 1)
        assert await effects.fetchval("SELECT count(*) FROM effects") == 0  # rolled back: no effect
        assert await effects.fetchval("SELECT count(*) FROM chronoq_consumer_dedupe") == 0  # and no dedupe row
        started, failed = await attempt_events(kafka_bootstrap, first.occurrence_id, 2)
        assert (failed.event, failed.lease_token, failed.error_class, failed.permanent) == (
            "failed",
            started.lease_token,
            "RuntimeError",
            False,
        )
        assert app.calls["n"] == 1  # no retry in place: retries are the engine's

        retry = OccurrenceMessage(**{**first.__dict__, "attempt": 2})
        await produce(kafka_bootstrap, occurrence_topic(target), [retry.encode()])
        await wait_for(lambda: app.stats.applied == 1)
    finally:
        stop.set()
        await task
    assert app.calls["n"] == 2 and app.stats.failures == 1
    assert await effects.fetch("SELECT occurrence_id, amount FROM effects") == [(first.occurrence_id, 7)]
    assert await effects.fetchval("SELECT count(*) FROM chronoq_consumer_dedupe") == 1
    events = await attempt_events(kafka_bootstrap, first.occurrence_id, 4)
    assert [(e.event, e.attempt) for e in events] == [("started", 1), ("failed", 1), ("started", 2), ("succeeded", 2)]
    assert events[0].lease_token != events[2].lease_token  # every attempt has its own token


async def test_a_restarted_group_member_resumes_after_the_committed_offset(
    consumer_db, kafka_bootstrap, target, effects
):
    first, second = occurrence_message(target), occurrence_message(target)
    await produce(kafka_bootstrap, occurrence_topic(target), [first.encode()])
    app = effect_app(consumer_db, kafka_bootstrap, target)
    await run_until(app, lambda: app.stats.applied == 1)

    await produce(kafka_bootstrap, occurrence_topic(target), [second.encode()])
    again = ConsumerApp(app.config)
    again.handler(target)(app.apply)
    await run_until(again, lambda: again.stats.applied == 1)

    assert (again.stats.applied, again.stats.duplicates) == (1, 0)
    assert {r[0] for r in await effects.fetch("SELECT occurrence_id FROM effects")} == {
        first.occurrence_id,
        second.occurrence_id,
    }


async def test_poison_messages_go_to_the_dead_letter_topic_and_do_not_block(
    consumer_db, kafka_bootstrap, target, effects
):
    good = occurrence_message(target)
    await produce(kafka_bootstrap, occurrence_topic(target), [b"\x00garbage", good.encode()])
    app = effect_app(consumer_db, kafka_bootstrap, target)

    await run_until(app, lambda: app.stats.applied == 1)

    assert app.stats.dead_lettered == 1
    dead = [
        r
        for r in await read_topic(kafka_bootstrap, DEAD_LETTER_TOPIC, expected=1, settle=0.2)
        if r.value == b"\x00garbage"
    ]
    assert len(dead) == 1
    assert b"not JSON" in dict(dead[0].headers)[HEADER_REASON]
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1


async def test_concurrent_twins_of_one_occurrence_apply_once(consumer_db, kafka_bootstrap, target, effects):
    """Thirty-two deliveries of one occurrence racing: the unique dedupe key lets exactly one through."""
    app = effect_app(consumer_db, kafka_bootstrap, target)
    await app.start()
    try:
        record = type(
            "Record",
            (),
            {
                "value": occurrence_message(target).encode(),
                "headers": [],
                "topic": "t",
                "partition": 0,
                "offset": 0,
                "timestamp": 0,
                "key": b"acme",
            },
        )()
        outcomes = await asyncio.gather(*(app.handle_record(record) for _ in range(32)))
    finally:
        await app.stop()
    values = sorted(o.value for o in outcomes)
    assert values.count("applied") == 1 and values.count("duplicate") == 31
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1


def _record(message: OccurrenceMessage, offset: int = 0) -> Any:
    return type(
        "Record",
        (),
        {"value": message.encode(), "headers": [], "topic": "t", "partition": 0, "offset": offset, "timestamp": 0,
         "key": str(message.schedule_id).encode()},
    )()  # fmt: skip


@pytest.mark.parametrize("batch", [None, 10], ids=["single", "batch"])
async def test_a_manual_run_at_a_slot_instant_is_not_taken_for_the_slot(
    consumer_db, kafka_bootstrap, target, effects, batch
):
    """One effect per slot holds for the schedule's own occurrences of an instant (any version), but a manual
    trigger that happens to fall on a slot instant is a run of its own (the engine keeps it outside the slot's
    uniqueness too): the consumer recognises a slot occurrence by its id, which is the slot's."""
    app: Any = ConsumerApp(engineless_config(consumer_db, kafka_bootstrap))
    applied: list[uuid.UUID] = []

    async def record_effect(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        applied.append(occurrence.occurrence_id)
        await conn.execute("INSERT INTO effects (occurrence_id, amount) VALUES ($1, 1)", occurrence.occurrence_id)

    if batch is None:
        app.handler(target)(record_effect)
    else:

        @app.handler(target, batch=batch)
        async def apply_all(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
            for occurrence in occurrences:
                await record_effect(occurrence, conn)

    slot = occurrence_message(target)
    of_version_two = dataclasses.replace(
        slot, schedule_version=2, occurrence_id=occurrence_id(slot.schedule_id, 2, slot.scheduled_for)
    )
    manual = dataclasses.replace(slot, occurrence_id=uuid.uuid4())
    await app.start()
    try:
        for offset, message in enumerate((slot, manual, of_version_two)):
            if batch is None:
                await app.handle_record(_record(message, offset))
            else:
                await app.handle_batch([_record(message, offset)])
    finally:
        await app.stop()
    assert applied == [slot.occurrence_id, manual.occurrence_id]  # version 2 of the applied slot: skipped
    assert await effects.fetchval("SELECT count(*) FROM effects") == 2

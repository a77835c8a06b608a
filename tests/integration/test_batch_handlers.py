"""Batch handlers against real Kafka, a real app database and (where it matters) the engine.

A batch handler gets only occurrences not applied before, each once, in one transaction with their
dedupe rows; a failed batch leaves nothing and its occurrences run again one by one, or as
``FailedOccurrences`` says; its attempts reach the engine as one message per occurrence.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from consumers import ConsumerApp, FailedOccurrences, Occurrence, PermanentError
from schemas import observability as obs
from schemas.topics import occurrence_topic
from tests.integration.test_consumer import engineless_config
from tests.support.kafka import attempt_events, occurrence_message, produce
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row
from tests.support.services import Running
from tests.support.waiting import wait_for


def batch_app(consumer_db: str, kafka_bootstrap: str, group: str | None = None, **instruments) -> ConsumerApp:
    return ConsumerApp(
        engineless_config(consumer_db, kafka_bootstrap, group or f"batch-{uuid.uuid4().hex[:8]}", shutdown_grace=2.0),
        **instruments,
    )


def apply_into(app: ConsumerApp, target: str, calls: list[list], fail=None):
    """Register a batch handler that records each call and writes one effect per occurrence it gets."""

    @app.handler(target, batch=10)
    async def apply(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
        calls.append([o.occurrence_id for o in occurrences])
        await conn.executemany(
            "INSERT INTO effects (occurrence_id, attempt, lease_token) VALUES ($1, $2, $3)",
            [(o.occurrence_id, o.attempt, o.lease_token) for o in occurrences],
        )
        if fail is not None:
            fail(occurrences)

    return apply


async def published(pool, ids) -> bool:
    unsent = "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND occurrence_id = ANY($1)"
    return await pool.fetchval(unsent, list(ids)) == 0


async def states(pool, ids) -> dict:
    rows = await pool.fetch("SELECT occurrence_id, state FROM occurrences WHERE occurrence_id = ANY($1)", list(ids))
    return {r["occurrence_id"]: r["state"] for r in rows}


async def test_a_batch_handler_gets_only_the_occurrences_not_applied_before_each_once(
    consumer_db, kafka_bootstrap, target, effects, telemetry
):
    messages = [occurrence_message(target) for _ in range(6)]
    topic = occurrence_topic(target)
    group = f"batch-{uuid.uuid4().hex[:8]}"
    first_calls: list[list] = []
    first = batch_app(consumer_db, kafka_bootstrap, group)
    apply_into(first, target, first_calls)
    await produce(kafka_bootstrap, topic, [m.encode() for m in messages[:2]])
    async with Running(first):
        await wait_for(lambda: first.stats.applied == 2)

    # Redeliveries of the two applied, the four new ones, and a second copy of one of them.
    await produce(kafka_bootstrap, topic, [m.encode() for m in messages[:2] + messages[2:] + messages[2:3]])
    calls: list[list] = []
    second = batch_app(consumer_db, kafka_bootstrap, group, **telemetry.instruments("consumer"))
    apply_into(second, target, calls)
    # A new group member starts from the committed offset: the first two were committed, so rewind by
    # producing them again (above). The redelivered copies must be recognised, not applied again.
    async with Running(second):
        await wait_for(lambda: second.stats.applied + second.stats.duplicates >= 5)

    handled = [ident for call in calls for ident in call]
    assert sorted(handled) == sorted(m.occurrence_id for m in messages[2:])  # the new ones, each once
    rows = await effects.fetch("SELECT occurrence_id, lease_token FROM effects")
    assert sorted(r["occurrence_id"] for r in rows) == sorted(m.occurrence_id for m in messages)
    dedupe = await effects.fetch("SELECT occurrence_id, lease_token FROM chronoq_consumer_dedupe")
    assert {(r["occurrence_id"], r["lease_token"]) for r in dedupe} == {(r[0], r[1]) for r in rows}
    assert second.stats.duplicates == 3  # two redelivered, one copy inside the batch
    assert sum(p.value for p in telemetry.points(obs.DUPLICATE_DELIVERIES)) == 3
    sizes = telemetry.points(obs.CONSUMER_BATCH_SIZE)
    assert sum(p.sum for p in sizes) == 7  # every delivery went through a batch, copies included
    (applied_before,) = [
        e for e in await attempt_events(kafka_bootstrap, messages[0].occurrence_id, 3) if e.event == "already_applied"
    ]
    assert applied_before.applied_by == next(
        r["lease_token"] for r in rows if r["occurrence_id"] == messages[0].occurrence_id
    )
    started = [e for e in await attempt_events(kafka_bootstrap, messages[2].occurrence_id, 2) if e.event == "started"]
    assert len(started) == 1  # the copy in the same batch did not start a second attempt


async def test_a_failed_batch_leaves_nothing_and_its_occurrences_run_again_one_by_one(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target
):
    good = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(3)]
    poison = await due_occurrence(pool, "acme", target, clock.now())
    ids = {o.occurrence_id for o in good} | {poison.occurrence_id}
    await wait_for(lambda: published(pool, ids))  # all in the topic: the first fetch takes them together

    def reject_poison(occurrences: list[Occurrence]) -> None:
        if any(o.occurrence_id == poison.occurrence_id for o in occurrences):
            raise PermanentError("no such customer")

    calls: list[list] = []
    app = batch_app(consumer_db, kafka_bootstrap)
    apply_into(app, target, calls, reject_poison)
    async with Running(app):
        await wait_for(lambda: _settled(pool, ids))

    assert sorted(calls[0]) == sorted(ids)  # one batch first; it failed and rolled back
    assert sorted(c for call in calls[1:] for c in call) == sorted(ids) and all(len(c) == 1 for c in calls[1:])
    assert await states(pool, ids) == {**{o.occurrence_id: "SUCCEEDED" for o in good}, poison.occurrence_id: "DEAD"}
    assert (await occurrence_row(pool, poison.occurrence_id))["dead_reason"] == "permanent_error"
    assert sorted(await effects.fetch("SELECT occurrence_id FROM effects")) == sorted(
        [(o.occurrence_id,) for o in good]
    )  # the failed batch's effects rolled back; each good one applied once
    # The rerun took the same delivery over (no attempt consumed by the batch that failed).
    attempts = await attempt_rows(pool, good[0].occurrence_id)
    assert [(a["attempt_number"], a["result"]) for a in attempts] == [(1, "fenced"), (1, "succeeded")]
    assert app.stats.batch_failures == 1


async def test_failed_occurrences_named_by_the_handler_fail_alone_and_the_rest_runs_again_as_a_batch(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target
):
    good = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(3)]
    poison = await due_occurrence(pool, "acme", target, clock.now())
    ids = {o.occurrence_id for o in good} | {poison.occurrence_id}
    await wait_for(lambda: published(pool, ids))

    def name_the_poison(occurrences: list[Occurrence]) -> None:
        if any(o.occurrence_id == poison.occurrence_id for o in occurrences):
            raise FailedOccurrences({poison.occurrence_id: PermanentError("no such customer")})

    calls: list[list] = []
    app = batch_app(consumer_db, kafka_bootstrap)
    apply_into(app, target, calls, name_the_poison)
    async with Running(app):
        await wait_for(lambda: _settled(pool, ids))

    assert [sorted(c) for c in calls] == [sorted(ids), sorted(o.occurrence_id for o in good)]
    assert await states(pool, ids) == {**{o.occurrence_id: "SUCCEEDED" for o in good}, poison.occurrence_id: "DEAD"}
    assert sorted(await effects.fetch("SELECT occurrence_id FROM effects")) == sorted(
        [(o.occurrence_id,) for o in good]
    )
    (dead_attempt,) = await attempt_rows(pool, poison.occurrence_id)
    assert (dead_attempt["result"], dead_attempt["error_class"], dead_attempt["permanent"]) == (
        "failed",
        "PermanentError",
        True,
    )


async def test_a_batch_of_one_fails_as_a_single_handler_does_and_the_engine_retries_it(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target
):
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=3, base=1.0, cap=1.0)
    calls: list[list] = []

    def fail_first_call(occurrences: list[Occurrence]) -> None:
        if len(calls) == 1:
            raise ConnectionRefusedError("downstream unavailable")

    app = batch_app(consumer_db, kafka_bootstrap)
    apply_into(app, target, calls, fail_first_call)
    async with Running(app):
        await wait_for(lambda: _state_is(pool, sent.occurrence_id, "RETRY_WAIT"))
        clock.advance(1)  # past the backoff: the relay publishes attempt 2
        await wait_for(lambda: _state_is(pool, sent.occurrence_id, "SUCCEEDED"))
    attempts = await attempt_rows(pool, sent.occurrence_id)
    assert [(a["attempt_number"], a["result"], a["error_class"]) for a in attempts] == [
        (1, "failed", "ConnectionRefusedError"),
        (2, "succeeded", None),
    ]
    assert await effects.fetch("SELECT occurrence_id, attempt FROM effects") == [(sent.occurrence_id, 2)]


async def _settled(pool, ids) -> bool:
    return all(s in ("SUCCEEDED", "DEAD") for s in (await states(pool, ids)).values())


async def _state_is(pool, ident, expected: str) -> bool:
    return (await occurrence_row(pool, ident))["state"] == expected


@pytest.mark.parametrize("grouped", [True, False], ids=["groups", "records"])
async def test_batched_and_single_reports_of_one_occurrence_land_on_one_partition(kafka_bootstrap, grouped):
    """The engine's fencing needs every event of an occurrence in produce order, on one partition: the batch
    path must pick each event's partition exactly as the keyed single send does, and a group record may hold
    only events whose own key hashes to the group's partition."""
    from aiokafka import AIOKafkaProducer

    from consumers.attempt_reports import AttemptReporter
    from schemas.attempt_events import AttemptEvent, decode_attempt_record
    from schemas.key_partitioning import key_partition
    from schemas.topics import ATTEMPTS_TOPIC, create_missing_topics
    from tests.support.kafka import decodable, read_to_end

    await create_missing_topics(kafka_bootstrap, [ATTEMPTS_TOPIC])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        reporter = AttemptReporter(producer, timeout=10.0, grouped=grouped)
        partitions = sorted(await producer.partitions_for(ATTEMPTS_TOPIC))
        occurrences = [uuid.uuid4() for _ in range(40)]
        tokens = {o: uuid.uuid4() for o in occurrences}
        await reporter.send_many([AttemptEvent.started(o, 1, tokens[o], 30.0) for o in occurrences], "t")
        for o in occurrences:
            await reporter.send(AttemptEvent.heartbeat(o, 1, tokens[o], 30.0), "t")
        await reporter.send_many([AttemptEvent.succeeded(o, 1, tokens[o]) for o in occurrences], "t")
    finally:
        await producer.stop()
    # To the end offsets: in the suite the topic holds every other test's events too.
    records = sorted(await read_to_end(kafka_bootstrap, ATTEMPTS_TOPIC), key=lambda r: (r.partition, r.offset))
    ours = [
        (record.partition, event, decoded.grouped)
        for record in records
        for decoded in decodable([record], decode_attempt_record)
        for event in decoded.events
        if event.occurrence_id in tokens
    ]
    assert len(ours) == 3 * len(occurrences)
    assert all(key_partition(event.key, partitions) == partition for partition, event, _ in ours)
    for o in occurrences:  # in produce order on its partition
        assert [e.event for _, e, _ in ours if e.occurrence_id == o] == ["started", "heartbeat", "succeeded"]
    assert len({partition for partition, _, _ in ours}) > 1  # spread over partitions, not all on one
    batched = [was_grouped for _, event, was_grouped in ours if event.event != "heartbeat"]
    assert all(batched) if grouped else not any(batched)


async def test_failed_occurrences_naming_none_of_the_batch_reruns_it_one_by_one_and_alone_the_named_error_counts(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target
):
    good = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(2)]
    poison = await due_occurrence(pool, "acme", target, clock.now())
    ids = {o.occurrence_id for o in good} | {poison.occurrence_id}
    await wait_for(lambda: published(pool, ids))
    calls: list[list] = []

    def confused_then_precise(occurrences: list[Occurrence]) -> None:
        if len(calls) == 1:  # names an occurrence the batch does not hold: says nothing about this batch
            raise FailedOccurrences({uuid.uuid4(): PermanentError("not this one")})
        if any(o.occurrence_id == poison.occurrence_id for o in occurrences):
            raise FailedOccurrences({poison.occurrence_id: PermanentError("no such customer")})

    app = batch_app(consumer_db, kafka_bootstrap)
    apply_into(app, target, calls, confused_then_precise)
    async with Running(app):
        await wait_for(lambda: _settled(pool, ids))

    assert len(calls[0]) == 3 and all(len(c) == 1 for c in calls[1:])  # the batch, then one by one
    assert await states(pool, ids) == {**{o.occurrence_id: "SUCCEEDED" for o in good}, poison.occurrence_id: "DEAD"}
    (dead_attempt,) = [a for a in await attempt_rows(pool, poison.occurrence_id) if a["result"] == "failed"]
    assert (dead_attempt["error_class"], dead_attempt["permanent"]) == ("PermanentError", True)

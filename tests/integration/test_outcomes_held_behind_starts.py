"""Outcomes held behind a stream of starts (engine.rules.outcome_hold), against real Kafka and PostgreSQL.

* while starts stream in, outcomes read with them are held: not applied, the partition's offset not committed
  past them, and the partition not counted as read to its end (the reaper waits for them);
* a processor that dies holding them loses nothing: the next one reads them again from the committed offset;
* once starts stop streaming, the same processor applies them and commits past them.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from engine.loops.attempt_processor import AttemptProcessor, AttemptProcessorConfig
from engine.loops.reaper import Reaper
from engine.rules.outcome_hold import HoldLimits
from schemas.attempt_events import AttemptEvent as Ev
from schemas.topics import ATTEMPTS_TOPIC
from tests.support.kafka import produce
from tests.support.rows import due_occurrence
from tests.support.waiting import wait_for

TTL = 3.0
PARTITION = TopicPartition(ATTEMPTS_TOPIC, 0)  # every event of these tests goes there


class Monotonic:
    """The processor's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountsRounds(AttemptProcessor):
    """The processor, counting its rounds (polls followed by commits and progress) so the test can wait for some."""

    rounds = 0

    async def after_poll(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, int]:
        offsets = await super().after_poll(consumer)
        self.rounds += 1
        return offsets

    async def more_rounds(self, n: int) -> None:
        until = self.rounds + n
        await wait_for(lambda: self.rounds >= until, timeout=30)


class FirstReleaseFails(CountsRounds):
    """The first release round's transaction fails (the database went away mid-round): the held events must
    still be held afterwards, and applied by a later round."""

    failed = False

    async def _apply_in_lanes(self, lanes):
        held_outcomes = all(item.event.event != "started" for lane in lanes for txn in lane for item in txn)
        if held_outcomes and not self.failed and self.monotonic() > 1050:
            self.failed = True
            raise ConnectionResetError("the database went away during a release round")
        return await super()._apply_in_lanes(lanes)


def config(group: str, starts: int = 1) -> AttemptProcessorConfig:
    return AttemptProcessorConfig(
        group=group,
        session_timeout=2.0,
        heartbeat_interval=0.4,
        error_backoff=0.05,
        outcome_hold=HoldLimits(starts=starts, window=60.0, max_age=600.0),
    )


async def states(pool: asyncpg.Pool, ids: list[uuid.UUID]) -> list[str]:
    rows = await pool.fetch("SELECT occurrence_id, state FROM occurrences WHERE occurrence_id = ANY($1)", ids)
    by_id = {row["occurrence_id"]: row["state"] for row in rows}
    return [by_id[i] for i in ids]


async def committed(bootstrap: str, group: str) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(PARTITION)
    finally:
        await consumer.stop()


async def send(bootstrap: str, events: list[Ev]) -> list[int]:
    """Produce the events in order to partition 0 (other tests' events may be there too); their offsets."""
    return await produce(bootstrap, ATTEMPTS_TOPIC, [e.encode() for e in events], partition=0)


def held_ids(processor: AttemptProcessor) -> set[uuid.UUID]:
    return {item.event.occurrence_id for item in processor.hold.items()}


async def started_burst(pool, clock, target, bootstrap, group, monotonic, kind=CountsRounds):
    """Six occurrences started through a running processor (a stream of starts: one start makes it here);
    returns the processor, its task and stop event, and the occurrences with their lease tokens."""
    ids = [(await due_occurrence(pool, "acme", target, clock.now())).occurrence_id for _ in range(6)]
    tokens = {i: uuid.uuid4() for i in ids}
    processor = kind(pool, bootstrap, config(group), clock=clock, monotonic=monotonic)
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    await send(bootstrap, [Ev.started(i, 1, t, TTL, "billing") for i, t in tokens.items()])
    await wait_for(lambda: _all(pool, ids, "RUNNING"), timeout=30)
    return processor, task, stop, ids, tokens


async def _all(pool: asyncpg.Pool, ids: list[uuid.UUID], state: str) -> bool:
    return await states(pool, ids) == [state] * len(ids)


async def test_outcomes_wait_behind_a_stream_of_starts_and_survive_the_processor_dying_with_them(
    pool, clock, target, kafka_bootstrap
):
    group = f"hold-{uuid.uuid4().hex[:8]}"
    monotonic = Monotonic()
    processor, task, stop, ids, tokens = await started_burst(pool, clock, target, kafka_bootstrap, group, monotonic)
    offsets = await send(kafka_bootstrap, [Ev.succeeded(i, 1, tokens[i]) for i in ids[:3]])
    await wait_for(lambda: held_ids(processor) >= set(ids[:3]), timeout=30)
    await processor.more_rounds(3)  # what these rounds commit and record must not pass the held events
    assert await states(pool, ids) == ["RUNNING"] * 6
    held_from = processor.hold.held_from(0)
    assert held_from is not None and held_from <= offsets[0]
    assert (await committed(kafka_bootstrap, group) or 0) <= held_from  # never past a held outcome

    # The leases end meanwhile: the reaper judges them only up to what the processor applied, and the
    # partition holding unapplied outcomes was not read to its end since they came.
    clock.advance(timedelta(seconds=TTL * 3))
    await processor.more_rounds(3)
    assert await Reaper(pool, clock=clock).run_once() == 0

    task.cancel()  # the processor dies holding them
    await asyncio.gather(task, return_exceptions=True)
    assert (await committed(kafka_bootstrap, group) or 0) <= offsets[0]
    successor = AttemptProcessor(pool, kafka_bootstrap, config(group, starts=0), clock=clock)
    stop = asyncio.Event()
    task = asyncio.create_task(successor.run(stop))
    try:
        await wait_for(lambda: _states_are(pool, ids, ["SUCCEEDED"] * 3 + ["RUNNING"] * 3), timeout=30)
        await wait_for(lambda: _committed_past(kafka_bootstrap, group, offsets[-1]), timeout=30)
    finally:
        stop.set()
        await task


@pytest.mark.parametrize("kind", [CountsRounds, FirstReleaseFails], ids=["released", "first-release-fails"])
async def test_held_outcomes_are_applied_once_starts_stop_streaming(pool, clock, target, kafka_bootstrap, kind):
    group = f"hold-{uuid.uuid4().hex[:8]}"
    monotonic = Monotonic()
    processor, task, stop, ids, tokens = await started_burst(
        pool, clock, target, kafka_bootstrap, group, monotonic, kind
    )
    try:
        offsets = await send(kafka_bootstrap, [Ev.succeeded(i, 1, tokens[i]) for i in ids])
        await wait_for(lambda: held_ids(processor) >= set(ids), timeout=30)
        assert await states(pool, ids) == ["RUNNING"] * 6
        monotonic.now += 61.0  # no start for longer than the window: the stream is over
        await wait_for(lambda: _all(pool, ids, "SUCCEEDED"), timeout=30)
        assert not held_ids(processor) & set(ids)
        assert kind is CountsRounds or processor.failed
        await wait_for(lambda: _committed_past(kafka_bootstrap, group, offsets[-1]), timeout=30)
    finally:
        stop.set()
        await task


async def _states_are(pool: asyncpg.Pool, ids: list[uuid.UUID], expected: list[str]) -> bool:
    return await states(pool, ids) == expected


async def _committed_past(bootstrap: str, group: str, offset: int) -> bool:
    return (await committed(bootstrap, group) or 0) > offset

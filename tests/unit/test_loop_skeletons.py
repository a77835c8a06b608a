"""The loop skeletons without I/O: pacing, errors and summaries of PeriodicLoop, unit handling of the
Kafka skeleton, and which roles a process runs."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Literal

import asyncpg
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError

from engine.loops.kafka_processor import KafkaLoopSettings, KafkaProcessorLoop
from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import LoopSummary, summary_line
from engine.loops.service import ALL_ROLES, ENGINE_ROLES, PIPELINE_ROLES, Role, ServiceConfig

TIMING = LoopTiming(idle_interval=0.25, error_backoff=2.0, summary_every=30.0)


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scripted(*results):
    """A pass that returns (or raises) the given results in order."""
    queue = list(results)

    async def run_pass() -> PassOutcome:
        result = queue.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result

    return run_pass


@pytest.mark.parametrize(
    "result, wait",
    [
        (PassOutcome({"published": 5}), 0.25),  # less than a full batch: idle
        (PassOutcome({"published": 5000}, more=True), 0.0),  # a full batch: at once
        (PassOutcome({"failed": 3}, retry_later=True), 2.0),  # work left for later: back off
        (asyncpg.exceptions.ConnectionDoesNotExistError("gone"), 2.0),  # transient: back off, keep going
        (KeyError("a bug"), 2.0),  # a bug: back off, keep going
    ],
)
async def test_a_pass_decides_the_wait_and_no_error_ends_the_loop(result, wait) -> None:
    loop = PeriodicLoop("relay", scripted(result), TIMING, logging.getLogger("test.loop"), monotonic=FakeTime())
    assert await loop.step() == wait


async def test_transient_failures_are_warnings_and_others_errors_with_traceback(caplog) -> None:
    loop = PeriodicLoop(
        "reaper",
        scripted(asyncpg.exceptions.AdminShutdownError("terminating"), ValueError("bug")),
        TIMING,
        logging.getLogger("test.loop"),
        monotonic=FakeTime(),
    )
    with caplog.at_level(logging.INFO, logger="test.loop"):
        await loop.step()
        await loop.step()
    transient, bug = caplog.records
    assert (transient.levelno, transient.action, transient.transient, transient.exc_info) == (
        logging.WARNING,
        "reaper.error",
        True,
        None,
    )
    assert (bug.levelno, bug.transient) == (logging.ERROR, False) and bug.exc_info is not None


async def test_the_summary_line_counts_passes_since_the_last_line_with_gauges_and_errors(caplog) -> None:
    clock = FakeTime()

    async def gauges() -> dict[str, int]:
        return {"backlog": 12}

    loop = PeriodicLoop(
        "relay",
        scripted(
            PassOutcome({"published": 3, "failed": 0}),
            OSError("refused"),
            PassOutcome({"published": 4, "failed": 1}, retry_later=True),
            PassOutcome({"published": 1, "failed": 0}),
        ),
        TIMING,
        logging.getLogger("test.loop"),
        gauges=gauges,
        monotonic=clock,
    )
    with caplog.at_level(logging.INFO, logger="test.loop"):
        for _ in range(3):
            await loop.step()
            assert await loop.summary.maybe_log() is None  # not due yet
        clock.now += 30
        assert await loop.summary.maybe_log() == "relay: passes=3 published=7 failed=1 backlog=12 errors=1"
        await loop.step()
        clock.now += 30
        assert await loop.summary.maybe_log() == "relay: passes=1 published=1 failed=0 backlog=12 errors=0"
    assert [r.action for r in caplog.records if r.levelno == logging.INFO] == ["relay.summary", "relay.summary"]


async def test_a_summary_survives_an_unreadable_gauge_and_can_be_switched_off() -> None:
    clock = FakeTime()

    async def broken() -> dict[str, int]:
        raise OSError("database away")

    summary = LoopSummary("materializer", logging.getLogger("test.loop"), 30.0, broken, clock)
    summary.add({"passes": 2})
    clock.now += 31
    assert await summary.maybe_log() == "materializer: passes=2 errors=0"
    silent = LoopSummary("materializer", logging.getLogger("test.loop"), 0, None, clock)
    clock.now += 1000
    assert await silent.maybe_log() is None


def test_summary_lines_put_passes_or_records_first_and_errors_last() -> None:
    assert (
        summary_line("attempts", {"accepted": 2, "errors": 1, "records": 3})
        == "attempts: records=3 accepted=2 errors=1"
    )


async def test_the_loop_stops_when_stop_is_set_even_while_waiting() -> None:
    stop = asyncio.Event()
    passes = 0

    async def run_pass() -> PassOutcome:
        nonlocal passes
        passes += 1
        stop.set()
        return PassOutcome()

    loop = PeriodicLoop("gate", run_pass, LoopTiming(idle_interval=3600), logging.getLogger("test.loop"))
    await asyncio.wait_for(loop.run(stop), timeout=5)
    assert passes == 1


@dataclass
class FakeConsumer:
    seeks: list[tuple[TopicPartition, int]] = field(default_factory=list)
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)
    refuse_commit: bool = False

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.refuse_commit:
            raise CommitFailedError("rebalanced")
        self.commits.append(offsets)


@dataclass
class Record:
    offset: int
    value: bytes = b""
    partition: int = 0


TP = TopicPartition("chronoq.commands", 0)
GONE = asyncpg.exceptions.ConnectionDoesNotExistError("gone")
SETTINGS = KafkaLoopSettings("group", "chronoq.commands", ("chronoq.commands",), 10.0, 3.0, error_backoff=0.0)


def kafka_loop(
    handled: list[int],
    fail_at: int | None,
    unit: Literal["batch", "record"],
    error: Exception = GONE,
) -> KafkaProcessorLoop:
    async def handle(records) -> dict[str, int]:
        if fail_at is not None and any(r.offset == fail_at for r in records):
            raise error
        handled.extend(r.offset for r in records)
        return {"applied": len(records)}

    return KafkaProcessorLoop(
        "commands", "unused:9092", SETTINGS, handle, logging.getLogger("test.loop"), unit=unit, monotonic=FakeTime()
    )


async def test_record_units_commit_past_what_was_handled_and_rewind_to_the_failed_record() -> None:
    handled: list[int] = []
    consumer = FakeConsumer()
    loop = kafka_loop(handled, fail_at=12, unit="record")
    await loop.process(consumer, TP, [Record(10), Record(11), Record(12), Record(13)], asyncio.Event())
    assert handled == [10, 11]
    assert consumer.seeks == [(TP, 12)] and consumer.commits == [{TP: 12}]
    assert loop.summary.counts == {"records": 2, "applied": 2, "errors": 1}


async def test_a_failed_batch_unit_is_read_again_from_its_first_record_and_commits_nothing() -> None:
    handled: list[int] = []
    consumer = FakeConsumer()
    await kafka_loop(handled, fail_at=12, unit="batch").process(
        consumer, TP, [Record(10), Record(11), Record(12)], asyncio.Event()
    )
    assert handled == [] and consumer.seeks == [(TP, 10)] and consumer.commits == []


POISON = asyncpg.exceptions.CharacterNotInRepertoireError("invalid byte sequence for encoding UTF8: 0x00")


@pytest.mark.parametrize("unit", ["record", "batch"])
async def test_a_record_failing_for_itself_is_skipped_not_retried_forever(unit, caplog) -> None:
    """Issue 10: a non-transient error (the record's content, SQLSTATE 22021) stalled the partition for
    every tenant on it; now the one record is skipped and logged, the others are applied."""
    handled: list[int] = []
    consumer = FakeConsumer()
    loop = kafka_loop(handled, fail_at=11, unit=unit, error=POISON)
    with caplog.at_level(logging.ERROR):
        await loop.process(consumer, TP, [Record(10), Record(11), Record(12)], asyncio.Event())
    assert handled == [10, 12] and consumer.seeks == [] and consumer.commits == [{TP: 13}]
    assert loop.summary.counts["skipped"] == 1
    assert [r.action for r in caplog.records if hasattr(r, "action")] == ["commands.record_skipped"]


async def test_a_refused_commit_is_logged_and_processing_goes_on() -> None:
    handled: list[int] = []
    consumer = FakeConsumer(refuse_commit=True)
    await kafka_loop(handled, None, "batch").process(consumer, TP, [Record(1), Record(2)], asyncio.Event())
    assert handled == [1, 2] and consumer.seeks == []


def test_roles_say_what_each_process_runs() -> None:
    assert Role.RELAY not in ENGINE_ROLES and Role.API not in ENGINE_ROLES
    assert ALL_ROLES == ENGINE_ROLES | {Role.RELAY, Role.API}
    assert {Role.COMMANDS, Role.API}.isdisjoint(PIPELINE_ROLES)
    ServiceConfig(roles=frozenset({Role.API}), api_socket=object()).validate(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attempts, commands, relay need a Kafka bootstrap"):
        ServiceConfig(roles=frozenset({Role.RELAY, Role.ATTEMPTS, Role.COMMANDS})).validate(None)
    with pytest.raises(ValueError, match="api role and api_socket"):
        ServiceConfig(roles=frozenset({Role.API})).validate(None)
    with pytest.raises(ValueError, match="at least one role"):
        ServiceConfig(roles=frozenset()).validate("k:9092")


async def test_partitions_of_one_poll_run_at_once_and_a_failing_one_rewinds_only_itself() -> None:
    running, most = 0, 0
    handled: list[int] = []

    async def handle(records) -> dict[str, int]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0)  # let the other partitions start
        running -= 1
        if any(r.offset == 21 for r in records):
            raise asyncpg.exceptions.ConnectionDoesNotExistError("gone")
        handled.extend(r.offset for r in records)
        return {"applied": len(records)}

    settings = dataclasses.replace(SETTINGS, parallel_partitions=2)
    loop = KafkaProcessorLoop("attempts", "unused:9092", settings, handle, logging.getLogger("test.loop"))
    consumer = FakeConsumer()
    tps = [TopicPartition("chronoq.attempts", n) for n in range(3)]
    fetched = {tp: [Record(n * 10), Record(n * 10 + 1)] for n, tp in enumerate(tps)}
    await loop._process_all(consumer, fetched, asyncio.Event())
    assert most == 2  # two at once, never more
    assert sorted(handled) == [0, 1, 10, 11]
    assert consumer.seeks == [(tps[2], 20)]  # only the failed partition is read again
    assert sorted((tp.partition, o) for c in consumer.commits for tp, o in c.items()) == [(0, 2), (1, 12)]


def merging_loop(
    calls: list[list[tuple[int, int]]],
    merge_records: int,
    fail_at: int | None = None,
    error: Exception = GONE,
    unit: Literal["batch", "record"] = "batch",
) -> KafkaProcessorLoop:
    """A loop over chronoq.attempts that records each handle call as (partition, offset) pairs."""

    async def handle(records) -> dict[str, int]:
        if fail_at is not None and any(r.offset == fail_at for r in records):
            raise error
        calls.append([(r.partition, r.offset) for r in records])
        return {"applied": len(records)}

    settings = dataclasses.replace(SETTINGS, merge_records=merge_records)
    return KafkaProcessorLoop("attempts", "unused:9092", settings, handle, logging.getLogger("test.loop"), unit=unit)


ATTEMPT_TPS = [TopicPartition("chronoq.attempts", n) for n in range(4)]


def poll(*sizes: int) -> dict[TopicPartition, list[Record]]:
    """One poll: partition n holds sizes[n] records at offsets 100 * n onwards."""
    return {
        ATTEMPT_TPS[n]: [Record(100 * n + i, partition=n) for i in range(size)] for n, size in enumerate(sizes) if size
    }


async def test_light_partitions_of_one_poll_are_one_unit_committed_in_one_request() -> None:
    """Single handlers' events come a few per partition and poll: one transaction per poll, not per partition.
    A partition with more records than the limit stays a unit of its own, and units keep the poll's order."""
    calls: list[list[tuple[int, int]]] = []
    consumer = FakeConsumer()
    loop = merging_loop(calls, merge_records=5)
    await loop._process_all(consumer, poll(2, 2, 6, 1), asyncio.Event())
    assert calls == [
        [(0, 0), (0, 1), (1, 100), (1, 101)],
        [(2, i) for i in range(200, 206)],
        [(3, 300)],
    ]
    assert consumer.commits == [
        {ATTEMPT_TPS[0]: 2, ATTEMPT_TPS[1]: 102},
        {ATTEMPT_TPS[2]: 206},
        {ATTEMPT_TPS[3]: 301},
    ]
    assert loop.summary.counts == {"records": 11, "applied": 11}


async def test_without_merging_every_partition_is_its_own_unit() -> None:
    calls: list[list[tuple[int, int]]] = []
    await merging_loop(calls, merge_records=0)._process_all(FakeConsumer(), poll(1, 1, 1), asyncio.Event())
    assert calls == [[(0, 0)], [(1, 100)], [(2, 200)]]
    record_units = merging_loop(calls, merge_records=100, unit="record").units_of_poll(poll(1, 1, 1))
    assert [len(unit) for unit in record_units] == [1, 1, 1]  # record loops (commands) never merge


async def test_a_merged_unit_that_fails_transiently_rewinds_each_of_its_partitions_and_commits_nothing() -> None:
    calls: list[list[tuple[int, int]]] = []
    consumer = FakeConsumer()
    loop = merging_loop(calls, merge_records=4, fail_at=101)
    await loop._process_all(consumer, poll(2, 2, 3), asyncio.Event())
    assert calls == [[(2, 200), (2, 201), (2, 202)]]  # the other unit of the poll is still applied
    assert sorted(consumer.seeks, key=lambda s: s[0].partition) == [(ATTEMPT_TPS[0], 0), (ATTEMPT_TPS[1], 100)]
    assert consumer.commits == [{ATTEMPT_TPS[2]: 203}]
    assert loop.summary.counts["errors"] == 1


async def test_a_poison_record_in_a_merged_unit_is_skipped_and_both_partitions_move_past_it() -> None:
    calls: list[list[tuple[int, int]]] = []
    consumer = FakeConsumer()
    loop = merging_loop(calls, merge_records=10, fail_at=100, error=POISON)
    await loop._process_all(consumer, poll(2, 2), asyncio.Event())
    assert calls == [[(0, 0)], [(0, 1)], [(1, 101)]]  # the batch failed: record by record, 100 skipped
    assert consumer.seeks == [] and consumer.commits == [{ATTEMPT_TPS[0]: 2, ATTEMPT_TPS[1]: 102}]
    assert loop.summary.counts["skipped"] == 1

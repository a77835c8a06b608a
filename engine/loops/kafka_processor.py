"""The skeleton of every Kafka-consuming processor of the engine: attempt events and commands.

A processor supplies ``handle(records)``: apply some records of one partition
in the engine database and return counts for the summary.
:class:`KafkaProcessorLoop` supplies the rest, written once:

* **joining**: topics are created if missing, the group is joined with
  auto-commit off, and the subscription is made after ``start()`` (``start()``
  with topics waits for the first join, which can take seconds);
* **stop**: every fetch is raced against the stop event, so shutdown never
  waits for a group join or a long poll;
* **units**: ``unit="batch"`` hands a partition's fetched records to
  ``handle`` at once (the attempt processor applies them in one
  transaction); ``unit="record"`` hands them one by one (the command
  processor applies each command in its own transaction). With
  ``merge_records``, the batches of several partitions of one poll that
  add up to at most that many records are one unit, committed in one
  request: light traffic spread over many partitions (single handlers'
  events, a few per partition and poll) then costs one transaction per poll
  instead of one per partition. Records of one key share a partition, so
  merging keeps their order;
* **offsets after the database**: a partition's offset is committed only
  past the units ``handle`` returned from, so a crash in between re-applies
  them (handlers are idempotent). A refused commit (a rebalance) is logged;
  the next owner re-reads and re-applies, idempotently;
* **errors**: a unit that raises a *transient* error (``is_transient``: the
  database or broker unavailable) is logged as a warning, its partition is
  rewound to it and the loop waits ``error_backoff`` before reading it again:
  nothing fetched is skipped for an outage. A *non-transient* error is the
  records' fault (or a bug) and would fail the same way forever, stalling the
  partition for every tenant on it: a batch is retried record by record, and
  the one record that still fails is logged with its traceback, counted
  (``skipped``) and passed, so the records behind it are applied. Handlers
  reject what they can themselves (commands are answered, undecodable events
  counted); this is the last line. Other partitions of the same fetch are
  still processed;
* **after every poll** (records or none), ``after_round(consumer)`` if given: the attempt processor applies
  there the events it held back (and returns the offsets to commit past them) and records how far it has
  read each partition, and its lag. A failure there is logged like a unit's, and the loop goes on;
* **held events**: with ``held_from``, a partition's offset is never committed past the first record its
  handler still holds unapplied (the attempt processor's outcomes held behind starts), so a crash reads it
  again;
* **a one-line summary** every ``summary_every`` seconds
  (:class:`engine.loops.reporting.LoopSummary`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import ConsumerRecord

from engine.loops.reporting import SUMMARY_EVERY, LoopSummary, log_failure
from schemas import observability as obs
from schemas.clock import pause
from schemas.error_classification import is_transient
from schemas.first_offset import FromFirstOffset
from schemas.kafka_security import AUTHORIZATION_ERRORS, PLAINTEXT, KafkaSecurity, refused, start_client
from schemas.queries import QUERIES
from schemas.topics import DEFAULT_PARTITIONS, FETCH_WAIT_MS, METADATA_REFRESH_S, create_missing_topics

Handle = Callable[[Sequence[ConsumerRecord]], Awaitable[Mapping[str, int]]]
#: After a poll: returns offsets to commit (past records ``handle`` held and has applied since), if any.
AfterRound = Callable[[AIOKafkaConsumer], Awaitable[Mapping[TopicPartition, int] | None]]
#: The offset of a partition's first record whose events the handler holds unapplied, None if none.
HeldFrom = Callable[[int], int | None]


async def database_scoped_group(
    prefix: str, pool: asyncpg.Pool, stop: asyncio.Event, backoff: float, log: logging.Logger
) -> str | None:
    """``<prefix>.<engine database name>``: the default group of an engine loop, so the engines of one database
    share it and engines of different databases on one broker never take each other's records.

    A transient database error (the backend terminated, the database restarting) is retried every ``backoff``
    seconds: a loop starting while the database is away waits for it instead of ending its process. None if
    ``stop`` is set first.
    """
    while not stop.is_set():
        try:
            name: str = await pool.fetchval(*QUERIES.current_database())
            return f"{prefix}.{name}"
        except Exception as err:  # noqa: BLE001 - classified here
            if not is_transient(err):
                raise
            log_failure(log, prefix, err, backoff)
            await pause(stop, backoff)
    return None


@dataclass(frozen=True)
class KafkaLoopSettings:
    """group: the consumer group. topic: the topic consumed; create: topics created if missing (with
    ``partitions``). session_timeout / heartbeat_interval: group membership timing (s).
    max_poll_records: records fetched at most per partition and poll (None: aiokafka's default).
    error_backoff: seconds before a failed unit is read again. summary_every: seconds between summary lines.
    parallel_partitions: units of one poll handled at once (each its own transaction; the units of one
    partition stay in order). 1: one after the other.
    merge_records: ``unit="batch"`` only: partitions of one poll are handed to ``handle`` together while their
    records add up to at most this many (one unit, one offset commit); a partition with more is a unit of its
    own. 0: every partition is a unit of its own.
    """

    group: str
    topic: str
    create: tuple[str, ...]
    session_timeout: float
    heartbeat_interval: float
    max_poll_records: int | None = None
    partitions: int = DEFAULT_PARTITIONS
    error_backoff: float = 1.0
    summary_every: float = SUMMARY_EVERY
    parallel_partitions: int = 1
    merge_records: int = 0


#: One poll's records of one partition.
PartitionBatch = tuple[TopicPartition, Sequence[ConsumerRecord]]


class _Rewind(Exception):
    """A transient error at ``offset``: read the partition again from there after the backoff."""

    def __init__(self, offset: int, error: BaseException) -> None:
        self.offset = offset
        self.error = error


class KafkaProcessorLoop:
    """Consumes ``settings.topic`` and hands records to ``handle`` (see the module docstring)."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        settings: KafkaLoopSettings,
        handle: Handle,
        log: logging.Logger,
        unit: Literal["batch", "record"] = "batch",
        monotonic: Callable[[], float] = time.monotonic,
        after_round: AfterRound | None = None,
        security: KafkaSecurity = PLAINTEXT,
        held_from: HeldFrom | None = None,
    ) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.security = security
        self.settings = settings
        self.handle = handle
        self.log = log
        self.unit = unit
        self.after_round = after_round
        self.held_from = held_from
        self._skipped = obs.get_meter("engine").create_counter(obs.RECORDS_SKIPPED, unit="1")
        self.summary = LoopSummary(name, log, settings.summary_every, monotonic=monotonic)

    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.settings
        await create_missing_topics(self.bootstrap, list(cfg.create), cfg.partitions, self.security)
        options = {"max_poll_records": cfg.max_poll_records} if cfg.max_poll_records is not None else {}
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=cfg.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=FETCH_WAIT_MS,
            metadata_max_age_ms=int(METADATA_REFRESH_S * 1000),
            session_timeout_ms=int(cfg.session_timeout * 1000),
            heartbeat_interval_ms=int(cfg.heartbeat_interval * 1000),
            **options,
            **self.security.client_options(),
        )
        await start_client(consumer, self.bootstrap, self.security)
        # After start: start() with topics waits for the first join. A partition the group never committed
        # starts at offset 0, not at the broker's "earliest" (tansu's can point past records: schemas.first_offset).
        consumer.subscribe([cfg.topic], listener=FromFirstOffset(consumer))
        stopped = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                fetched = await self._fetch(consumer, stopped, stop)
                await self._process_all(consumer, fetched or {}, stop)
                if fetched is not None and self.after_round is not None:
                    await self._after_round(consumer, stop)
                await self.summary.maybe_log()
        except AUTHORIZATION_ERRORS as err:
            raise refused(err) from err  # not transient: the broker's ACLs must change first
        finally:
            stopped.cancel()
            await consumer.stop()

    async def _handle(self, unit: Sequence[ConsumerRecord]) -> dict[str, int]:
        """``handle(unit)``, isolating a record that fails non-transiently (see the module docstring)."""
        try:
            return dict(await self.handle(unit))
        except Exception as err:  # noqa: BLE001 - classified here
            if is_transient(err):
                raise _Rewind(unit[0].offset, err) from err
            if len(unit) == 1:
                self.log.error(
                    "%s skipped a record it cannot apply",
                    self.name,
                    exc_info=err,
                    extra={
                        "action": f"{self.name}.record_skipped",
                        "partition": unit[0].partition,
                        "offset": unit[0].offset,
                        "error": repr(err),
                    },
                )
                self._skipped.add(1, {"loop": self.name})
                return {"skipped": 1}
        counts: dict[str, int] = {}
        for record in unit:  # the batch failed for one of its records: find it, apply the others
            for key, value in (await self._handle([record])).items():
                counts[key] = counts.get(key, 0) + value
        return counts

    async def _fetch(
        self, consumer: AIOKafkaConsumer, stopped: asyncio.Task[bool], stop: asyncio.Event
    ) -> dict[TopicPartition, list[ConsumerRecord]] | None:
        """One poll, or None when stop came first or the poll failed (then after error_backoff)."""
        fetch = asyncio.create_task(consumer.getmany(timeout_ms=200))
        await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not fetch.done():
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
            return None
        try:
            return fetch.result()
        except AUTHORIZATION_ERRORS:
            raise  # an ACL refusal is not a failed poll: retrying cannot succeed (run() says so)
        except Exception as err:  # noqa: BLE001 - a failed poll must not end the loop
            await self._back_off(err, stop)
            return None

    async def _process_all(
        self,
        consumer: AIOKafkaConsumer,
        fetched: Mapping[TopicPartition, Sequence[ConsumerRecord]],
        stop: asyncio.Event,
    ) -> None:
        """Every unit of a poll (:meth:`units_of_poll`): one after the other, or up to ``parallel_partitions``
        at once (their records are independent: a partition's units still go in order, and a failure rewinds
        only the partitions of its unit)."""
        units = self.units_of_poll(fetched)
        if self.settings.parallel_partitions <= 1 or len(units) <= 1:
            for batches in units:
                await self._process_unit(consumer, batches, stop)
            return
        limit = asyncio.Semaphore(self.settings.parallel_partitions)

        async def one(batches: list[PartitionBatch]) -> None:
            async with limit:
                await self._process_unit(consumer, batches, stop)

        await asyncio.gather(*(one(batches) for batches in units))

    def units_of_poll(self, fetched: Mapping[TopicPartition, Sequence[ConsumerRecord]]) -> list[list[PartitionBatch]]:
        """The poll's partitions grouped into units, in poll order: consecutive partitions share one while their
        records add up to at most ``merge_records`` (``unit="batch"`` only); every other partition is alone."""
        limit = self.settings.merge_records if self.unit == "batch" else 0
        units: list[list[PartitionBatch]] = []
        size = 0
        for tp, records in fetched.items():
            if not records:
                continue
            if not units or size + len(records) > limit:
                units.append([])
                size = 0
            units[-1].append((tp, records))
            size += len(records)
        return units

    async def _process_unit(
        self, consumer: AIOKafkaConsumer, batches: list[PartitionBatch], stop: asyncio.Event
    ) -> None:
        if len(batches) == 1:
            await self.process(consumer, *batches[0], stop)
        else:
            await self.process_merged(consumer, batches, stop)

    async def process_merged(
        self, consumer: AIOKafkaConsumer, batches: Sequence[PartitionBatch], stop: asyncio.Event
    ) -> None:
        """Several partitions' records as one unit: handled together, their offsets committed in one request.
        A transient failure rewinds every one of them to its first record and commits nothing (what a
        record-by-record fallback applied before the failure is applied again, idempotently)."""
        unit = [record for _, records in batches for record in records]
        try:
            counts = await self._handle(unit)
        except _Rewind as rewind:
            for tp, records in batches:
                consumer.seek(tp, records[0].offset)
            await self._back_off(rewind.error, stop)
            return
        self.summary.add({"records": len(unit), **counts})
        await self._commit(consumer, {tp: records[-1].offset + 1 for tp, records in batches})

    async def _after_round(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        assert self.after_round is not None
        try:
            offsets = await self.after_round(consumer)
        except Exception as err:  # noqa: BLE001 - bookkeeping after a poll must not end the loop
            await self._back_off(err, stop)
            return
        if offsets:
            await self._commit(consumer, dict(offsets))

    async def _back_off(self, err: BaseException, stop: asyncio.Event) -> None:
        """After a failed step: count and log it, then wait ``error_backoff`` (or until stop)."""
        self.summary.add({"errors": 1})
        log_failure(self.log, self.name, err, self.settings.error_backoff)
        await pause(stop, self.settings.error_backoff)

    async def process(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, records: Sequence[ConsumerRecord], stop: asyncio.Event
    ) -> None:
        """Handle one partition's records unit by unit; commit past what was handled (or skipped)."""
        units = [records] if self.unit == "batch" else [[record] for record in records]
        done: int | None = None
        for unit in units:
            try:
                counts = await self._handle(unit)
            except _Rewind as rewind:
                consumer.seek(tp, rewind.offset)
                if rewind.offset > unit[0].offset:
                    done = rewind.offset  # the records before it were applied: commit past them
                await self._back_off(rewind.error, stop)
                break
            self.summary.add({"records": len(unit), **counts})
            done = unit[-1].offset + 1
        if done is not None:
            await self._commit(consumer, {tp: done})

    async def _commit(self, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
        """Commit past what was handled, never past a record the handler holds (``held_from``); a refused commit
        (a rebalance) is logged, and the next owner re-reads."""
        if self.held_from is not None:
            held = {tp: self.held_from(tp.partition) for tp in offsets}
            offsets = {tp: offset if (at := held[tp]) is None else min(offset, at) for tp, offset in offsets.items()}
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as err:
            self.log.warning(
                "%s offset commit refused (rebalance); the records will be re-applied, idempotently",
                self.name,
                extra={"action": f"{self.name}.commit_failed", "error": repr(err)},
            )

"""The attempt processor: consume ``chronoq.attempts`` and apply the events, a poll's batch at a time.

Each fetched partition's records are one unit, or, while a poll's partitions hold few records (at most
``merge_records`` together), several partitions' records are one
(:class:`engine.loops.kafka_processor.KafkaLoopSettings`). A unit is decoded (an undecodable record is
counted as poison and skipped) and its events laid out by :func:`transaction_lanes`: weighed by events (a
group record holds up to 500), each partition with more than ``merge_records`` events is a lane of its own,
lighter ones share a lane, and the lanes' transactions run side by side (at most ``parallel_partitions`` at
once), each lane's in order. A transaction's events are authenticated (:class:`EventVerifier`, by default
:class:`CredentialVerifier`: an event not signed by the consumer side of its occurrence's target, when that
target has a credential, is rejected, counted as ``chronoq.attempt_events_rejected`` and changes nothing),
then applied set-based by :meth:`AttemptLedger.apply_batch` — one statement per kind of write, fencing per
occurrence. Everything a transaction changes is written in it; the Kafka offsets are committed after the
whole unit, so a crash in between re-applies events, which are idempotent.

Errors. A transient database error (the backend terminated, a deadlock, the database away) fails the
unit: its partitions are rewound and read again, and the other units of the fetch are still processed
(the skeleton's rule, :mod:`engine.loops.kafka_processor`), so a fetched event is always applied or read
again. Any other database error in the set-based statements (a bug, or a constraint one event violates)
makes the batch fall back to one event at a time, each in a savepoint: the event that fails is logged and
skipped, never blocking its partition.

Answers. After the transaction commits, every ``started`` that names its consumer group is answered on
``chronoq.attempt-grants`` (:mod:`engine.loops.attempt_grants`): ``granted`` or ``refused`` with a reason,
read from the occurrences' state and lease tokens at the end of that transaction
(:func:`engine.rules.attempt_grants.grant_for`), so a ``started`` read again after a crash between the commit
and the reply is answered ``granted`` again. The consumer runtime calls the handler only after ``granted``
(the cancel barrier, docs/state-machine.md).

Outcomes behind starts. While starts stream in (a burst), the outcomes and heartbeats read with them are held
in memory, in order, and applied in bounded rounds once starts stop streaming or the oldest has waited
150 s (:mod:`engine.rules.outcome_hold`): runtimes wait for the answers to their starts, nobody waits for
an outcome, and both compete for the same cores. A partition's offset is never committed past its first held
record (a crash reads it again), and a partition holding events is not read to its end (below).

Progress. After every poll the processor records, per partition it has read to its end, the engine
instant up to which every event of that partition is applied (``attempt_event_progress``); the lease
reaper judges leases by that instant, so a backlog of heartbeats and outcomes never makes it time out
healthy attempts. A partition gets its row (at the floor) before its first event is applied: with no row
at all the reaper would judge by now alone. The lag (events not yet applied) is a gauge per partition.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord
from opentelemetry import metrics, trace

from engine.loops.attempt_authentication import CredentialVerifier, EventVerifier, ReceivedEvent, Rejection
from engine.loops.attempt_grants import GrantPublisher, GrantSink
from engine.loops.attempt_ledger import AttemptLedger, Verdict, lock_event_occurrences, read_event_leases
from engine.loops.attempt_outcomes import AttemptMetrics, AttemptStats
from engine.loops.kafka_processor import KafkaLoopSettings, KafkaProcessorLoop, database_scoped_group
from engine.loops.reporting import SUMMARY_EVERY
from engine.rules.attempt_grants import grant_for
from engine.rules.consumers_behind import ConsumersBehind
from engine.rules.outcome_hold import HoldLimits, Kept, OutcomeHold
from schemas import observability as obs
from schemas.attempt_credentials import signed_by
from schemas.attempt_events import HEARTBEAT, STARTED, AttemptEvent, decode_attempt_record
from schemas.attempt_grants import AttemptGrant
from schemas.clock import Clock, DatabaseClock
from schemas.error_classification import is_transient
from schemas.kafka_security import PLAINTEXT, KafkaSecurity
from schemas.messages import MalformedMessage
from schemas.queries import QUERIES
from schemas.topics import ATTEMPT_GRANTS_TOPIC, ATTEMPTS_TOPIC, DEFAULT_PARTITIONS

log = logging.getLogger("chronoq.attempts")

#: The progress of a partition nobody has read yet: every lease ends after it.
PROGRESS_FLOOR = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class AttemptProcessorConfig:
    """group: the engine's consumer group on the attempts topic (engine nodes share the partitions). Default:
        ``chronoq-engine-attempts.<engine database name>``, so the engines of one database share one group
        and engines of different databases (tests, staging) on one broker never take each other's events.
    session_timeout / heartbeat_interval: group membership timing (s); the embedded broker's first
        join takes about half the session timeout (docs/broker.md).
    max_poll_records: records fetched per poll, all partitions together (default 4000; a batch handler's group
        record holds up to 500 events); each partition's events are applied in transactions of at most this
        many (several light partitions' together, see merge_records).
    partitions: of the attempts topic, if this processor creates it.
    error_backoff: seconds to wait after a failed batch before reading it again.
    parallel_partitions: transactions of this processor open at once, for disjoint partitions (default 4: the
        database works on one while this process decides the next; their occurrences are disjoint).
    merge_records: partitions of one poll are applied in one transaction while their events add up to at most
        this many (default 256): a transaction costs a fixed dozen statements whatever its size, so a light load
        spread over the partitions (a few events each) would otherwise pay them per partition. 0: never.
    behind_after / behind_events / behind_window: ``behind_events`` starts and outcomes (default 1,000) applied
        within ``behind_window`` seconds (default 5), of attempts started ``behind_after`` seconds (default 5) or
        more past their occurrence's available_at, mean consumers are working through a backlog: the processor
        says so in ``consumers_behind`` (for three windows) and the settle pass waits
        (engine.rules.consumers_behind). 0: never. At the defaults the announcement lasts 15 s, so a burst's
        last outcomes, which come in below its peak rate, are applied before the settle pass begins.
    outcome_hold: while ``starts`` or more starts come within ``window`` seconds, outcomes and heartbeats wait
        behind them (engine.rules.outcome_hold; at most ``max_age`` s and ``max_events`` events). ``starts=0``:
        never.
    """

    group: str | None = None
    session_timeout: float = 10.0
    heartbeat_interval: float = 3.0
    max_poll_records: int = 4000
    partitions: int = DEFAULT_PARTITIONS
    error_backoff: float = 1.0
    parallel_partitions: int = 4
    merge_records: int = 256
    behind_after: float = 5.0
    behind_events: int = 1000
    behind_window: float = 5.0
    outcome_hold: HoldLimits = HoldLimits()

    def validate(self) -> None:
        self.outcome_hold.validate()
        if self.heartbeat_interval >= self.session_timeout:
            raise ValueError("heartbeat_interval must be shorter than session_timeout")
        if self.max_poll_records < 1:
            raise ValueError("max_poll_records must be at least 1")
        if self.merge_records < 0:
            raise ValueError("merge_records must be 0 (never merge) or more")
        if self.behind_after < 0 or self.behind_events < 0 or self.behind_window <= 0:
            raise ValueError("behind_after and behind_events must be 0 or more, behind_window more than 0")


class AttemptProcessor:
    """Reads ``chronoq.attempts`` and applies the events in the engine database."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        kafka_bootstrap: str | None = None,
        config: AttemptProcessorConfig | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        meter: metrics.Meter | None = None,
        tracer: trace.Tracer | None = None,
        verifier: EventVerifier | None = None,
        security: KafkaSecurity = PLAINTEXT,
        grants: GrantSink | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.kafka_bootstrap = kafka_bootstrap
        self.config = config or AttemptProcessorConfig()
        self.config.validate()
        self.clock = clock or DatabaseClock()
        self.stats = AttemptStats()
        meter = meter or obs.get_meter("engine")
        self.meters = AttemptMetrics(meter)
        self._lag = meter.create_gauge(obs.ATTEMPT_EVENTS_LAG, unit="1", description=obs.ATTEMPT_EVENTS_LAG_DESCRIPTION)
        self.tracer = tracer or obs.get_tracer("engine")
        self.verifier: EventVerifier = verifier or CredentialVerifier()
        self.security = security
        self.rejections: Counter[str] = Counter()
        # Where the answers to `started` go once their transaction committed (run() opens a Kafka
        # publisher when none is given; without one, apply_events answers nobody).
        self.grants = grants
        self._meter = meter
        self.ledger = AttemptLedger(self.clock, rng or random.Random(), self.meters, self.stats)
        self.assigned_partitions = 0
        # The engine instant of the last progress write, and this host's time right after it: a poll
        # answered after that moment covers every event produced before that instant.
        self._mark: tuple[datetime, float] | None = None
        self._known_partitions: set[int] = set()
        cfg = self.config
        self.behind = ConsumersBehind(cfg.behind_after, cfg.behind_events, cfg.behind_window)
        self._behind_announcements = meter.create_counter(obs.CONSUMERS_BEHIND_ANNOUNCEMENTS, unit="1")
        # Transactions open at once across the loop's units (each unit splits into lanes, _apply_in_lanes).
        self._transactions = asyncio.Semaphore(max(self.config.parallel_partitions, 1))
        self.monotonic = monotonic
        self.hold: OutcomeHold[ReceivedEvent] = OutcomeHold(
            cfg.outcome_hold, _is_start, lambda item: item.event.occurrence_id, lambda item: item.offset or 0
        )
        self._held = meter.create_gauge(
            obs.ATTEMPT_EVENTS_HELD, unit="1", description=obs.ATTEMPT_EVENTS_HELD_DESCRIPTION
        )
        self._holding_since: float | None = None
        self._read_in_round = False  # whether handle_records ran since the last after_poll

    @property
    def events_applied(self) -> int:
        """Events decided so far (every verdict), for benchmarks and status."""
        return sum(self.stats.verdicts.values())

    async def apply_events(self, batch: Sequence[AttemptEvent | ReceivedEvent]) -> list[Verdict]:
        """Apply events in order, in one transaction (no Kafka: tests and tools call this directly); a bare
        AttemptEvent counts as unsigned."""
        return await self.apply_received(
            [
                item if isinstance(item, ReceivedEvent) else ReceivedEvent(item, None, item.key, item.encode())
                for item in batch
            ]
        )

    async def apply_received(self, received: Sequence[ReceivedEvent]) -> list[Verdict]:
        """Verify, then apply set-based in one transaction; the verdict of every event, in order.

        A transient error fails the whole batch (it is read again); any other error makes it fall back to
        one event at a time in savepoints, skipping (and counting as poison) only the event that fails.
        """
        with self.tracer.start_as_current_span(obs.SPAN_ATTEMPT_EVENTS) as span:
            span.set_attribute("chronoq.events", len(received))
            span.set_attribute("chronoq.partitions", len({r.partition for r in received}))
            async with self.pool.acquire() as conn, conn.transaction():
                now: datetime = await conn.fetchval(*QUERIES.current_instant(now=self.clock.now()))
                # Locked before verifying: the verifier reads their targets from these rows, and the ledger
                # decides on them (one read of each occurrence for both).
                locked = await lock_event_occurrences(conn, [r.event for r in received])
                targets = {row["occurrence_id"]: row["target"] for row in locked}
                rejections = await self.verifier.verify(conn, received, now, targets)
                accepted = [r.event for r, why in zip(received, rejections, strict=True) if why is None]
                try:
                    async with conn.transaction():
                        applied = await self.ledger.apply_batch(conn, accepted, now, locked)
                except Exception as err:  # noqa: BLE001 - a transient error re-reads; anything else is isolated
                    if is_transient(err):
                        raise
                    log.warning(
                        "attempt batch could not be applied at once; applying it one event at a time",
                        extra={"action": "attempt.batch_fallback", "events": len(accepted), "error": repr(err)},
                    )
                    applied = [await self._apply_alone(conn, event, now) for event in accepted]
                asked = [r.event for r in received if _asks_for_grant(r.event)]
                leases = await read_event_leases(conn, asked) if asked else {}
        verdicts, results = [], iter(applied)
        for item, why in zip(received, rejections, strict=True):
            verdicts.append(next(results) if why is None else self._rejected(item, why))
        self._count_late_events(received, verdicts, locked, now)
        if self.grants is not None and asked:
            # After the commit: an answer never runs ahead of the state it reports. Each goes back in the form
            # its `started` came in (a group's answers as groups), so older runtimes keep their single answers.
            for grouped in (False, True):
                in_form = [
                    (item, verdict) for item, verdict in zip(received, verdicts, strict=True) if item.grouped is grouped
                ]
                replies = answers([item for item, _ in in_form], [verdict for _, verdict in in_form], leases)
                if replies:
                    await self.grants.send(replies, grouped=grouped)
        for item, verdict in zip(received, verdicts, strict=True):
            self.ledger.fenced(item.event, verdict)
        for verdict, n in Counter(verdicts).items():
            self.stats.count(verdict, n)
        self.meters.batch.record(len(received))
        return verdicts

    def _count_late_events(
        self,
        received: Sequence[ReceivedEvent],
        verdicts: Sequence[Verdict],
        locked: Sequence[asyncpg.Record],
        now: datetime,
    ) -> None:
        """Record how late the attempts of the accepted starts and outcomes started
        (engine.rules.consumers_behind): a start's now; an outcome's from the start its occurrence records
        (enqueued_at as locked: this processor's instant of the start until the settle pass writes the
        broker's acknowledgement), so a backlog's outcomes count and those of a handler that started on time
        and ran for minutes do not. A start counts from now even where the settle pass already wrote the
        acknowledgement: judged by that it never looked late, and a pass that began before the first
        announcement settled the whole burst among the starts (stop 55). Heartbeats never count."""
        kinds: dict[uuid.UUID, list[str]] = {}
        for item, verdict in zip(received, verdicts, strict=True):
            if verdict is Verdict.ACCEPTED and item.event.event != HEARTBEAT:
                kinds.setdefault(item.event.occurrence_id, []).append(item.event.event)
        if not kinds:
            return
        lateness = []
        for row in locked:
            for kind in kinds.get(row["occurrence_id"], ()):
                started_at = now if kind == STARTED else (row["enqueued_at"] or now)
                lateness.append((started_at - row["available_at"]).total_seconds())
        self.behind.record(now, lateness)

    async def _apply_alone(self, conn: asyncpg.Connection, event: AttemptEvent, now: datetime) -> Verdict:
        try:
            async with conn.transaction():
                return await self.ledger.apply(conn, event, now)
        except Exception as err:
            if is_transient(err):
                raise
            # A value the database refuses, a constraint this event violates, or a bug: skip and count it,
            # never block the partition on it.
            self.stats.poison += 1
            self.meters.poison.add(1, {"topic": ATTEMPTS_TOPIC})
            log.exception(
                "attempt event could not be applied; skipped",
                extra={
                    "action": "attempt.apply_failed",
                    "occurrence_id": str(event.occurrence_id),
                    "event": event.event,
                    "error": repr(err),
                },
            )
            return Verdict.IGNORED

    def _rejected(self, item: ReceivedEvent, why: str) -> Verdict:
        """Count and log an event that was not authenticated (the record's content, never a secret)."""
        self.rejections[why] += 1
        self.meters.rejected.add(1, {"reason": why, "event": item.event.event})
        log.warning(
            "attempt event rejected: not authenticated as the consumer side of its target",
            extra={
                "action": "attempt.rejected",
                "reason": why,
                "occurrence_id": str(item.event.occurrence_id),
                "event": item.event.event,
                "consumer_group": item.event.consumer_group,
                "credential_id": str(item.credential_id) if item.credential_id else None,
                "partition": item.partition,
                "offset": item.offset,
            },
        )
        return Verdict.REJECTED

    async def handle_records(self, records: Sequence[ConsumerRecord]) -> dict[str, int]:
        """Decode a unit's records (one partition's, or several partitions' one after the other; undecodable
        ones are counted as poison and skipped) and apply them.

        A partition's progress row exists before its first event is applied (see :meth:`_known`)."""
        await self._known({record.partition for record in records})
        self._read_in_round = True
        received: list[ReceivedEvent] = []
        poison = rejected = 0
        for record in records:
            try:
                decoded = decode_attempt_record(record.value)
            except MalformedMessage as err:
                poison += 1
                self.stats.poison += 1
                self.meters.poison.add(1, {"topic": ATTEMPTS_TOPIC})
                log.error(
                    "undecodable attempt event skipped",
                    extra={
                        "action": "attempt.poison",
                        "partition": record.partition,
                        "offset": record.offset,
                        "error": str(err),
                    },
                )
                continue
            value = record.value or b""
            try:
                claim = signed_by(record.headers)
            except MalformedMessage:
                # Garbled credential headers: decodable, but it proves nothing (for any event of a group).
                for event in decoded.events:
                    rejected += 1
                    self.stats.count(
                        self._rejected(
                            ReceivedEvent(event, None, record.key, value, record.partition, record.offset),
                            Rejection.MALFORMED.value,
                        ),
                        1,
                    )
                continue
            received += (
                ReceivedEvent(event, claim, record.key, value, record.partition, record.offset, decoded.grouped)
                for event in decoded.events
            )
        verdicts = await self._apply_admitted(received)
        counts = Counter(verdict.value for verdict in verdicts)
        counts[Verdict.REJECTED.value] += rejected
        return {**{k: v for k, v in counts.items() if v}, **({"poison": poison} if poison else {})}

    async def _apply_admitted(self, received: Sequence[ReceivedEvent]) -> list[Verdict]:
        """Apply what the hold lets through of ``received`` (with what it held of their partitions before), and
        keep the rest held. If applying fails, the hold of these partitions is put back as it was: the loop
        reads the unit again, and the events held before it are still held."""
        by_partition: dict[int | None, list[ReceivedEvent]] = {}
        for item in received:
            by_partition.setdefault(item.partition, []).append(item)
        kept = self.hold.mark(by_partition)
        now = self.monotonic()
        admitted = [
            item for partition, items in by_partition.items() for item in self.hold.admit(partition, items, now)
        ]
        verdicts = await self._apply_or_put_back(admitted, kept)
        self._note_hold(now)
        return verdicts

    async def after_poll(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, int]:
        """After every poll: what is held of partitions no longer assigned is dropped (their next owner reads it
        from the committed offset), held events are applied if starts stopped streaming (or a limit was
        reached), then progress is recorded (:meth:`record_progress`). Returns the offsets to commit past the
        records applied here (the loop commits them, never past a record still held)."""
        assigned = {tp.partition for tp in consumer.assignment()}
        self.hold.forget(set(self.hold.partitions()) - assigned)
        now = self.monotonic()
        kept = self.hold.mark(self.hold.partitions())  # before the release takes them out
        released = self.hold.release(now, idle=not self._read_in_round)
        self._read_in_round = False
        offsets: dict[TopicPartition, int] = {}
        if released:
            await self._apply_or_put_back([item for items in released.values() for item in items], kept)
            for partition in released:
                read_to = self.hold.read_to(partition)
                if partition is not None and read_to is not None:
                    offsets[TopicPartition(ATTEMPTS_TOPIC, partition)] = read_to
        self._note_hold(now)
        await self.record_progress(consumer)
        return offsets

    async def _apply_or_put_back(
        self, events: list[ReceivedEvent], kept: Mapping[int | None, Kept[ReceivedEvent]]
    ) -> list[Verdict]:
        """Apply ``events`` in lanes; if that fails, put the hold back as ``kept`` (:meth:`OutcomeHold.mark`)
        saw it, so what was taken out of it is still held, and raise."""
        try:
            return await self._apply_in_lanes(
                transaction_lanes(events, self.config.merge_records, self.config.max_poll_records)
            )
        except BaseException:
            self.hold.rollback(kept)
            raise

    def _note_hold(self, now: float) -> None:
        """The held gauge, and a log line when a hold begins and when it is drained."""
        held = self.hold.held
        self._held.set(held)
        if held and self._holding_since is None:
            self._holding_since = now
            log.info(
                "attempt outcomes held behind a stream of starts",
                extra={"action": "attempt.outcomes_held", "held": held},
            )
        elif not held and self._holding_since is not None:
            log.info(
                "attempt outcomes held behind starts are applied",
                extra={"action": "attempt.outcomes_released", "held_s": round(now - self._holding_since, 3)},
            )
            self._holding_since = None

    async def _apply_in_lanes(self, lanes: list[list[list[ReceivedEvent]]]) -> list[Verdict]:
        """Every lane's transactions in order, lanes side by side (at most ``parallel_partitions``
        transactions of this processor open at once, whatever the loop's units): the database works on one
        while this process decides the next. A lane stops at its first failed transaction; the other lanes
        run to their end, and then the failure is raised (a transient one first): the loop re-reads the whole
        unit, and what was applied is applied again, idempotently."""

        async def lane_of(transactions: list[list[ReceivedEvent]]) -> list[Verdict]:
            async with self._transactions:
                return [verdict for chunk in transactions for verdict in await self.apply_received(chunk)]

        results = await asyncio.gather(*(lane_of(lane) for lane in lanes), return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            raise next((err for err in failures if is_transient(err)), failures[0])
        return [verdict for result in results if not isinstance(result, BaseException) for verdict in result]

    async def record_progress(self, consumer: AIOKafkaConsumer) -> None:
        """After a poll: the partitions read to their end, as of the previous mark, and the lag gauges.

        A partition counts as read to its end when every fetched event is applied (its position reached
        the high watermark) and that watermark came in a fetch answered after the mark was taken: then
        every event produced before the mark's engine instant is applied.
        """
        assignment = consumer.assignment()
        self.assigned_partitions = len(assignment)
        caught_up = []
        for tp in sorted(assignment, key=lambda t: t.partition):
            high = consumer.highwater(tp)
            if high is None:
                continue
            position = await consumer.position(tp)
            self._lag.set(max(high - position, 0), {"partition": tp.partition})
            polled = consumer.last_poll_timestamp(tp)
            if (
                self._mark is not None
                and position >= high
                and polled is not None
                and polled / 1000 > self._mark[1]
                and not self.hold.holds(tp.partition)  # a held event is read, not applied
            ):
                caught_up.append(tp.partition)
        await self._known({tp.partition for tp in assignment})
        now: datetime = await self.pool.fetchval(
            *QUERIES.record_attempt_progress(
                partitions=caught_up,
                applied_through=self._mark[0] if self._mark else PROGRESS_FLOOR,
                now=self.clock.now(),
            )
        )
        self._mark = (now, time.time())
        await self.announce_if_behind(now)

    async def announce_if_behind(self, now: datetime) -> bool:
        """While the events this processor applies say consumers are working through a backlog, tell the settle
        passes to wait (``consumers_behind``), rewritten every half ``behind_window``. True when it wrote."""
        if not self.behind.announcement_due(now):
            return False
        await self.pool.execute(*QUERIES.announce_consumers_behind(until_s=self.behind.lasts_s, now=self.clock.now()))
        self.behind.announced(now)
        self._behind_announcements.add(1)
        return True

    async def _known(self, partitions: set[int]) -> None:
        """Partitions this processor has not recorded yet get a progress row at the floor (or keep where a
        previous owner left it), so the reaper waits for this processor instead of judging by now.

        Called before a partition's first event is applied: with no row at all the reaper judges by now
        alone, so an engine stopped right after applying a ``started`` (and before its first progress write)
        would wake to time that lease out before reading the heartbeats sent meanwhile.
        """
        new = sorted(partitions - self._known_partitions)
        if new:
            await self.pool.fetchval(
                *QUERIES.record_attempt_progress(partitions=new, applied_through=PROGRESS_FLOOR, now=self.clock.now())
            )
            self._known_partitions.update(new)

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Consume attempt events until ``stop`` is set; the offset is committed after the database."""
        if self.kafka_bootstrap is None:
            raise ValueError("AttemptProcessor.run needs kafka_bootstrap")
        cfg = self.config
        group = cfg.group or await database_scoped_group(
            "chronoq-engine-attempts", self.pool, stop, cfg.error_backoff, log
        )
        if group is None:
            return
        publisher: GrantPublisher | None = None
        if self.grants is None:
            publisher = GrantPublisher(
                self.kafka_bootstrap, self._meter or obs.get_meter("engine"), security=self.security
            )
            await publisher.start()
            self.grants = publisher
        settings = KafkaLoopSettings(
            group,
            ATTEMPTS_TOPIC,
            (ATTEMPTS_TOPIC, ATTEMPT_GRANTS_TOPIC),
            cfg.session_timeout,
            cfg.heartbeat_interval,
            cfg.max_poll_records,
            cfg.partitions,
            cfg.error_backoff,
            summary_every,
            cfg.parallel_partitions,
            cfg.merge_records,
        )
        try:
            await KafkaProcessorLoop(
                "attempts",
                self.kafka_bootstrap,
                settings,
                self.handle_records,
                log,
                after_round=self.after_poll,
                security=self.security,
                held_from=self.hold.held_from,
            ).run(stop)
        finally:
            if publisher is not None:
                self.grants = None
                await publisher.stop()


def transaction_lanes(received: Sequence[ReceivedEvent], merge: int, most: int) -> list[list[list[ReceivedEvent]]]:
    """A unit's events as lanes of transactions: each lane's transactions are applied in order, lanes side
    by side.

    The loop forms units by records, and a group record holds up to 500 events, so one unit of group records
    can hold a whole poll's partitions; here they are weighed by events. Consecutive partitions share a
    lane of one transaction while their events add up to at most ``merge`` (a transaction's fixed cost
    shared by light partitions); any other partition is a lane of its own, in transactions of at most
    ``most`` events, its `started` ahead (:func:`starts_first`). A partition's events are never split
    across lanes, so each occurrence's keep their order (every event of an occurrence is on its key's
    partition); lanes hold disjoint partitions, hence disjoint occurrences."""
    merge = min(merge, most)
    by_partition: dict[int | None, list[ReceivedEvent]] = {}
    for item in received:
        by_partition.setdefault(item.partition, []).append(item)
    lanes: list[list[list[ReceivedEvent]]] = []
    merged: list[ReceivedEvent] = []
    for events in by_partition.values():
        if len(events) <= merge:
            if len(merged) + len(events) > merge:
                lanes.append([merged])
                merged = []
            merged += events
            continue
        events = starts_first(events) if len(events) > most else events
        lanes.append([events[start : start + most] for start in range(0, len(events), most)])
    if merged:
        lanes.append([merged])
    return lanes


def starts_first(events: Sequence[ReceivedEvent]) -> list[ReceivedEvent]:
    """``events`` with every `started` that is the first event of its occurrence among them moved ahead (in
    order), the rest after it (in order): each occurrence's events keep their order, and a lane's first
    transactions answer the `started` that runtimes are waiting on instead of making them wait behind earlier
    batches' outcomes and heartbeats (a backlogged poll holds tens of thousands of those). Events of different
    occurrences are independent: the ledger decides each occurrence on its own events."""
    seen: set[uuid.UUID] = set()
    ahead: list[ReceivedEvent] = []
    rest: list[ReceivedEvent] = []
    for item in events:
        occurrence = item.event.occurrence_id
        (ahead if item.event.event == STARTED and occurrence not in seen else rest).append(item)
        seen.add(occurrence)
    return ahead + rest


def _is_start(item: ReceivedEvent) -> bool:
    return item.event.event == STARTED


def _asks_for_grant(event: AttemptEvent) -> bool:
    """A `started` naming its group: the runtime that sent it waits for the answer (older runtimes name
    no group and wait for nothing)."""
    return event.event == STARTED and event.consumer_group is not None and event.lease_token is not None


def answers(
    received: Sequence[ReceivedEvent], verdicts: Sequence[Verdict], leases: Mapping[uuid.UUID, asyncpg.Record]
) -> list[AttemptGrant]:
    """The answer to every `started` of a batch, from the state the committed batch left
    (:func:`engine.rules.attempt_grants.grant_for`)."""
    grants = []
    for item, verdict in zip(received, verdicts, strict=True):
        event = item.event
        if not _asks_for_grant(event):
            continue
        assert event.lease_token is not None and event.consumer_group is not None
        row = leases.get(event.occurrence_id)
        result, reason = grant_for(
            event.lease_token, verdict.value, row["state"] if row else None, row["lease_token"] if row else None
        )
        try:
            grants.append(AttemptGrant(event.occurrence_id, event.lease_token, event.consumer_group, result, reason))
        except MalformedMessage:
            # A group name the reply cannot carry (a runtime could not be waiting under it): nobody to answer.
            continue
    return grants

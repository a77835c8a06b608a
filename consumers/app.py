"""The consumer runtime: apply each occurrence's business effect once, report every attempt.

Delivery from Kafka is at least once. For each message the runtime runs the
attempt protocol of :mod:`consumers.attempt_runner`: a transaction on the
app's OWN database holding the dedupe row (consumer group, occurrence_id) and
the handler's effect, with ``started`` / ``succeeded`` / ``failed`` /
``canceled`` / ``already_applied`` events reported to the engine on
``chronoq.attempts``. The engine — never this process — decides retries and
dead letters; the app never needs the engine's database.

Batch handlers (``@app.handler(target, batch=n)``) take up to n occurrences of
their target per call, in one transaction, deduped by set; their attempts are
reported in Kafka batches (:mod:`consumers.batch_runner`).

Concurrency and offsets. Handlers run concurrently, bounded per target
(``@app.handler(target, concurrency=n)``: calls in flight, each a batch for a
batch handler) and per process (``max_in_flight``).
Messages of one partition start in offset order; they may finish in any
order, and the committed offset of a partition never passes its lowest
unfinished message (:mod:`consumers.offsets`). A partition with many buffered
messages is paused, so fetching never outruns the handlers. Offsets are
committed only after the database commit and the report; auto-commit is off.
A commit never names a partition this member no longer owns: revocation and
commits take turns, and a partition revoked meanwhile is left out.

Poison messages (undecodable, or for a target without a handler) go to the
dead-letter topic and their offsets are committed: they never block a
partition.

A record whose ``binding_version`` is newer than the app's view of the target
bindings (its grant is not on the topic yet) is *parked*, not dead-lettered: it
leaves its handler slot, its offset stays unfinished (nothing is committed past
it; the records after it run), and it goes back to the front of its partition's
queue once the view has read a binding that decides it — or, after
``binding_behind_timeout``, to be dead-lettered as "binding view behind". Parked
records count towards the partition's buffer, so a flood of them pauses
fetching from it instead of growing without bound.

Shutdown. The first SIGTERM (or ``stop``) stops fetching, lets in-flight
handlers finish for up to ``shutdown_grace`` seconds, commits offsets and
leaves the group. A second SIGTERM (or :meth:`ConsumerApp.abort`) aborts the
handlers still running: their transactions roll back and their messages are
redelivered to the next owner.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import ConsumerRecord
from opentelemetry import metrics, trace

from consumers.attempt_grants import GrantWaiter
from consumers.attempt_reports import AttemptReporter
from consumers.attempt_runner import (
    AttemptRunner,
    ConsumerHooks,
    ConsumerMetrics,
    ConsumerStats,
    Handler,
    HandlerRegistration,
    Outcome,
)
from consumers.batch_runner import BatchRunner
from consumers.config import ConsumerConfig
from consumers.dead_letters import send_to_dead_letters
from consumers.handlers import HandlerRegistry
from consumers.offsets import PartitionOffsets
from consumers.schedule_states import ScheduleStateView
from consumers.target_bindings import Admission, TargetBindingView
from schemas import observability as obs
from schemas.clock import pause
from schemas.connections import create_pool
from schemas.error_classification import is_transient
from schemas.errors import MalformedMessage
from schemas.first_offset import FromFirstOffset
from schemas.kafka_security import AUTHORIZATION_ERRORS, refused, start_client
from schemas.messages import OccurrenceMessage, decode_occurrence
from schemas.migrations import apply_migrations
from schemas.produce_batches import SHARED_BATCH_BYTES
from schemas.topics import (
    ATTEMPT_GRANTS_TOPIC,
    ATTEMPTS_TOPIC,
    DEAD_LETTER_TOPIC,
    OCCURRENCE_TOPIC_PREFIX,
    SCHEDULE_STATES_TOPIC,
    TARGET_BINDINGS_TOPIC,
    create_missing_topics,
    occurrence_topic,
    validate_target,
)

_T = TypeVar("_T")

log = logging.getLogger("chronoq.consumer")

__all__ = ["ConsumerApp", "ConsumerConfig", "ConsumerHooks", "ConsumerStats", "Handler", "Outcome"]


def _undecodable(record: ConsumerRecord) -> bool:
    try:
        decode_occurrence(record.value, record.headers)
    except MalformedMessage:
        return True
    return False


@dataclass(frozen=True)
class _Behind:
    """A record the binding view was behind: since when (loop time), and what it waits for."""

    since: float
    target: str
    tenant_id: str
    binding_version: int


class _ViewBehind(Exception):
    """The record's binding version is newer than the view: park it (not poison, not finished)."""


class _Lane:
    """One assigned partition: fetched-but-not-started messages and the offsets in flight."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.target = tp.topic[len(OCCURRENCE_TOPIC_PREFIX) :] if tp.topic.startswith(OCCURRENCE_TOPIC_PREFIX) else ""
        self.offsets = PartitionOffsets()
        self.pending: collections.deque[ConsumerRecord] = collections.deque()
        self.committed: int | None = None
        self.parked = 0  # records waiting for the binding view, out of ``pending`` but not finished
        self.paused = False
        self.revoked = False


class _Stoppable(Protocol):
    async def stop(self) -> None: ...


async def _or_stop(view: _Stoppable, starting: Awaitable[None]) -> None:
    """Await a view's start; if it fails, stop the view (closing what it opened) before the error goes on."""
    try:
        await starting
    except BaseException:
        await view.stop()
        raise


class ConsumerApp:
    """A consumer app: register handlers per target, then ``await app.run()``."""

    def __init__(
        self,
        config: ConsumerConfig,
        meter: metrics.Meter | None = None,
        tracer: trace.Tracer | None = None,
        hooks: ConsumerHooks | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.hooks = hooks or ConsumerHooks()
        self.handlers = HandlerRegistry(config.handler_timeout, config.concurrency, config.idle_timeout_for)
        self.stats = ConsumerStats()
        self._meter = meter or obs.get_meter("consumer")
        self.meters = ConsumerMetrics(self._meter)
        self.tracer = tracer or obs.get_tracer("consumer")
        self.view = ScheduleStateView()
        # The engine's answers to this group's `started` (the cancel barrier); None when it is off.
        self.grants: GrantWaiter | None = GrantWaiter(config.group, self._meter) if config.barrier else None
        self.bindings = TargetBindingView()
        self._stopping = asyncio.Event()
        self._aborting = asyncio.Event()
        self._pool: asyncpg.Pool | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._runner: AttemptRunner | None = None
        self._batch_runner: BatchRunner | None = None
        self._lanes: dict[TopicPartition, _Lane] = {}
        self._commit_turn = asyncio.Lock()  # commits and revocations never interleave
        self._committing: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._running_per_target: collections.Counter[str] = collections.Counter()
        self._in_flight_records = 0
        self._lag_recorded_at = 0.0
        self._fetched_at = 0.0  # the last fetch that returned records (or the consumer's start)
        self._stall_checked_at = 0.0
        self._background: list[asyncio.Task[None]] = []
        # Records found behind the binding view, by (topic, partition, offset); their unparking waits.
        self._behind: dict[tuple[str, int, int], _Behind] = {}
        self._parked: set[asyncio.Task[None]] = set()

    # -- registration ---------------------------------------------------------------------------

    def handler(
        self,
        target: str,
        *,
        timeout: float | None = None,
        concurrency: int | None = None,
        permanent_errors: tuple[type[BaseException], ...] = (),
        batch: int | None = None,
    ) -> Callable[[Any], Any]:
        """Register ``fn`` as the handler of ``target``'s occurrences.

        timeout: seconds before the handler fails transiently (default ``config.handler_timeout``);
            for a batch handler, the limit of one call.
        concurrency: handler calls of this target running at once in this process (default
            ``config.concurrency``).
        permanent_errors: the app's exception types that mean "never retry", besides ``PermanentError``.
        batch: make it a batch handler, ``async def fn(occurrences: list[Occurrence], conn)``, called with
            up to ``batch`` occurrences at once (those not applied before; see :mod:`consumers.batch_runner`).
            Let ``max_poll_records`` be at least ``batch`` so a partition's buffer can fill a batch.
        """
        validate_target(target)
        if batch is not None and batch < 1:
            raise ValueError("batch must be at least 1")
        registration = self.handlers.limits(timeout, concurrency, permanent_errors, batch)

        def register(fn: Any) -> Any:
            self.handlers.add(target, registration(fn))
            return fn

        return register

    def fallback_handler(
        self,
        fn: Handler,
        *,
        timeout: float | None = None,
        concurrency: int | None = None,
        permanent_errors: tuple[type[BaseException], ...] = (),
    ) -> Handler:
        """Register ``fn`` for every target without a handler of its own.

        The app then subscribes to all occurrence topics by pattern, including
        topics created after it started (found within ``metadata_refresh``).
        """
        self.handlers.fallback = self.handlers.limits(timeout, concurrency, permanent_errors)(fn)
        return fn

    @property
    def topics(self) -> list[str]:
        return self.handlers.topics

    @property
    def assigned_partitions(self) -> int:
        """Partitions this member owns now (0 before the group assigned any)."""
        return len(self._lanes)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Migrate the app database, create topics, read schedule states, join the group."""
        if not self.handlers:
            raise ValueError("register at least one handler with @app.handler(target) before run()")
        cfg = self.config
        pool = await self._until_done(
            "open the app database",
            lambda: create_pool(cfg.database_url, min_size=1, max_size=max(4, min(cfg.max_in_flight, 32) + 2)),
        )
        assert pool is not None
        self._pool = pool

        async def migrate() -> None:
            async with pool.acquire() as conn:
                await apply_migrations(conn, "consumer")

        await self._until_done("migrate the app database", migrate)
        await self._until_done(
            "create the topics",
            lambda: create_missing_topics(
                cfg.kafka_bootstrap,
                self.topics
                + [
                    DEAD_LETTER_TOPIC,
                    ATTEMPTS_TOPIC,
                    ATTEMPT_GRANTS_TOPIC,
                    SCHEDULE_STATES_TOPIC,
                    TARGET_BINDINGS_TOPIC,
                ],
                cfg.partitions,
                cfg.kafka_security,
            ),
        )
        self._producer = await self._until_done("start the producer", self._start_producer)
        # A view whose start failed part-way is stopped before it is started again (no consumer left open).
        await self._until_done(
            "read the schedule states",
            lambda: _or_stop(
                self.view, self.view.start(cfg.kafka_bootstrap, cfg.state_catch_up_timeout, cfg.kafka_security)
            ),
        )
        self._background.append(asyncio.create_task(self.view.follow(self._stopping), name="schedule-states"))
        await self._until_done(
            "read the target bindings",
            lambda: _or_stop(
                self.bindings, self.bindings.start(cfg.kafka_bootstrap, cfg.state_catch_up_timeout, cfg.kafka_security)
            ),
        )
        self._background.append(asyncio.create_task(self.bindings.follow(self._stopping), name="target-bindings"))
        if self.grants is not None:
            # At the partition's end before the first `started` is sent: no answer is missed, none older read.
            grants = self.grants
            await self._until_done(
                "read the attempt-grants topic",
                lambda: _or_stop(grants, grants.start(cfg.kafka_bootstrap, cfg.kafka_security)),
            )
            self._background.append(asyncio.create_task(grants.follow(), name="attempt-grants"))
        reporter = AttemptReporter(
            self._producer, cfg.report_timeout, cfg.report_attempts, cfg.credentials(), cfg.group_attempt_events
        )
        self._runner = AttemptRunner(
            cfg, self._pool, reporter, self.view, self.hooks, self.meters, self.stats, self._stopping, self.grants
        )
        self._batch_runner = BatchRunner(
            cfg, self._pool, reporter, self.view, self.hooks, self.meters, self.stats, self._stopping, self._runner
        )
        await self._until_done("join the consumer group", self._open_consumer)

    async def _start_producer(self) -> AIOKafkaProducer:
        """A started producer for attempt reports and dead letters (a failed start closes it)."""
        cfg = self.config
        producer = AIOKafkaProducer(
            bootstrap_servers=cfg.kafka_bootstrap,
            acks="all",
            enable_idempotence=False,
            request_timeout_ms=int(cfg.report_timeout * 1000),
            # Attempt reports and dead letters in lz4 batches, as the relay's occurrences: a burst's reports cost
            # the broker a fraction of uncompressed ones (docs/benchmarks.md, "Compressed batches").
            compression_type="lz4",
            # Report groups of concurrent handler batches share a partition's batch (schemas/produce_batches.py).
            max_batch_size=SHARED_BATCH_BYTES,
            **cfg.kafka_security.client_options(),
        )
        await start_client(producer, cfg.kafka_bootstrap, cfg.kafka_security)
        return producer

    async def _open_consumer(self) -> None:
        """Create the group's Kafka consumer, start it and subscribe (reading resumes at the committed
        offsets once the group assigns partitions)."""
        cfg = self.config
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.kafka_bootstrap,
            group_id=cfg.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=cfg.max_poll_records,
            fetch_max_wait_ms=max(1, round(cfg.fetch_wait * 1000)),
            metadata_max_age_ms=int(cfg.metadata_refresh * 1000),
            session_timeout_ms=int(cfg.session_timeout * 1000),
            heartbeat_interval_ms=int(cfg.heartbeat_interval * 1000),
            **cfg.kafka_security.client_options(),
        )
        await start_client(consumer, cfg.kafka_bootstrap, cfg.kafka_security)
        self._consumer = consumer
        self._fetched_at = time.monotonic()
        # A partition the group never committed starts at offset 0, not the broker's "earliest" (tansu's can
        # point past records: schemas.first_offset).
        listener = FromFirstOffset(consumer, assigned=self._assign, revoked=self._revoke)
        if self.handlers.fallback is not None:
            consumer.subscribe(pattern=re.escape(OCCURRENCE_TOPIC_PREFIX) + ".*", listener=listener)
        else:
            consumer.subscribe(self.topics, listener=listener)

    async def _until_done(self, step: str, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """Run a start-up step until it succeeds, retrying transient failures (a dropped connection, a
        database or broker restarting) with capped backoff: an app started while its database is
        unavailable waits for it instead of exiting. Anything else is a configuration error and raised."""
        delays = self.config.redelivery_delays()
        while True:
            try:
                return await attempt()
            except Exception as err:
                if not is_transient(err) or self._stopping.is_set():
                    raise
                delay = next(delays)
                log.warning(
                    "could not %s yet; retrying",
                    step,
                    extra={"action": "consumer.start_retry", "step": step, "error": repr(err), "backoff": delay},
                )
            await pause(self._stopping, delay)

    async def stop(self) -> None:
        """Leave the group and close connections (offsets were committed as work finished).

        Every resource is closed even if closing another one fails (a broker
        that is already gone must not leave the database pool open).
        """
        self._stopping.set()
        background, self._background = self._background, []
        # Parked records stay unfinished: their offsets were never committed, the next owner reads them again.
        background += list(self._parked)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        consumer, producer, pool = self._consumer, self._producer, self._pool
        self._consumer = self._producer = self._pool = None
        for close in (
            consumer and consumer.stop,
            self.view.stop,
            self.bindings.stop,
            self.grants.stop if self.grants is not None else None,
            producer and producer.stop,
            pool and pool.close,
        ):
            if close is None:
                continue
            try:
                await close()
            except Exception as err:  # noqa: BLE001 - shutdown continues whatever failed
                log.warning("error while closing", extra={"action": "consumer.close_failed", "error": repr(err)})

    def abort(self) -> None:
        """Stop at once: cancel running handlers (they roll back; their messages are redelivered)."""
        self._stopping.set()
        self._aborting.set()

    async def run(self, stop: asyncio.Event | None = None, max_applied: int | None = None) -> int:
        """Consume until ``stop`` is set (or ``max_applied`` occurrences were applied); return that count.

        Without ``stop`` the app handles SIGTERM and SIGINT itself: the first
        stops gracefully, the second aborts.
        """
        own_signals = stop is None
        stop = stop or asyncio.Event()
        if own_signals:
            self._install_signal_handlers(stop)
        try:
            await self.start()
            try:
                await self._consume(stop, max_applied)
            finally:
                self._stopping.set()
                await self._drain()
                await self._commit(final=True)
        except AUTHORIZATION_ERRORS as err:
            # An ACL refusal does not heal by waiting: stop with what to grant instead of retrying.
            log.error("refused by the broker's ACLs", extra={"action": "consumer.unauthorized", "error": repr(err)})
            raise refused(err) from err
        finally:
            await self.stop()
            if own_signals:
                self._remove_signal_handlers()
        return self.stats.applied

    def _install_signal_handlers(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                log.warning("second signal: aborting in-flight handlers", extra={"action": "consumer.abort"})
                self.abort()
            else:
                log.info("signal: finishing in-flight handlers, then stopping", extra={"action": "consumer.stop"})
                stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)

    def _remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

    # -- the fetch / dispatch / commit loop ---------------------------------------------------------

    async def _consume(self, stop: asyncio.Event, max_applied: int | None) -> None:
        stopper = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set() and not self._stopping.is_set():
                if max_applied is not None and self.stats.applied >= max_applied:
                    break
                consumer = self._consumer
                assert consumer is not None
                # Raced against stop: a group join can hold a fetch for seconds. With work in flight the poll
                # is short, so capacity a finished delivery frees is used at once.
                fetch = asyncio.create_task(consumer.getmany(timeout_ms=10 if self._tasks else 200))
                await asyncio.wait({fetch, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if not fetch.done():
                    fetch.cancel()
                    await asyncio.gather(fetch, return_exceptions=True)
                    break
                for tp, records in fetch.result().items():
                    if records:
                        self._fetched_at = time.monotonic()
                    lane = self._lanes.get(tp)
                    if lane is None or lane.revoked:
                        continue
                    for record in records:
                        lane.offsets.add(record.offset)
                        lane.pending.append(record)
                self._dispatch(max_applied)
                self._commit_soon()
                self._backpressure()
                self._record_lag()
                await self._restart_if_stalled()
        finally:
            stopper.cancel()
            if self._committing is not None:
                await asyncio.gather(self._committing, return_exceptions=True)

    async def _restart_if_stalled(self) -> None:
        """Recreate the Kafka consumer when it stalled: for ``stall_timeout`` (counted from the latest
        assignment at the earliest) no fetch returned a record while the app had nothing in flight, nothing
        queued and no partition paused, and an assigned partition has records past its position (asked of
        the broker, not taken from the last fetch)."""
        now = time.monotonic()
        timeout = self.config.stall_timeout
        if now - self._fetched_at < timeout or now - self._stall_checked_at < timeout / 4:
            return
        self._stall_checked_at = now
        if self._tasks or self._parked or any(lane.pending or lane.paused for lane in self._lanes.values()):
            return  # busy, or held back on purpose: not a stall
        consumer = self._consumer
        assert consumer is not None
        assigned = sorted(consumer.assignment())
        if not assigned:
            return
        try:
            async with asyncio.timeout(self.config.session_timeout):
                ends = await consumer.end_offsets(assigned)
                behind = [tp for tp in assigned if ends.get(tp, 0) > await consumer.position(tp)]
        except (KafkaError, TimeoutError) as err:
            log.info("stall check inconclusive", extra={"action": "consumer.stall_check", "error": repr(err)})
            return
        if behind:
            await self._restart_consumer(behind, now - self._fetched_at)

    async def _restart_consumer(self, behind: list[TopicPartition], idle: float) -> None:
        """Leave the group with the stalled consumer (committing what finished) and join with a new one."""
        log.warning(
            "the Kafka consumer fetched nothing while partitions have records to read; recreating it",
            extra={
                "action": "consumer.restart",
                "idle_s": round(idle, 1),
                "behind": [f"{tp.topic}[{tp.partition}]" for tp in behind],
            },
        )
        self.meters.restarts.add(1, {"reason": "stalled"})
        self.stats.consumer_restarts += 1
        old = self._consumer
        assert old is not None
        limit = self.config.session_timeout
        try:
            # What finished is committed first (nothing is in flight: the stall's condition).
            async with asyncio.timeout(limit):
                await self._revoke(list(self._lanes))
        except Exception as err:  # noqa: BLE001 - a wedged consumer may not commit; its offsets are re-read
            log.warning("could not commit before the restart", extra={"action": "consumer.restart", "error": repr(err)})
        if self._committing is not None and not self._committing.done():
            # A background commit stuck on the old consumer would hold every later one (one at a time).
            self._committing.cancel()
            await asyncio.gather(self._committing, return_exceptions=True)
        try:
            async with asyncio.timeout(limit):
                await old.stop()  # leaves the group
        except Exception as err:  # noqa: BLE001 - a wedged consumer may not even stop cleanly; replace it anyway
            log.warning(
                "the stalled consumer did not stop cleanly", extra={"action": "consumer.restart", "error": repr(err)}
            )
        # _revoke dropped the lanes unless it timed out: none of them may outlive the old consumer.
        for lane in self._lanes.values():
            lane.revoked = True
        self._lanes.clear()
        await self._until_done("rejoin the group", self._open_consumer)

    def _commit_soon(self) -> None:
        """Commit in the background (one commit at a time): fetching and dispatching never wait for the
        broker's answer to an offset commit."""
        previous = self._committing
        if previous is not None and not previous.done():
            return
        if previous is not None and not previous.cancelled() and previous.exception() is not None:
            log.warning(
                "offset commit failed; the next one carries the same offsets",
                extra={"action": "consumer.commit_failed", "error": repr(previous.exception())},
            )
        self._committing = asyncio.create_task(self._commit(), name="offset-commit")

    def _dispatch(self, max_applied: int | None) -> None:
        """Start pending messages, in offset order per partition, within the concurrency limits.

        A batch handler's call takes up to its batch size from every partition of its target, a few
        from each in turn, so one busy partition does not hold the others back.
        """
        progress = True
        while progress and len(self._tasks) < self.config.max_in_flight:
            progress = False
            for lane in list(self._lanes.values()):
                if not lane.pending or len(self._tasks) >= self.config.max_in_flight:
                    continue
                room = None if max_applied is None else max_applied - self.stats.applied - self._in_flight_records
                if room is not None and room <= 0:
                    return
                registration = self.handlers.for_target(lane.target)
                limit = registration.concurrency if registration else 1
                # A record that cannot be an occurrence runs no handler: it only goes to the dead-letter
                # topic, so it takes no handler slot (a flood of them never starves the target's handlers).
                poison = _undecodable(lane.pending[0])
                if not poison and self._running_per_target[lane.target] >= limit:
                    continue
                if poison:
                    self._start(lane.target, self._run_record(lane, lane.pending.popleft(), counted=False), False)
                elif registration is not None and registration.batch:
                    size = registration.batch if room is None else min(registration.batch, room)
                    self._start(lane.target, self._run_batch(lane.target, self._take(lane.target, size)))
                else:
                    self._start(lane.target, self._run_record(lane, lane.pending.popleft()))
                progress = True

    def _start(self, target: str, work: Any, counted: bool = True) -> None:
        if counted:
            self._running_per_target[target] += 1
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take(self, target: str, size: int) -> list[tuple[_Lane, ConsumerRecord]]:
        """Up to ``size`` pending records of ``target``'s partitions, round robin, each in offset order."""
        lanes = [lane for lane in self._lanes.values() if lane.target == target and lane.pending]
        taken: list[tuple[_Lane, ConsumerRecord]] = []
        while lanes and len(taken) < size:
            share = max(1, (size - len(taken)) // len(lanes))
            for lane in lanes:
                while lane.pending and share and len(taken) < size:
                    taken.append((lane, lane.pending.popleft()))
                    share -= 1
            lanes = [lane for lane in lanes if lane.pending]
        self._in_flight_records += len(taken)
        return taken

    async def _run_batch(self, target: str, taken: list[tuple[_Lane, ConsumerRecord]]) -> None:
        try:
            outcomes = await self.handle_batch([record for _, record in taken])
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a runtime bug must not kill the app; redelivered later
            outcomes = [Outcome.ABANDONED] * len(taken)
            log.exception(
                "batch delivery failed unexpectedly; it will be redelivered",
                extra={"action": "consumer.bug", "error": repr(err), "occurrences": len(taken)},
            )
        finally:
            self._running_per_target[target] -= 1
            self._in_flight_records -= len(taken)
        for (lane, record), outcome in zip(taken, outcomes, strict=True):
            if outcome is Outcome.PARKED:
                self._park(lane, record)
            elif outcome is not Outcome.ABANDONED:
                lane.offsets.finish(record.offset)

    async def _run_record(self, lane: _Lane, record: ConsumerRecord, counted: bool = True) -> None:
        try:
            outcome = await self.handle_record(record)
        except asyncio.CancelledError:
            outcome = Outcome.ABANDONED
            raise
        except Exception as err:  # noqa: BLE001 - a runtime bug must not kill the app; redelivered later
            outcome = Outcome.ABANDONED
            log.exception(
                "delivery failed unexpectedly; it will be redelivered",
                extra={"action": "consumer.bug", "error": repr(err), "offset": record.offset},
            )
        finally:
            if counted:
                self._running_per_target[lane.target] -= 1
        if outcome is Outcome.PARKED:
            self._park(lane, record)
        elif outcome is not Outcome.ABANDONED:
            lane.offsets.finish(record.offset)

    def _park(self, lane: _Lane, record: ConsumerRecord) -> None:
        """Set a record aside until the binding view decides it (or its bound passes); its offset stays
        unfinished, so nothing is committed past it, and it takes no handler slot meanwhile."""
        behind = self._behind.get((record.topic, record.partition, record.offset))
        if behind is None or lane.revoked:
            return
        lane.parked += 1
        task = asyncio.create_task(self._unpark_when_decided(lane, record, behind), name="binding-behind")
        self._parked.add(task)
        task.add_done_callback(self._parked.discard)

    async def _unpark_when_decided(self, lane: _Lane, record: ConsumerRecord, behind: _Behind) -> None:
        remaining = behind.since + self.config.binding_behind_timeout - asyncio.get_running_loop().time()
        try:
            await self.bindings.until_decided(behind.target, behind.tenant_id, behind.binding_version, remaining)
        finally:
            lane.parked -= 1
        if self._stopping.is_set() or lane.revoked or self._lanes.get(lane.tp) is not lane:
            return  # unfinished: read again from the committed offset by whoever owns the partition next
        # First in its partition's queue again: admitted, refused, or (past the bound) dead-lettered.
        lane.pending.appendleft(record)

    async def _commit(self, final: bool = False) -> None:
        """Commit, per partition, up to the lowest unfinished offset (only what moved).

        Takes turns with revocation: a commit that waited behind one re-reads the lanes afterwards, so
        it never names a partition this member gave up.
        """
        async with self._commit_turn:
            await self._commit_owned(final)

    async def _commit_owned(self, final: bool = False) -> None:
        if self._consumer is None:
            return
        assigned = self._consumer.assignment()
        offsets = {}
        for lane in self._lanes.values():
            position = lane.offsets.committable()
            if not lane.revoked and lane.tp in assigned and position is not None and position != lane.committed:
                offsets[lane.tp] = position
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as err:
            # The partition moved to another member during a rebalance; it will
            # redeliver from the last committed offset and the dedupe rows keep
            # the effects single.
            log.warning(
                "offset commit refused", extra={"action": "consumer.commit_failed", "error": repr(err), "final": final}
            )
            return
        for tp, position in offsets.items():
            owned = self._lanes.get(tp)
            if owned is not None:
                owned.committed = position

    def _backpressure(self) -> None:
        """Pause partitions whose buffer is full (fetching never outruns the handlers); resume the others."""
        consumer = self._consumer
        assert consumer is not None
        assigned = consumer.assignment()
        for lane in self._lanes.values():
            if lane.tp not in assigned:  # being revoked: the rebalance listener drops the lane
                continue
            registration = self.handlers.for_target(lane.target)
            full = len(lane.pending) + lane.parked >= max(
                self.config.max_poll_records, registration.batch or 0 if registration else 0
            )
            if full and not lane.paused:
                consumer.pause(lane.tp)
                lane.paused = True
            elif not full and lane.paused:
                consumer.resume(lane.tp)
                lane.paused = False

    def _record_lag(self) -> None:
        now = time.monotonic()
        if now - self._lag_recorded_at < 1.0 or self._consumer is None:
            return
        self._lag_recorded_at = now
        assigned = self._consumer.assignment()
        for lane in self._lanes.values():
            if lane.tp not in assigned:
                continue
            high = self._consumer.highwater(lane.tp)
            position = lane.offsets.committable() if lane.offsets.committable() is not None else lane.committed
            if high is not None and position is not None:
                self.meters.lag.set(max(high - position, 0), {"topic": lane.tp.topic, "partition": lane.tp.partition})

    async def _drain(self) -> None:
        """Let in-flight handlers finish for up to shutdown_grace (or until abort), then cancel the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_grace
        aborter = asyncio.create_task(self._aborting.wait())
        try:
            while self._tasks and not self._aborting.is_set():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    log.warning(
                        "shutdown grace over; aborting in-flight handlers",
                        extra={"action": "consumer.grace_over", "in_flight": len(self._tasks)},
                    )
                    break
                await asyncio.wait({*self._tasks, aborter}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborter.cancel()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _revoke(self, revoked: list[TopicPartition]) -> None:
        """Partitions are leaving this member: commit what finished, forget what did not start.

        One turn with the commits: nothing committed after this names the revoked partitions.
        """
        async with self._commit_turn:
            await self._commit_owned()
            for tp in revoked:
                lane = self._lanes.pop(tp, None)
                if lane is not None:
                    lane.revoked = True
                    lane.pending.clear()
            gone = {(tp.topic, tp.partition) for tp in revoked}
            for key in [key for key in self._behind if key[:2] in gone]:
                del self._behind[key]

    async def _assign(self, assigned: list[TopicPartition]) -> None:
        # A stall is counted from the latest assignment: until then there was nothing to fetch (a first join on
        # tansu takes half the session timeout, and the fetch under way then may wait out its fetch_wait).
        self._fetched_at = time.monotonic()
        for tp in assigned:
            self._lanes[tp] = _Lane(tp)  # reading resumes at the committed offset

    # -- one record -------------------------------------------------------------------------------

    async def handle_record(self, record: ConsumerRecord) -> Outcome:
        """Process one Kafka record completely: decode, dedupe, run the handler, report."""
        assert self._runner is not None, "call start() first"
        try:
            message, registration = await self._admit(record)
        except MalformedMessage as err:
            return await self._dead_letter(record, str(err), err.field)
        except _ViewBehind:
            return Outcome.PARKED
        context = obs.extract_trace_context(record.headers)
        with self.tracer.start_as_current_span(obs.SPAN_CONSUME, context=context) as span:
            span.set_attribute("chronoq.occurrence_id", str(message.occurrence_id))
            span.set_attribute("chronoq.tenant_id", message.tenant_id)
            span.set_attribute("chronoq.attempt", message.attempt)
            if registration.batch:
                assert self._batch_runner is not None
                (outcome,) = await self._batch_runner.deliver([message], registration)
            else:
                outcome = await self._runner.deliver(message, registration)
            span.set_attribute("chronoq.outcome", outcome.value)
        return outcome

    async def _admit(self, record: ConsumerRecord) -> tuple[OccurrenceMessage, HandlerRegistration]:
        """The record's message and the handler of its target, or MalformedMessage (the record is poison: it
        does not decode, no handler of this app serves its target, or its tenant may not run there), or
        _ViewBehind (the binding view has not read the record's binding version yet: park it)."""
        message = decode_occurrence(record.value, record.headers)
        registration = self.handlers.for_target(message.target)
        if registration is None:
            raise MalformedMessage(f"no handler for target {message.target!r} in this app", "target")
        await self._check_tenant(record, message)
        return message, registration

    async def _check_tenant(self, record: ConsumerRecord, message: OccurrenceMessage) -> None:
        """MalformedMessage unless the record's tenant may run on its target (checked on the record itself)."""
        topic = record.topic
        if topic.startswith(OCCURRENCE_TOPIC_PREFIX) and topic != occurrence_topic(message.target):
            # The topic decides which app reads a record; its body must not name another target.
            raise MalformedMessage(
                f"the record names target {message.target!r} but came from topic {topic!r}", "target"
            )
        allowed = self.config.tenants
        if allowed is not None and message.tenant_id not in allowed:
            raise MalformedMessage(
                f"tenant {message.tenant_id!r} is not among the tenants this app serves ({', '.join(sorted(allowed))})",
                "tenant_id",
            )
        appended_at_ms = record.timestamp if isinstance(record.timestamp, int) and record.timestamp >= 0 else None
        admission = await self.bindings.admit(
            message.target, message.tenant_id, message.binding_version, self.config.binding_wait, appended_at_ms
        )
        key = (record.topic, record.partition, record.offset)
        if admission is Admission.BEHIND:
            self._still_behind(key, message)
        behind = self._behind.pop(key, None)
        if behind is not None:
            self.meters.binding_behind.add(1, {"outcome": admission.value, "target": message.target})
        if admission is Admission.REFUSED:
            raise MalformedMessage(
                f"tenant {message.tenant_id!r} is not bound to target {message.target!r};"
                " an operator grants it with chronoq target grant",
                "tenant_id",
            )

    def _still_behind(self, key: tuple[str, int, int], message: OccurrenceMessage) -> None:
        """Raise _ViewBehind to park the record, or past ``binding_behind_timeout`` since it was first
        found behind, MalformedMessage (dead-lettered: the partition is never held for ever)."""
        assert message.binding_version is not None
        now = asyncio.get_running_loop().time()
        known = self.bindings.version_of(message.target)
        behind = self._behind.get(key)
        if behind is None:
            behind = self._behind[key] = _Behind(now, message.target, message.tenant_id, message.binding_version)
            self.stats.binding_behind += 1
            self.meters.binding_behind.add(1, {"outcome": "parked", "target": message.target})
            log.warning(
                "the target-binding view is behind this occurrence's binding version; retrying it in place",
                extra={
                    "action": "consumer.binding_behind",
                    "topic": key[0],
                    "partition": key[1],
                    "offset": key[2],
                    "target": message.target,
                    "tenant_id": message.tenant_id,
                    "binding_version": message.binding_version,
                    "view_version": known,
                },
            )
        limit = self.config.binding_behind_timeout
        if now - behind.since < limit:
            raise _ViewBehind
        del self._behind[key]
        self.meters.binding_behind.add(1, {"outcome": "expired", "target": message.target})
        raise MalformedMessage(
            f"binding view behind: tenant {message.tenant_id!r}'s occurrence was dispatched under version"
            f" {message.binding_version} of target {message.target!r}'s binding, but this app has read"
            f" {'no binding' if known is None else f'only version {known}'} after {limit:g} s"
            " (binding_behind_timeout); is the relay publishing chronoq.target-bindings?",
            "binding_version",
        )

    async def handle_batch(self, records: list[ConsumerRecord]) -> list[Outcome]:
        """Process the records of one batch handler's call completely; one outcome per record, in order.

        Undecodable records go to the dead-letter topic on their own; a record whose message names a
        target with a single handler is handled as a single delivery.
        """
        assert self._batch_runner is not None, "call start() first"
        outcomes: dict[int, Outcome] = {}
        groups: dict[int, tuple[HandlerRegistration, list[tuple[int, OccurrenceMessage]]]] = {}
        for index, record in enumerate(records):
            try:
                message, registration = await self._admit(record)
            except MalformedMessage as err:
                outcomes[index] = await self._dead_letter(record, str(err), err.field)
                continue
            except _ViewBehind:
                outcomes[index] = Outcome.PARKED
                continue
            if not registration.batch:
                outcomes[index] = await self.handle_record(record)
                continue
            groups.setdefault(id(registration), (registration, []))[1].append((index, message))
        for registration, members in groups.values():
            context = obs.extract_trace_context(records[members[0][0]].headers)
            with self.tracer.start_as_current_span(obs.SPAN_CONSUME, context=context) as span:
                span.set_attribute("chronoq.batch_size", len(members))
                span.set_attribute("chronoq.target", members[0][1].target)
                delivered = await self._batch_runner.deliver([m for _, m in members], registration)
                span.set_attribute("chronoq.applied", sum(o is Outcome.APPLIED for o in delivered))
            outcomes.update((index, outcome) for (index, _), outcome in zip(members, delivered, strict=True))
        return [outcomes[index] for index in range(len(records))]

    async def _dead_letter(self, record: ConsumerRecord, reason: str, field: str | None = None) -> Outcome:
        assert self._producer is not None
        delays = self.config.redelivery_delays()
        while True:
            try:
                await send_to_dead_letters(self._producer, record, self.config.group, reason)
                break
            except KafkaError as err:
                log.error(
                    "could not dead-letter a poison message; retrying",
                    extra={"action": "poison.dlq_failed", "error": repr(err)},
                )
            await pause(self._stopping, next(delays))
            if self._stopping.is_set():
                return Outcome.ABANDONED
        self.stats.dead_lettered += 1
        self.meters.poison.add(1, {"field": field or "value"})
        log.warning(
            "poison message sent to the dead-letter topic",
            extra={
                "action": "poison.dead_lettered",
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "reason": reason,
            },
        )
        return Outcome.DEAD_LETTERED

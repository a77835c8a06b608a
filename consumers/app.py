"""The consumer runtime: apply each occurrence's business effect at most once.

Delivery from Kafka is at least once. For every message the runtime opens a
transaction on the app's OWN database, inserts the dedupe row for
(consumer group, occurrence_id), calls the handler with the occurrence and
that open connection, and commits; only then does it commit the Kafka offset.

- A redelivered occurrence whose dedupe row exists is acknowledged without
  calling the handler (counted as a duplicate delivery).
- A failing handler rolls the transaction back — no effect, no dedupe row —
  and the runtime seeks back so the occurrence is delivered again.
- Killed after the database commit but before the offset commit, the message
  is redelivered and deduped. Offsets are never committed before the
  database transaction; auto-commit is off.
- A message that cannot be decoded (a poison message) goes to the dead-letter
  topic and its offset is committed, so it never blocks the partition.

The app needs only Kafka and its own database, never the engine's.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import ConsumerRecord
from opentelemetry import metrics, trace

from consumers.dead_letters import send_to_dead_letters
from consumers.occurrence import Occurrence
from schemas import observability as obs
from schemas.clock import pause
from schemas.connections import create_pool
from schemas.messages import MalformedMessage, OccurrenceMessage, decode_occurrence
from schemas.migrations import apply_migrations
from schemas.queries import load_queries
from schemas.topics import (
    DEAD_LETTER_TOPIC,
    DEFAULT_PARTITIONS,
    OCCURRENCE_TOPIC_PREFIX,
    ensure_topics,
    occurrence_topic,
    validate_target,
)

SQL = load_queries("consumer")
log = logging.getLogger("chronoq.consumer")

Handler = Callable[[Occurrence, asyncpg.Connection], Awaitable[None]]


class Outcome(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    DEAD_LETTERED = "dead_lettered"
    REDELIVER = "redeliver"


@dataclass
class ConsumerStats:
    """Counts since start: what happened to the records this app processed."""

    applied: int = 0
    duplicates: int = 0
    failures: int = 0
    dead_lettered: int = 0


@dataclass(frozen=True)
class ConsumerConfig:
    """group: Kafka consumer group; also the dedupe scope (one effect per group).
    kafka_bootstrap: "host:port[,host:port]".
    database_url: the app's own PostgreSQL (holds the dedupe table and the effects).
    max_poll_records: messages fetched per poll (default 100).
    redelivery_backoff / redelivery_backoff_max: seconds before a failed
        occurrence is delivered again, doubling up to the maximum.
    partitions: partitions of occurrence topics this app creates if missing.
    metadata_refresh: seconds between metadata refreshes (how soon a pattern
        subscription sees a new target's topic).
    session_timeout / heartbeat_interval: group membership timing (s). A dead
        member's partitions move after session_timeout. On the embedded tansu
        broker a group's first join also takes about half the session timeout
        and a member that left still counts until its session expires, so
        short-lived consumers there use a short session (see docs/broker.md).
    """

    group: str
    kafka_bootstrap: str
    database_url: str
    max_poll_records: int = 100
    redelivery_backoff: float = 0.2
    redelivery_backoff_max: float = 10.0
    partitions: int = DEFAULT_PARTITIONS
    metadata_refresh: float = 5.0
    session_timeout: float = 10.0
    heartbeat_interval: float = 3.0


class ConsumerApp:
    """A consumer app: register handlers per target, then ``await app.run()``."""

    def __init__(self, config: ConsumerConfig, meter: metrics.Meter | None = None,
                 tracer: trace.Tracer | None = None) -> None:
        self.config = config
        self._handlers: dict[str, Handler] = {}
        self._fallback: Handler | None = None
        self.stats = ConsumerStats()
        meter = meter or obs.get_meter("consumer")
        self.tracer = tracer or obs.get_tracer("consumer")
        self._applied_counter = meter.create_counter(obs.OCCURRENCES_APPLIED, unit="1")
        self._duplicates = meter.create_counter(obs.DUPLICATE_DELIVERIES, unit="1")
        self._failures = meter.create_counter(obs.HANDLER_FAILURES, unit="1")
        self._poison = meter.create_counter(obs.POISON_MESSAGES, unit="1")
        self._duration = meter.create_histogram(obs.HANDLER_DURATION, unit="s")
        self._pool: asyncpg.Pool | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._backoff = config.redelivery_backoff

    def handler(self, target: str) -> Callable[[Handler], Handler]:
        """Register ``fn`` as the handler of ``target``'s occurrences."""
        validate_target(target)

        def register(fn: Handler) -> Handler:
            if target in self._handlers:
                raise ValueError(f"target {target!r} already has a handler")
            self._handlers[target] = fn
            return fn

        return register

    def fallback_handler(self, fn: Handler) -> Handler:
        """Register ``fn`` for every target without a handler of its own.

        The app then subscribes to all occurrence topics by pattern, including
        topics created after it started (found within ``metadata_refresh``).
        """
        self._fallback = fn
        return fn

    @property
    def topics(self) -> list[str]:
        return sorted(occurrence_topic(t) for t in self._handlers)

    def _handler_for(self, target: str) -> Handler | None:
        return self._handlers.get(target, self._fallback)

    async def start(self) -> None:
        if not self._handlers and self._fallback is None:
            raise ValueError("register at least one handler with @app.handler(target) before run()")
        cfg = self.config
        self._pool = await create_pool(cfg.database_url, min_size=1, max_size=4)
        async with self._pool.acquire() as conn:
            await apply_migrations(conn, "consumer")
        admin = AIOKafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
        await admin.start()
        try:
            await ensure_topics(admin, self.topics + [DEAD_LETTER_TOPIC], cfg.partitions)
        finally:
            await admin.close()
        self._producer = AIOKafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all",
                                          enable_idempotence=False)
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.kafka_bootstrap, group_id=cfg.group,
            enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=cfg.max_poll_records,
            metadata_max_age_ms=int(cfg.metadata_refresh * 1000),
            session_timeout_ms=int(cfg.session_timeout * 1000),
            heartbeat_interval_ms=int(cfg.heartbeat_interval * 1000),
        )
        await self._consumer.start()
        if self._fallback is not None:
            self._consumer.subscribe(pattern=re.escape(OCCURRENCE_TOPIC_PREFIX) + ".*")
        else:
            self._consumer.subscribe(self.topics)

    async def stop(self) -> None:
        """Leave the group and close connections (offsets were committed as work finished).

        Every resource is closed even if closing another one fails (a broker
        that is already gone must not leave the database pool open).
        """
        consumer, producer, pool = self._consumer, self._producer, self._pool
        self._consumer = self._producer = self._pool = None
        for close in (consumer and consumer.stop, producer and producer.stop, pool and pool.close):
            if close is None:
                continue
            try:
                await close()
            except Exception as err:  # noqa: BLE001 - shutdown continues whatever failed
                log.warning("error while closing", extra={"action": "consumer.close_failed", "error": repr(err)})

    async def run(self, stop: asyncio.Event | None = None, max_applied: int | None = None) -> int:
        """Consume until ``stop`` is set or ``max_applied`` occurrences were applied; return that count."""
        stop = stop or asyncio.Event()
        await self.start()
        try:
            while not stop.is_set() and (max_applied is None or self.stats.applied < max_applied):
                assert self._consumer is not None
                batches = await self._consumer.getmany(timeout_ms=200)
                for tp, records in batches.items():
                    await self._process_partition(tp, records, stop, max_applied)
                    if max_applied is not None and self.stats.applied >= max_applied:
                        break
        finally:
            await self.stop()
        return self.stats.applied

    async def _process_partition(self, tp: TopicPartition, records: list[ConsumerRecord], stop: asyncio.Event,
                                 max_applied: int | None) -> None:
        assert self._consumer is not None
        next_offset: int | None = None
        for record in records:
            if stop.is_set() or (max_applied is not None and self.stats.applied >= max_applied):
                # Not processed: rewind so this member (or the next owner) reads it again.
                self._consumer.seek(tp, record.offset)
                break
            outcome = await self.handle_record(record)
            if outcome is Outcome.REDELIVER:
                self._consumer.seek(tp, record.offset)
                await pause(stop, self._backoff)
                self._backoff = min(self._backoff * 2, self.config.redelivery_backoff_max)
                break
            self._backoff = self.config.redelivery_backoff
            next_offset = record.offset + 1
        if next_offset is not None:
            try:
                await self._consumer.commit({tp: next_offset})
            except CommitFailedError as err:
                # The partition moved to another member during a rebalance; it will
                # redeliver from the last committed offset and the dedupe rows
                # keep the effects single.
                log.warning("offset commit refused after rebalance",
                            extra={"action": "consumer.commit_failed", "partition": tp.partition,
                                   "error": repr(err)})

    async def handle_record(self, record: ConsumerRecord) -> Outcome:
        """Apply one Kafka record: decode, dedupe, run the handler in one transaction."""
        try:
            message = decode_occurrence(record.value)
            handler = self._handler_for(message.target)
            if handler is None:
                raise MalformedMessage(f"no handler for target {message.target!r} in this app")
        except MalformedMessage as err:
            return await self._dead_letter(record, str(err))
        context = obs.extract_trace_context(record.headers)
        with self.tracer.start_as_current_span(obs.SPAN_CONSUME, context=context) as span:
            span.set_attribute("chronoq.occurrence_id", str(message.occurrence_id))
            span.set_attribute("chronoq.tenant_id", message.tenant_id)
            try:
                outcome = await self._apply(message, handler)
            except Exception as err:  # the handler's (or the app database's) failure
                self.stats.failures += 1
                self._failures.add(1, {"target": message.target})
                span.record_exception(err)
                log.warning("handler failed; occurrence will be delivered again",
                            extra={"action": "occurrence.failed", "occurrence_id": str(message.occurrence_id),
                                   "schedule_id": str(message.schedule_id), "tenant_id": message.tenant_id,
                                   "error": repr(err)})
                return Outcome.REDELIVER
            span.set_attribute("chronoq.outcome", outcome.value)
        return outcome

    async def _apply(self, message: OccurrenceMessage, handler: Handler) -> Outcome:
        assert self._pool is not None
        started = time.perf_counter()
        async with self._pool.acquire() as conn, conn.transaction():
            applied_at = await conn.fetchval(
                SQL["insert_dedupe"], self.config.group, message.occurrence_id, message.schedule_id,
                message.schedule_version, message.tenant_id, message.scheduled_for,
            )
            if applied_at is None:
                self.stats.duplicates += 1
                self._duplicates.add(1, {"target": message.target})
                log.info("duplicate delivery suppressed",
                         extra={"action": "occurrence.duplicate", "occurrence_id": str(message.occurrence_id)})
                return Outcome.DUPLICATE
            await handler(Occurrence.from_message(message, applied_at), conn)
        self.stats.applied += 1
        self._applied_counter.add(1, {"target": message.target})
        self._duration.record(time.perf_counter() - started, {"target": message.target})
        return Outcome.APPLIED

    async def _dead_letter(self, record: ConsumerRecord, reason: str) -> Outcome:
        assert self._producer is not None
        try:
            await send_to_dead_letters(self._producer, record, self.config.group, reason)
        except KafkaError as err:
            log.error("could not dead-letter a poison message; will retry",
                      extra={"action": "poison.dlq_failed", "error": repr(err)})
            return Outcome.REDELIVER
        self.stats.dead_lettered += 1
        self._poison.add(1)
        log.warning("poison message sent to the dead-letter topic",
                    extra={"action": "poison.dead_lettered", "topic": record.topic,
                           "partition": record.partition, "offset": record.offset, "reason": reason})
        return Outcome.DEAD_LETTERED

"""The attempt processor: consume ``chronoq.attempts`` and apply each event through the ledger.

Events are applied in order, a batch per transaction and each event in its own
savepoint (:mod:`engine.loops.attempt_ledger` decides what each one does).
Everything an event changes is written in that transaction; the Kafka offset
is committed after it, so a crash in between re-applies events, which are
idempotent. An event that fails on a database constraint is logged and
skipped, never blocking its partition; an undecodable record is counted as
poison and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from opentelemetry import metrics, trace

from engine.loops.attempt_ledger import SQL, AttemptLedger, AttemptMetrics, AttemptStats, Verdict
from schemas import observability as obs
from schemas.attempt_events import AttemptEvent, decode_attempt_event
from schemas.clock import Clock, DatabaseClock, pause
from schemas.messages import MalformedMessage
from schemas.topics import ATTEMPTS_TOPIC, DEFAULT_PARTITIONS, create_missing_topics

log = logging.getLogger("chronoq.attempts")


@dataclass(frozen=True)
class AttemptProcessorConfig:
    """group: the engine's consumer group on the attempts topic (engine nodes share the partitions). Default:
        ``chronoq-engine-attempts.<engine database name>``, so the engines of one database share one group
        and engines of different databases (tests, staging) on one broker never take each other's events.
    session_timeout / heartbeat_interval: group membership timing (s); the embedded broker's first
        join takes about half the session timeout (docs/broker.md).
    max_poll_records: events applied per transaction.
    partitions: of the attempts topic, if this processor creates it.
    error_backoff: seconds to wait after a failed batch before reading it again.
    """

    group: str | None = None
    session_timeout: float = 10.0
    heartbeat_interval: float = 3.0
    max_poll_records: int = 500
    partitions: int = DEFAULT_PARTITIONS
    error_backoff: float = 1.0

    def validate(self) -> None:
        if self.heartbeat_interval >= self.session_timeout:
            raise ValueError("heartbeat_interval must be shorter than session_timeout")
        if self.max_poll_records < 1:
            raise ValueError("max_poll_records must be at least 1")


class AttemptProcessor:
    """Reads ``chronoq.attempts`` and applies each event in the engine database."""

    def __init__(self, pool: asyncpg.Pool, kafka_bootstrap: str | None = None,
                 config: AttemptProcessorConfig | None = None, clock: Clock | None = None,
                 rng: random.Random | None = None, meter: metrics.Meter | None = None,
                 tracer: trace.Tracer | None = None) -> None:
        self.pool = pool
        self.kafka_bootstrap = kafka_bootstrap
        self.config = config or AttemptProcessorConfig()
        self.config.validate()
        self.clock = clock or DatabaseClock()
        self.stats = AttemptStats()
        self.meters = AttemptMetrics(meter or obs.get_meter("engine"))
        self.tracer = tracer or obs.get_tracer("engine")
        self.ledger = AttemptLedger(self.clock, rng or random.Random(), self.meters, self.stats)

    async def apply_events(self, batch: Sequence[AttemptEvent]) -> list[Verdict]:
        """Apply events in order, in one transaction; each event is all-or-nothing (a savepoint)."""
        verdicts: list[Verdict] = []
        with self.tracer.start_as_current_span(obs.SPAN_ATTEMPT_EVENTS) as span:
            span.set_attribute("chronoq.events", len(batch))
            async with self.pool.acquire() as conn, conn.transaction():
                now: datetime = await conn.fetchval(SQL["current_instant"], self.clock.now())
                for event in batch:
                    try:
                        async with conn.transaction():
                            verdict = await self.ledger.apply(conn, event, now)
                    except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError):
                        raise
                    except asyncpg.PostgresError as err:
                        # A bug or a constraint this event violates: do not let it block the partition.
                        log.error("attempt event could not be applied; skipped",
                                  extra={"action": "attempt.apply_failed", "occurrence_id": str(event.occurrence_id),
                                         "event": event.event, "error": repr(err)})
                        verdict = Verdict.IGNORED
                    verdicts.append(verdict)
        for event, verdict in zip(batch, verdicts):
            self.stats.count(verdict)
            self.ledger.fenced(event, verdict)
        return verdicts

    async def run(self, stop: asyncio.Event) -> None:
        """Consume attempt events until ``stop`` is set; the offset is committed after the database."""
        if self.kafka_bootstrap is None:
            raise ValueError("AttemptProcessor.run needs kafka_bootstrap")
        cfg = self.config
        await create_missing_topics(self.kafka_bootstrap, [ATTEMPTS_TOPIC], cfg.partitions)
        group = cfg.group or f"chronoq-engine-attempts.{await self.pool.fetchval(SQL['current_database'])}"
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.kafka_bootstrap, group_id=group,
            enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=cfg.max_poll_records,
            session_timeout_ms=int(cfg.session_timeout * 1000),
            heartbeat_interval_ms=int(cfg.heartbeat_interval * 1000),
        )
        await consumer.start()
        consumer.subscribe([ATTEMPTS_TOPIC])   # after start: start() with topics waits for the first join
        stopped = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                # A group's first join can take seconds: never make shutdown wait for it.
                fetch = asyncio.create_task(consumer.getmany(timeout_ms=200))
                await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not fetch.done():
                    fetch.cancel()
                    await asyncio.gather(fetch, return_exceptions=True)
                    break
                for tp, records in fetch.result().items():
                    if not await self._apply_records(consumer, tp, records, stop):
                        break
        finally:
            stopped.cancel()
            await consumer.stop()

    async def _apply_records(self, consumer: AIOKafkaConsumer, tp: TopicPartition, records: list[Any],
                             stop: asyncio.Event) -> bool:
        batch: list[AttemptEvent] = []
        for record in records:
            try:
                batch.append(decode_attempt_event(record.value))
            except MalformedMessage as err:
                self.stats.poison += 1
                self.meters.poison.add(1, {"topic": ATTEMPTS_TOPIC})
                log.error("undecodable attempt event skipped",
                          extra={"action": "attempt.poison", "partition": tp.partition, "offset": record.offset,
                                 "error": str(err)})
        try:
            if batch:
                await self.apply_events(batch)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as err:
            log.error("applying attempt events failed; will read them again",
                      extra={"action": "attempt.batch_failed", "error": repr(err)})
            consumer.seek(tp, records[0].offset)
            await pause(stop, self.config.error_backoff)
            return False
        try:
            await consumer.commit({tp: records[-1].offset + 1})
        except (CommitFailedError, KafkaError) as err:
            log.warning("attempt offset commit refused (rebalance); events will be re-applied, idempotently",
                        extra={"action": "attempt.commit_failed", "error": repr(err)})
        return True

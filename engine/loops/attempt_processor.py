"""The attempt processor: consume ``chronoq.attempts`` and apply each event through the ledger.

Events are applied in order, a batch per transaction and each event in its own
savepoint (:mod:`engine.loops.attempt_ledger` decides what each one does).
Everything an event changes is written in that transaction; the Kafka offset
is committed after it, so a crash in between re-applies events, which are
idempotent. Every event is first authenticated
(:mod:`engine.loops.attempt_authentication`): one not signed by the consumer
side of its occurrence's target, when that target has a credential, is
rejected, counted (``chronoq.attempt_events_rejected``) and changes nothing.
An event that fails on a database constraint is logged and skipped, never
blocking its partition; an undecodable record is counted as poison and
skipped. Joining, offsets, backoff and the summary line are the Kafka
processor skeleton's (:mod:`engine.loops.kafka_processor`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg
from aiokafka.structs import ConsumerRecord
from opentelemetry import metrics, trace

from engine.loops.attempt_authentication import ReceivedEvent, Rejection, authenticate
from engine.loops.attempt_ledger import AttemptLedger, Verdict
from engine.loops.attempt_outcomes import AttemptMetrics, AttemptStats
from engine.loops.kafka_processor import KafkaLoopSettings, KafkaProcessorLoop
from engine.loops.reporting import SUMMARY_EVERY
from schemas import observability as obs
from schemas.attempt_credentials import signed_by
from schemas.attempt_events import AttemptEvent, decode_attempt_event
from schemas.clock import Clock, DatabaseClock
from schemas.error_classification import is_transient
from schemas.kafka_security import PLAINTEXT, KafkaSecurity
from schemas.messages import MalformedMessage
from schemas.queries import QUERIES
from schemas.topics import ATTEMPTS_TOPIC, DEFAULT_PARTITIONS

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

    def __init__(
        self,
        pool: asyncpg.Pool,
        kafka_bootstrap: str | None = None,
        config: AttemptProcessorConfig | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        meter: metrics.Meter | None = None,
        tracer: trace.Tracer | None = None,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.pool = pool
        self.kafka_bootstrap = kafka_bootstrap
        self.security = security
        self.config = config or AttemptProcessorConfig()
        self.config.validate()
        self.clock = clock or DatabaseClock()
        self.stats = AttemptStats()
        self.meters = AttemptMetrics(meter or obs.get_meter("engine"))
        self.tracer = tracer or obs.get_tracer("engine")
        self.ledger = AttemptLedger(self.clock, rng or random.Random(), self.meters, self.stats)
        self.rejections: Counter[str] = Counter()
        self._rejected = (meter or obs.get_meter("engine")).create_counter(
            obs.ATTEMPT_EVENTS_REJECTED, unit="1", description="attempt events not authenticated: not applied"
        )

    async def apply_events(self, batch: Sequence[AttemptEvent | ReceivedEvent]) -> list[Verdict]:
        """Apply events in order, in one transaction; each event is all-or-nothing (a savepoint).

        An event is applied only if it is authenticated (a bare AttemptEvent counts as unsigned):
        any other is REJECTED, counted and logged, and changes nothing.

        A transient error (the database is away, a deadlock) fails the whole batch, which is read
        again; any other error fails only its event, which is logged, counted as poison and skipped
        so it never blocks the partition.
        """
        verdicts: list[Verdict] = []
        rejected: list[tuple[Rejection, ReceivedEvent]] = []
        with self.tracer.start_as_current_span(obs.SPAN_ATTEMPT_EVENTS) as span:
            span.set_attribute("chronoq.events", len(batch))
            async with self.pool.acquire() as conn, conn.transaction():
                now: datetime = await conn.fetchval(*QUERIES.current_instant(now=self.clock.now()))
                received_batch = [item if isinstance(item, ReceivedEvent) else ReceivedEvent(item) for item in batch]
                judged = await authenticate(conn, received_batch, now)
                for received, rejection in zip(received_batch, judged, strict=True):
                    event = received.event
                    try:
                        async with conn.transaction():
                            if rejection is None:
                                verdict = await self.ledger.apply(conn, event, now)
                            else:
                                verdict = Verdict.REJECTED
                                rejected.append((rejection, received))
                    except Exception as err:
                        if is_transient(err):
                            raise
                        # A value the database refuses, a constraint this event violates, or a bug: skip and
                        # count it, never block the partition on it.
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
                        verdict = Verdict.IGNORED
                    verdicts.append(verdict)
        for item, verdict in zip(batch, verdicts, strict=True):
            event = item.event if isinstance(item, ReceivedEvent) else item
            self.stats.count(verdict)
            self.ledger.fenced(event, verdict)
        for rejection, received in rejected:  # counted once the batch committed, like every verdict
            self._reject(rejection, received)
        return verdicts

    def _reject(self, rejection: Rejection, received: ReceivedEvent) -> None:
        """Count and log an event that was not authenticated (the record's content, never a secret)."""
        self.rejections[rejection.value] += 1
        self._rejected.add(1, {"reason": rejection.value})
        log.warning(
            "attempt event rejected: not authenticated as the consumer side of its target",
            extra={
                "action": "attempt.rejected",
                "reason": rejection.value,
                "occurrence_id": str(received.event.occurrence_id),
                "event": received.event.event,
                "credential_id": str(received.credential_id) if received.credential_id else None,
            },
        )

    async def handle_records(self, records: Sequence[ConsumerRecord]) -> dict[str, int]:
        """Decode a partition's records (undecodable ones are counted as poison and skipped) and apply them."""
        batch: list[ReceivedEvent] = []
        poison = rejected = 0
        for record in records:
            try:
                event = decode_attempt_event(record.value)
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
            try:
                claim = signed_by(record.headers)
            except MalformedMessage:
                rejected += 1  # garbled credential headers: decodable, but it proves nothing
                self._reject(Rejection.MALFORMED, ReceivedEvent(event))
                continue
            batch.append(ReceivedEvent(event, claim, record.key, record.value or b""))
        verdicts = await self.apply_events(batch) if batch else []
        counts = Counter(verdict.value for verdict in verdicts)
        counts[Verdict.REJECTED.value] += rejected
        return {**{k: v for k, v in counts.items() if v}, **({"poison": poison} if poison else {})}

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Consume attempt events until ``stop`` is set; the offset is committed after the database."""
        if self.kafka_bootstrap is None:
            raise ValueError("AttemptProcessor.run needs kafka_bootstrap")
        cfg = self.config
        group = cfg.group or f"chronoq-engine-attempts.{await self.pool.fetchval(*QUERIES.current_database())}"
        settings = KafkaLoopSettings(
            group,
            ATTEMPTS_TOPIC,
            (ATTEMPTS_TOPIC,),
            cfg.session_timeout,
            cfg.heartbeat_interval,
            cfg.max_poll_records,
            cfg.partitions,
            cfg.error_backoff,
            summary_every,
        )
        await KafkaProcessorLoop(
            "attempts", self.kafka_bootstrap, settings, self.handle_records, log, security=self.security
        ).run(stop)

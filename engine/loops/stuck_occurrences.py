"""The stuck-occurrence pass: every published occurrence reaches a final state, or is flagged.

An occurrence is ENQUEUED once the broker acknowledged it; from there only
attempt events move it (started, succeeded, failed...). If none arrives — the
event was lost, the consumer group never got the message, a consumer applied
the effect and died before reporting — it would stay ENQUEUED for good. This
pass finds occurrences ENQUEUED for longer than ``timeout`` and publishes them
again (a copy of their latest outbox message; for one that went out through
the ahead lane, whose row the settle pass deleted, the message rebuilt from
the occurrence and its schedule; same occurrence_id either way): a consumer
that already applied the effect finds its dedupe row and reports
``already_applied`` (SUCCEEDED); one that never got it runs it. A redelivery is
repeated after ``timeout * 2**n`` of silence, at most ``max_redeliveries``
times; then the occurrence is flagged (``stuck_occurrences.flagged_at``, the
``chronoq.stuck_occurrences`` gauge, a log line) for an operator, who finds it
in ``chronoq status`` and ``chronoq reconcile``.

The timeout must exceed what a healthy consumer group can lag behind (default
10 minutes): a redelivery of an occurrence still waiting in a slow group's
backlog costs a duplicate message, never a second effect.

Each pass also exports the attempt processor's lag on ``chronoq.attempts``
(committed offsets of the engine's group against the high watermarks) as the
``chronoq.attempt_events_lag`` gauge, read from the broker without touching the
attempt processor.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg
from opentelemetry import metrics

from engine.control.consumer_lag import read_consumer_lag
from engine.loops.attempt_outcomes import lock_occurrence, original_message
from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import SUMMARY_EVERY
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.error_classification import is_transient
from schemas.kafka_security import PLAINTEXT, KafkaSecurity
from schemas.queries import QUERIES
from schemas.topics import ATTEMPTS_TOPIC, occurrence_topic, schedule_key

log = logging.getLogger("chronoq.stuck_occurrences")


@dataclass(frozen=True)
class StuckOccurrencesConfig:
    """timeout: an occurrence ENQUEUED this long without an attempt event is stuck (default 10 min).
    max_redeliveries: publications before it is flagged (default 3; 0 flags at once).
    interval: seconds between passes (default 30).
    batch_size: stuck occurrences handled per transaction (default 500).
    lag_every: passes between readings of the attempt processor's lag (0: never).
    attempts_group: the attempt processor's consumer group (default: ``chronoq-engine-attempts.<database>``).
    """

    timeout: timedelta = timedelta(minutes=10)
    max_redeliveries: int = 3
    interval: float = 30.0
    batch_size: int = 500
    lag_every: int = 2
    attempts_group: str | None = None

    def validate(self) -> None:
        if self.timeout <= timedelta(0):
            raise ValueError("timeout must be positive")
        if self.max_redeliveries < 0:
            raise ValueError("max_redeliveries must not be negative")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")


@dataclass
class StuckReport:
    redelivered: int = 0
    flagged: int = 0
    resolved: int = 0


class StuckOccurrences:
    def __init__(
        self,
        pool: asyncpg.Pool,
        kafka_bootstrap: str | None = None,
        config: StuckOccurrencesConfig | None = None,
        clock: Clock | None = None,
        security: KafkaSecurity = PLAINTEXT,
        meter: metrics.Meter | None = None,
    ) -> None:
        self.pool = pool
        self.kafka_bootstrap = kafka_bootstrap
        self.security = security
        self.config = config or StuckOccurrencesConfig()
        self.config.validate()
        self.clock = clock or DatabaseClock()
        meter = meter or obs.get_meter("engine")
        self._redeliveries = meter.create_counter(
            obs.STUCK_REDELIVERIES, unit="1", description="stuck occurrences published again"
        )
        self._stuck = meter.create_gauge(
            obs.STUCK_OCCURRENCES, unit="1", description="stuck occurrences watched (status=watched) or flagged"
        )
        self._lag = meter.create_gauge(obs.ATTEMPT_EVENTS_LAG, unit="1", description=obs.ATTEMPT_EVENTS_LAG_DESCRIPTION)
        self._passes = 0

    async def run_once(self) -> StuckReport:
        """Redeliver or flag one batch of stuck occurrences; resolve those that moved on."""
        cfg = self.config
        report = StuckReport()
        async with self.pool.acquire() as conn, conn.transaction():
            now = await conn.fetchval(*QUERIES.current_instant(now=self.clock.now()))
            report.resolved = await conn.fetchval(*QUERIES.resolve_stuck_occurrences(now=now))
            stuck = await conn.fetch(
                *QUERIES.claim_stuck_occurrences(now=now, timeout_s=cfg.timeout.total_seconds(), limit=cfg.batch_size)
            )
            for row in stuck:
                ids = {
                    "occurrence_id": str(row["occurrence_id"]),
                    "schedule_id": str(row["schedule_id"]),
                    "tenant_id": row["tenant_id"],
                }
                redelivered = None
                if row["redeliveries"] < cfg.max_redeliveries:
                    redelivered = await conn.fetchval(
                        *QUERIES.redeliver_occurrence(occurrence_id=row["occurrence_id"], now=now)
                    )
                    if redelivered is None:
                        redelivered = await republish_rebuilt(conn, row["occurrence_id"], now)
                if redelivered is not None:
                    await conn.execute(*QUERIES.record_redelivery(occurrence_id=row["occurrence_id"], now=now))
                    report.redelivered += 1
                    log.warning(
                        "stuck occurrence published again",
                        extra={
                            "action": "occurrence.redelivered",
                            **ids,
                            "redelivery": row["redeliveries"] + 1,
                            "enqueued_since": row["updated_at"].isoformat(),
                        },
                    )
                else:
                    await conn.execute(*QUERIES.flag_stuck_occurrence(occurrence_id=row["occurrence_id"], now=now))
                    report.flagged += 1
                    log.error(
                        "stuck occurrence flagged: no attempt event after every redelivery",
                        extra={
                            "action": "occurrence.stuck",
                            **ids,
                            "redeliveries": row["redeliveries"],
                            "enqueued_since": row["updated_at"].isoformat(),
                        },
                    )
            counts = await conn.fetchrow(*QUERIES.stuck_counts())
        if report.redelivered:
            self._redeliveries.add(report.redelivered)
        self._stuck.set(counts["watched"], {"status": "watched"})
        self._stuck.set(counts["flagged"], {"status": "flagged"})
        return report

    async def record_attempt_lag(self) -> int | None:
        """Read the attempt processor's lag on chronoq.attempts from the broker and set the gauge."""
        if not self.kafka_bootstrap:
            return None
        group = (
            self.config.attempts_group
            or f"chronoq-engine-attempts.{await self.pool.fetchval(*QUERIES.current_database())}"
        )
        lags = [
            lag
            for lag in await read_consumer_lag(self.kafka_bootstrap, [group], security=self.security)
            if lag.topic == ATTEMPTS_TOPIC
        ]
        total = sum(lag.lag for lag in lags)
        self._lag.set(total, {"group": group})
        return total

    async def run_pass(self) -> PassOutcome:
        """One batch, and every ``lag_every`` passes the attempt processor's lag (a broker that cannot
        answer right now costs this reading only, never the pass)."""
        report = await self.run_once()
        if self.kafka_bootstrap and self.config.lag_every and self._passes % self.config.lag_every == 0:
            try:
                await self.record_attempt_lag()
            except Exception as err:  # noqa: BLE001 - classified right here
                if not is_transient(err):
                    raise
                log.warning(
                    "attempt processor lag unreadable",
                    extra={"action": "stuck_occurrences.lag_error", "error": repr(err)},
                )
        self._passes += 1
        handled = report.redelivered + report.flagged
        return PassOutcome(
            {"redelivered": report.redelivered, "flagged": report.flagged, "resolved": report.resolved},
            more=handled >= self.config.batch_size,
        )

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Pass every ``interval`` seconds until ``stop`` is set (the periodic skeleton: a failed pass is
        logged and retried after ``interval``)."""
        timing = LoopTiming(self.config.interval, error_backoff=self.config.interval, summary_every=summary_every)
        await PeriodicLoop("stuck-occurrences", self.run_pass, timing, log).run(stop)


async def republish_rebuilt(conn: asyncpg.Connection, occurrence_id: uuid.UUID, now: datetime) -> bool | None:
    """Queue the occurrence's message again when the outbox holds no copy to repeat: it went out through
    the ahead lane, whose row the settle pass deleted. The message is rebuilt from the occurrence and its
    schedule (as retries do, ``original_message``), same occurrence_id, due now. None if it is gone."""
    occ = await lock_occurrence(conn, occurrence_id)
    if occ is None:
        return None
    message = await original_message(conn, occ)
    await conn.execute(
        *QUERIES.insert_outbox_row(
            occurrence_id=occ.occurrence_id,
            tenant_id=occ.tenant_id,
            topic=occurrence_topic(occ.target),
            message_key=schedule_key(occ.schedule_id),
            message=message.encode(),
            due=now,
            now=now,
        )
    )
    return True

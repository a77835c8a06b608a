"""The lease reaper: time out RUNNING attempts whose lease expired, then retry or dead-letter them.

A worker holds its attempt's lease by heartbeating (the consumer runtime does
it automatically every ``lease_renew_interval``). When the engine's clock
passes ``lease_expires_at`` without a heartbeat — the worker crashed, was
paused, or lost the broker — the reaper closes the attempt as ``timed_out``
and applies the same retry rules as a transient failure (error class
``LeaseExpired``): RETRY_WAIT with a new delivery, or DEAD. The new delivery's
``started`` brings a new lease token, so anything the old worker reports
afterwards is fenced. Its effect, if it ever commits, is still protected by
the consumer's dedupe row.

Leases are judged by what the engine has read: a lease counts as expired only
if it ended before the attempt processor's progress (``attempt_event_progress``:
every attempt event produced before that instant is applied). During a burst
the heartbeats and outcomes of healthy attempts can wait in ``chronoq.attempts``
longer than a lease lasts; they are not missing, only unread, and the reaper
waits for them instead of timing those attempts out. How far it trails now is
the ``chronoq.reaper_deferred`` gauge.

Each pass locks up to ``batch_size`` expired occurrences with SKIP LOCKED (the
attempt processor and other reapers never wait for it) and decides each in
the same transaction. The loop also records the dead-letter list's size and
forgets old retry-budget windows.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

import asyncpg
from opentelemetry import metrics, trace

from engine.loops.attempt_outcomes import (
    LEASE_EXPIRED,
    AttemptMetrics,
    AttemptOutcomes,
    AttemptStats,
    Failure,
    lock_occurrence,
)
from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import SUMMARY_EVERY
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.reaper")


@dataclass(frozen=True)
class ReaperConfig:
    """interval: seconds between passes when nothing expired (default 1).
    batch_size: expired attempts handled per transaction (default 200).
    housekeeping_every: passes between DLQ-size gauges and retry-budget pruning.
    """

    interval: float = 1.0
    batch_size: int = 200
    housekeeping_every: int = 10


class Reaper:
    def __init__(
        self,
        pool: asyncpg.Pool,
        config: ReaperConfig | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        meter: metrics.Meter | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.pool = pool
        self.config = config or ReaperConfig()
        self.clock = clock or DatabaseClock()
        meter = meter or obs.get_meter("engine")
        self.tracer = tracer or obs.get_tracer("engine")
        self.stats = AttemptStats()
        self.meters = AttemptMetrics(meter)
        self._dlq_size = meter.create_gauge(obs.DLQ_SIZE, unit="1")
        self._deferred = meter.create_gauge(
            obs.REAPER_DEFERRED, unit="s", description="how far the reaper trails now: attempt events not applied"
        )
        self.outcomes = AttemptOutcomes(self.clock, rng or random.Random(), self.meters, self.stats)
        self._passes = 0
        self.dead_letters = 0

    async def run_once(self) -> int:
        """Time out one batch of expired leases; return how many."""
        with self.tracer.start_as_current_span(obs.SPAN_REAP) as span:
            async with self.pool.acquire() as conn, conn.transaction():
                now = await conn.fetchval(*QUERIES.current_instant(now=self.clock.now()))
                expired = await conn.fetch(*QUERIES.expired_leases(now=now, limit=self.config.batch_size))
                for row in expired:
                    occ = await lock_occurrence(conn, row["occurrence_id"])
                    assert occ is not None  # expired_leases locked it
                    expired_at = occ.lease_expires_at.isoformat() if occ.lease_expires_at else "?"
                    failure = Failure(LEASE_EXPIRED, f"no heartbeat since the lease expired at {expired_at}")
                    await self.outcomes.finish_attempt(conn, occ, occ.lease_token, "timed_out", now, failure)
                    outcome = await self.outcomes.conclude_failure(conn, occ, failure, now)
                    log.warning(
                        "attempt lease expired",
                        extra={
                            "action": "attempt.timed_out",
                            "occurrence_id": str(occ.occurrence_id),
                            "schedule_id": str(occ.schedule_id),
                            "tenant_id": occ.tenant_id,
                            "attempt": occ.attempt_count,
                            "lease_token": str(occ.lease_token),
                            "outcome": outcome.value,
                        },
                    )
            span.set_attribute("chronoq.timed_out", len(expired))
        if expired:
            self.meters.lease_timeouts.add(len(expired))
        return len(expired)

    async def housekeeping(self) -> int:
        """Record the DLQ size gauge and prune old retry-budget windows; return the DLQ size."""
        size = await self.pool.fetchval(*QUERIES.dead_letter_count())
        self._dlq_size.set(size)
        row = await self.pool.fetchrow(*QUERIES.reaping_horizon(now=self.clock.now()))
        self._deferred.set(max((row["now"] - row["horizon"]).total_seconds(), 0.0))
        await self.pool.execute(*QUERIES.prune_retry_usage(now=self.clock.now()))
        return size

    async def run_pass(self) -> PassOutcome:
        """Housekeeping every ``housekeeping_every`` passes, then one batch of expired leases."""
        if self._passes % self.config.housekeeping_every == 0:
            self.dead_letters = await self.housekeeping()
        self._passes += 1
        reaped = await self.run_once()
        return PassOutcome({"timed_out": reaped}, more=reaped >= self.config.batch_size)

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Reap until ``stop`` is set (the periodic skeleton: errors are logged and retried)."""
        timing = LoopTiming(self.config.interval, error_backoff=self.config.interval, summary_every=summary_every)
        await PeriodicLoop("reaper", self.run_pass, timing, log, gauges=self._gauges).run(stop)

    async def _gauges(self) -> dict[str, int]:
        return {"dead_letters": self.dead_letters}  # measured by the last housekeeping

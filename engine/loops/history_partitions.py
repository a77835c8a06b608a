"""Day partitions of the history tables, created ahead (migration 0016).

``occurrences`` and ``attempts`` are partitioned by UTC day of ``scheduled_for``. Every pass makes sure
the days from today to ``days_ahead`` days after it (UTC, by the injected clock) have their partitions;
anything outside them lands in the DEFAULT partition, so a row is never refused for want of a partition
(a clock far off, a backfill of an old day). Creating is idempotent and serialised by an advisory lock in
``chronoq_ensure_day_partitions``, so every engine node runs this loop and they never collide.

Guarantee: while any engine runs, the partition of a day exists before the materializer, whose horizon is
seconds to minutes, writes its first occurrence (two days of lead); a failed pass (a lock timeout behind a
long transaction) is logged and retried after ``error_backoff``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, timedelta

import asyncpg
from opentelemetry import metrics

from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import SUMMARY_EVERY
from schemas import observability as obs
from schemas.clock import Clock
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.history")


class HistoryPartitions:
    """Keeps the day partitions of the history tables created ahead (see the module docstring)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        clock: Clock,
        *,
        days_ahead: int = 2,
        interval: float = 600.0,
        meter: metrics.Meter | None = None,
    ) -> None:
        if days_ahead < 1:
            raise ValueError("days_ahead must be at least 1: tomorrow's partition must exist before midnight")
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.pool = pool
        self.clock = clock
        self.days_ahead = days_ahead
        self.interval = interval
        meter = meter or obs.get_meter("history")
        self._created = meter.create_counter(
            obs.HISTORY_PARTITIONS_CREATED, unit="1", description="day partitions of the history tables created"
        )

    async def run_once(self) -> int:
        """Create the missing partitions of today .. today + days_ahead; how many tables were created."""
        now = await self.pool.fetchval(*QUERIES.current_instant(now=self.clock.now()))  # the database's, if no clock
        today = now.astimezone(UTC).date()
        created: int = await self.pool.fetchval(
            *QUERIES.ensure_day_partitions(from_day=today, to_day=today + timedelta(days=self.days_ahead))
        )
        if created:
            self._created.add(created)
            log.info(
                "history day partitions created",
                extra={"action": "history.partitions_created", "count": created, "through": str(today)},
            )
        return created

    async def run_pass(self) -> PassOutcome:
        return PassOutcome({"created": await self.run_once()})

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Keep partitions created ahead until ``stop`` is set (errors are logged and retried)."""
        timing = LoopTiming(self.interval, error_backoff=30.0, summary_every=summary_every)
        await PeriodicLoop("history-partitions", self.run_pass, timing, log).run(stop)

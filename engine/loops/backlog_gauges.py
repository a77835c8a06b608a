"""The backlog gauges, recorded by a periodic pass: what is waiting, and for how long.

One read of the ``backlogs`` query every few seconds records, for every
tenant together: ``chronoq.due_backlog`` (active schedules whose cursor is in
the past), ``chronoq.outbox_backlog`` (due, unsent outbox rows),
``chronoq.queue_age`` (seconds the oldest of those has waited since it became
due), ``chronoq.overlap_held`` (rows the overlap gate holds) and
``chronoq.dlq_size``. The materializer, relay and reaper record the first
two and the last once per summary line too; this pass makes them fresh for a
scraper and is the only recorder of queue age. It runs in every engine and
API process (role ``gauges``).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

import asyncpg
from opentelemetry import metrics

from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import SUMMARY_EVERY
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.backlog_gauges")
INTERVAL = 5.0


class BacklogGauges:
    def __init__(
        self,
        pool: asyncpg.Pool,
        clock: Clock | None = None,
        meter: metrics.Meter | None = None,
        interval: float = INTERVAL,
    ) -> None:
        self.pool = pool
        self.clock = clock or DatabaseClock()
        self.interval = interval
        meter = meter or obs.get_meter("engine")
        self._due = meter.create_gauge(obs.DUE_BACKLOG, unit="1")
        self._outbox = meter.create_gauge(obs.OUTBOX_BACKLOG, unit="1")
        self._age = meter.create_gauge(obs.QUEUE_AGE, unit="s")
        self._held = meter.create_gauge(obs.OVERLAP_HELD, unit="1")
        self._dlq = meter.create_gauge(obs.DLQ_SIZE, unit="1")

    async def record(self, now: datetime | None = None) -> dict[str, float]:
        """Read the backlogs once and record them; return what was recorded."""
        row = await self.pool.fetchrow(*QUERIES.backlogs(tenant_id=None, now=now or self.clock.now()))
        values = {
            "due_backlog": row["due_schedules"],
            "outbox_backlog": row["outbox_due"],
            "queue_age": float(row["queue_age_s"] or 0.0),
            "overlap_held": row["overlap_held"],
            "dlq_size": row["dead"],
        }
        self._due.set(values["due_backlog"])
        self._outbox.set(values["outbox_backlog"])
        self._age.set(values["queue_age"])
        self._held.set(values["overlap_held"])
        self._dlq.set(values["dlq_size"])
        return values

    async def run_pass(self) -> PassOutcome:
        values = await self.record()
        return PassOutcome({"outbox_backlog": int(values["outbox_backlog"])})

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        timing = LoopTiming(self.interval, summary_every=summary_every)
        await PeriodicLoop("backlog-gauges", self.run_pass, timing, log).run(stop)

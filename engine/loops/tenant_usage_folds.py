"""Folding each tenant's quota-usage change log into its counter, for tenants that stop creating.

Triggers on ``schedules`` append every change of a schedule's liveness or rate to
``tenant_usage_changes`` (migration 0024), and a create or update folds its tenant's log under the tenant's
lock before its quota check. A tenant whose schedules complete or get cancelled without new creates would
otherwise grow its log for ever (the materializer alone appends a row per pass that completes any of
its one-time schedules), and every read of its usage (``GET /v1/tenant``, ``chronoq tenant usage``, the
console) sums the whole log. This loop folds the longest logs every ``interval`` seconds
(:func:`engine.control.quotas.fold_usage_changes`).

Guarantee: a tenant's log holds at most the changes of about one ``interval`` plus those of a pass that
found more than ``batch`` tenants with changes (the next pass runs at once); folding never changes what
the counter plus the log add up to, so a quota check or a read sees the same usage before and after.
Every engine node runs it: folds of one tenant are serialized by its row lock, taken SKIP LOCKED.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from opentelemetry import metrics

from engine.control.quotas import fold_usage_changes
from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import SUMMARY_EVERY
from schemas import observability as obs

log = logging.getLogger("chronoq.tenant_usage")


class TenantUsageFolds:
    """Folds tenants' usage change logs periodically (see the module docstring)."""

    def __init__(
        self, pool: asyncpg.Pool, *, interval: float = 30.0, batch: int = 200, meter: metrics.Meter | None = None
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.pool = pool
        self.interval = interval
        self.batch = batch
        meter = meter or obs.get_meter("tenant_usage")
        self._folded = meter.create_counter(
            obs.TENANT_USAGE_FOLDED,
            unit="1",
            description="quota-usage change rows folded into tenants' counters by the periodic fold",
        )

    async def run_pass(self) -> PassOutcome:
        folds = await fold_usage_changes(self.pool, self.batch)
        if folds.changes:
            self._folded.add(folds.changes)
        counts = {"tenants": folds.tenants, "changes": folds.changes, "busy": folds.busy}
        # A full batch may have left tenants: run again at once, unless every one was busy (next interval).
        return PassOutcome(counts, more=folds.full and folds.tenants > 0)

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Fold until ``stop`` is set (a failed pass is logged and retried after a backoff)."""
        timing = LoopTiming(self.interval, error_backoff=10.0, summary_every=summary_every)
        await PeriodicLoop("tenant-usage", self.run_pass, timing, log).run(stop)

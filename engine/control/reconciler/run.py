"""One reconcile run: expected slots, checks, optional effects check, recorded and exported.

Everything the run reads from the engine's database comes from one REPEATABLE
READ snapshot, so a schedule changed or an occurrence written while it runs
cannot make it contradict itself. It writes only its temporary tables and,
afterwards, one ``reconcile_runs`` row.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import asyncpg
from opentelemetry import metrics, trace

from engine.control.reconciler.calendar_filter import CalendarFilter
from engine.control.reconciler.checks import ReconcileOptions, run_checks
from engine.control.reconciler.effects import ConsumerCheck, check_effects
from engine.control.reconciler.report import ReconcileMetrics, ReconcileReport
from engine.control.reconciler.slots import SlotFilter, Window, build_expected_slots
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.connections import create_pool
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.reconciler")

#: Session settings of the reconciler's connections: the run's temporary tables stay in memory (this must be
#: set before a session first uses a temporary table, hence at connect time).
SESSION_SETTINGS = {"temp_buffers": "1GB"}


async def open_pool(database_url: str) -> asyncpg.Pool:
    """A one-connection pool for reconcile runs."""
    return await create_pool(database_url, min_size=1, max_size=1, server_settings=SESSION_SETTINGS)


async def reconcile(
    pool: asyncpg.Pool,
    window: Window,
    *,
    tenant_id: str | None = None,
    clock: Clock | None = None,
    options: ReconcileOptions | None = None,
    consumer: ConsumerCheck | None = None,
    slot_filter: SlotFilter | None = None,
    record: bool = True,
    meter: metrics.Meter | None = None,
    tracer: trace.Tracer | None = None,
) -> ReconcileReport:
    """Recompute what should exist in ``window`` and compare it with what does.

    ``clock`` gives the instant the run judges "now" by (pending and stuck
    depend on it); the database's clock when omitted. ``record`` stores the
    result in ``reconcile_runs``. The counts are also set as gauges.
    """
    options = options or ReconcileOptions()
    slot_filter = slot_filter if slot_filter is not None else CalendarFilter()
    clock = clock or DatabaseClock()
    tracer = tracer or obs.get_tracer("reconciler")
    began = time.perf_counter()
    with tracer.start_as_current_span(obs.SPAN_RECONCILE) as span:
        async with pool.acquire() as conn:
            async with conn.transaction(isolation="repeatable_read"):
                as_of = await conn.fetchval(*QUERIES.current_instant(now=clock.now()))
                report = ReconcileReport(window.start, window.end, tenant_id, as_of)
                await conn.execute(*QUERIES.reconcile_settings(work_mem=options.work_mem))
                totals = await build_expected_slots(conn, window, tenant_id, slot_filter, options.ahead_slack)
                archived = await conn.fetchrow(
                    *QUERIES.archived_in_window(window_from=window.start, window_to=window.end, tenant_id=tenant_id)
                )
                report.archived_before = archived["archived_before"]
                report.counts.update(
                    archived=archived["archived"],
                    schedules=totals.schedules,
                    versions=totals.versions,
                    cron_rules=totals.cron_rules,
                    rate_rules=totals.rate_rules,
                    filtered_versions=totals.filtered_versions,
                )
                await run_checks(conn, report, options)
                if consumer is not None:
                    await check_effects(
                        conn, report, consumer, window, options.stuck_after.total_seconds(), options.offenders
                    )
            report.duration_s = time.perf_counter() - began
            if record:
                report.run_id = await conn.fetchval(
                    *QUERIES.record_run(
                        started_at=as_of,
                        finished_at=as_of + timedelta(seconds=report.duration_s),
                        window_from=window.start,
                        window_to=window.end,
                        tenant_id=tenant_id,
                        clean=report.clean,
                        counts=report.counts,
                        offenders=[o.to_json() for o in report.offenders],
                        duration_s=report.duration_s,
                    )
                )
        span.set_attribute("chronoq.expected", report.counts.get("expected", 0))
        span.set_attribute("chronoq.clean", report.clean)
    ReconcileMetrics(meter).record(report)
    log.log(
        logging.INFO if report.clean else logging.WARNING,
        "reconcile finished",
        extra={
            "action": "reconcile.finished",
            "clean": report.clean,
            "run_id": report.run_id,
            **{
                name: report.counts.get(name, 0)
                for name in ("expected", "missing", "unexpected", "duplicate_slots", "policy_violations", "stuck")
            },
        },
    )
    return report

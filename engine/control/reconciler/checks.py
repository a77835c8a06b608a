"""What exists, compared with what should: the reconciler's checks, each one set-based query.

Reads the run's temporary tables (see :mod:`engine.control.reconciler.slots`) and
fills a :class:`ReconcileReport`: slots missing (per reason), occurrences
unexpected (per reason), duplicate slots, misfire policy violations,
occurrences not final and stuck, and occurrences per state. A slot that
exists in any state counts as present: MISSED, SKIPPED_OVERLAP and CANCELED
are accounted for without running, and SCHEDULED and ENQUEUED alike mean it
was materialized (a dispatch that settles ENQUEUED later changes nothing here).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from engine.control.reconciler.report import Offender, ReconcileReport
from schemas.queries import QUERIES

#: Final states of occurrences that did not run.
INERT = ("MISSED", "SKIPPED_OVERLAP", "CANCELED")
#: Missing-slot reasons that break the promise (pending and summarized do not).
MISSING_REASONS = ("lost", "superseded_unmaterialized")


@dataclass(frozen=True)
class ReconcileOptions:
    """offenders: how many offenders of each kind to list.
    stuck_after: an occurrence not final that has not changed state for this long is stuck.
    on_time_limit: the engine's cap on max_lateness for the policy check (None: max_lateness alone).
    lateness_tolerance: slack added to the lateness threshold of the policy check (the decision's
        instant and the row's created_at may differ by a transaction's duration).
    ahead_slack: versions that ended this long before the window still count as owners of slots in it
        (materialized ahead of the change; far more than any materializer horizon).
    work_mem: PostgreSQL memory per hash join or aggregate of the run (its transaction only).
    """

    offenders: int = 20
    stuck_after: timedelta = timedelta(minutes=10)
    on_time_limit: timedelta | None = None
    lateness_tolerance: timedelta = timedelta(seconds=1)
    ahead_slack: timedelta = timedelta(hours=1)
    work_mem: str = "256MB"


async def run_checks(conn: asyncpg.Connection, report: ReconcileReport, options: ReconcileOptions) -> None:
    counts = report.counts
    limit = options.offenders

    for row in await conn.fetch(*QUERIES.occurrence_states()):
        report.states[row["state"]] = row["occurrences"]
    origins = {row["origin"]: row["occurrences"] for row in await conn.fetch(*QUERIES.occurrence_origins())}
    counts.update(backfilled=origins.get("backfill", 0), manual=origins.get("manual", 0))

    await conn.execute(*QUERIES.compare_slots())
    await conn.execute(*QUERIES.analyze_anomalies())
    totals = await conn.fetchrow(*QUERIES.slot_totals())
    counts.update(
        expected=totals["expected"],
        present=totals["present"],
        optional=totals["optional"],
        excluded=totals["excluded"],
        uncertain=totals["uncertain"],
    )

    await conn.execute(*QUERIES.missing_slots())
    per_reason = {row["reason"]: row["slots"] for row in await conn.fetch(*QUERIES.missing_counts())}
    report.reasons["missing"] = per_reason
    counts["missing"] = sum(per_reason.get(reason, 0) for reason in MISSING_REASONS)
    counts["pending"] = per_reason.get("pending", 0)
    counts["summarized"] = per_reason.get("summarized", 0)
    counts["after_completion"] = per_reason.get("after_completion", 0)
    for row in await conn.fetch(*QUERIES.missing_offenders(limit=limit)):
        report.offenders.append(
            Offender(
                "missing", row["reason"], row["schedule_id"], row["scheduled_for"], row["tenant_id"], row["version"]
            )
        )

    await conn.execute(*QUERIES.unexpected_occurrences())
    per_reason = {row["reason"]: row["occurrences"] for row in await conn.fetch(*QUERIES.unexpected_counts())}
    report.reasons["unexpected"] = per_reason
    counts["unexpected"] = sum(per_reason.values())
    # Accounted for without running: MISSED, SKIPPED_OVERLAP and CANCELED occurrences that are not unexpected.
    unexpected_inert = sum(
        row["occurrences"] for row in await conn.fetch(*QUERIES.unexpected_states()) if row["state"] in INERT
    )
    counts["accounted"] = sum(report.states.get(state, 0) for state in INERT) - unexpected_inert
    for row in await conn.fetch(*QUERIES.unexpected_offenders(limit=limit)):
        report.offenders.append(
            Offender(
                "unexpected",
                row["reason"],
                row["schedule_id"],
                row["scheduled_for"],
                row["tenant_id"],
                row["schedule_version"],
                row["occurrence_id"],
                row["state"],
            )
        )

    rows = await conn.fetch(*QUERIES.duplicate_slots(limit=limit))
    counts["duplicate_slots"] = rows[0]["total"]
    for row in rows:
        if row["schedule_id"] is None:
            continue
        detail = ", ".join(
            f"v{v} {oid} {state}"
            for v, oid, state in zip(row["versions"], row["occurrence_ids"], row["states"], strict=True)
        )
        report.offenders.append(
            Offender(
                "duplicate_slot",
                f"{row['live']} occurrences may run",
                row["schedule_id"],
                row["scheduled_for"],
                row["tenant_id"],
                detail=detail,
            )
        )

    on_time_limit = options.on_time_limit.total_seconds() if options.on_time_limit is not None else None
    rows = await conn.fetch(
        *QUERIES.policy_violations(
            limit=limit, on_time_limit_s=on_time_limit, tolerance_s=options.lateness_tolerance.total_seconds()
        )
    )
    counts["policy_violations"] = rows[0]["total"]
    for row in rows:
        if row["schedule_id"] is None:
            continue
        report.offenders.append(
            Offender(
                "policy_violation",
                f"{row['misfire_policy']} enqueued {row['late_enqueued']} late (allows {row['allowed']})",
                row["schedule_id"],
                row["first_slot"],
                row["tenant_id"],
                row["schedule_version"],
                detail=f"decided at {row['created_at'].isoformat()}, late slots up to {row['last_slot'].isoformat()}",
            )
        )

    rows = await conn.fetch(
        *QUERIES.unfinished_occurrences(
            stuck_after_s=options.stuck_after.total_seconds(), now=report.as_of, limit=limit
        )
    )
    counts["unfinished"] = rows[0]["unfinished"]
    counts["stuck"] = rows[0]["total"]
    for row in rows:
        if row["occurrence_id"] is None:
            continue
        report.offenders.append(
            Offender(
                "stuck",
                f"{row['state']} since {row['updated_at'].isoformat()}",
                row["schedule_id"],
                row["scheduled_for"],
                row["tenant_id"],
                row["schedule_version"],
                row["occurrence_id"],
                row["state"],
            )
        )

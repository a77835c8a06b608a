"""Effects in a consumer app's database, compared with the engine's occurrences.

The consumer runtime writes a dedupe row in the transaction of each business
effect, so the dedupe table is the record of effects applied. Its rows of the
window are copied into the engine's run and checked for effects applied twice
(one slot under two occurrences by one group), for unknown occurrences, for
occurrences that were never to run (MISSED, SKIPPED_OVERLAP), for effects the
engine never learned of, and for SUCCEEDED occurrences without an effect.
Effects of occurrences the engine CANCELED are counted apart
(``effects_applied_after_cancel``) and do not make a run unclean: a pause,
update or cancel raced a consumer already applying an occurrence it had
received, the effect ran once, and the engine's record says CANCELED.

Order matters: the engine's snapshot is taken first and the consumer's rows
read afterwards. A consumer commits its effect before it reports success, so
every SUCCEEDED occurrence of the engine's snapshot already has its effect
among the rows read; the reverse direction tolerates recent work through the
``stuck_after`` age.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from engine.control.reconciler.report import Offender, ReconcileReport
from engine.control.reconciler.slots import Window
from schemas.connections import connect
from schemas.queries import CONSUMER_QUERIES, QUERIES

#: What the effects check counts (``effects_<name>``); all but applied_after_cancel make a run unclean.
PROBLEMS = (
    "applied_twice",
    "applied_unknown",
    "applied_not_to_run",
    "applied_after_cancel",
    "applied_unrecorded",
    "never_applied",
)


@dataclass(frozen=True)
class ConsumerCheck:
    """database_url: the consumer app's own database (its dedupe table).
    group: only this consumer group's effects (None: every group in that database).
    targets: the targets this consumer handles (None: every target it applied something of).
    """

    database_url: str
    group: str | None = None
    targets: tuple[str, ...] | None = None


async def read_effects(check: ConsumerCheck, window: Window, tenant_id: str | None) -> list[asyncpg.Record]:
    conn = await connect(check.database_url)
    try:
        return await conn.fetch(
            *CONSUMER_QUERIES.effects_in_window(
                window_from=window.start, window_to=window.end, tenant_id=tenant_id, group=check.group
            )
        )
    finally:
        await conn.close()


async def check_effects(
    conn: asyncpg.Connection,
    report: ReconcileReport,
    check: ConsumerCheck,
    window: Window,
    stuck_after_s: float,
    limit: int,
) -> None:
    """Copy the consumer's effects into the run and count the problems (``effects_*`` counts)."""
    effects = await read_effects(check, window, report.tenant_id)
    if effects:
        await conn.copy_records_to_table("rc_effects", records=[tuple(row) for row in effects])
    await conn.execute(*QUERIES.analyze_effects())
    totals = await conn.fetchrow(*QUERIES.effect_totals())
    report.counts["effects_checked"] = totals["effects"]
    report.counts["effects_groups"] = totals["groups"]
    for problem in PROBLEMS:
        report.counts[f"effects_{problem}"] = 0
    targets = list(check.targets) if check.targets else None
    problems = QUERIES.effect_problems(stuck_after_s=stuck_after_s, now=report.as_of, targets=targets, limit=limit)
    for row in await conn.fetch(*problems):
        report.counts[f"effects_{row['kind']}"] = row["total"]
        report.offenders.append(
            Offender(
                "effect",
                row["kind"],
                row["schedule_id"],
                row["scheduled_for"],
                occurrence_id=row["occurrence_id"],
                detail=row["detail"],
            )
        )

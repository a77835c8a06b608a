"""Cohort membership from the control plane's side: a create joins a cohort, a change leaves it first.

Guarantees (migration 0026; docs/dispatch.md "Cohorts"):

* ``claim_cohorts`` gives each schedule that may share a cursor (``engine.rules.cohorts.cohort_spec``) a cohort
  at its cursor, in the transaction that writes it (a create's insert; a materializer pass's advance of a
  schedule with its own cursor, which so joins, or joins again after a change), never waiting for a cohort
  another transaction holds (a pass, a member's change): it makes a new cohort instead. The schedule is
  written with the cohort and the cohort's fires so far (its base), so nothing is written twice.
* ``leave_cohort`` runs before any change of a schedule (the first statement of ``lock_for_change``): a member
  leaves with the cursor and runs it would have had alone, after any pass holding its cohort committed (a
  pass locks its cohorts before it reads their members), so the change's later statements see everything
  that pass wrote, and no later pass reads it as a member.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from engine.control.identifiers import as_uuid
from engine.records import Schedule
from engine.rules.cohorts import COHORT_CAP, CohortSpec, cohort_spec
from schemas.errors import NotFound
from schemas.queries import QUERIES


def cohort_spec_of(columns: Mapping[str, Any]) -> CohortSpec | None:
    """The cohort spec of a schedule given its schedules columns by name (None: it keeps its own cursor)."""
    return cohort_spec(
        kind=columns["kind"],
        expression=columns["expression"],
        time_zone=columns["time_zone"],
        dst_repeat=columns["dst_repeat"],
        dst_gap=columns["dst_gap"],
        anchor=columns["anchor"],
        misfire_policy=columns["misfire_policy"],
        max_lateness_s=columns["max_lateness_s"],
        end_at=columns["end_at"],
        calendar_id=columns.get("calendar_id"),
        max_runs=columns.get("max_runs"),
        overlap_policy=columns["overlap_policy"],
    )


async def claim_cohorts(
    conn: asyncpg.Connection,
    schedules: Sequence[tuple[str, int, CohortSpec | None, datetime | None]],
    now: datetime | None,
) -> list[tuple[uuid.UUID | None, int | None]]:
    """For schedules about to join a cohort (tenant, shard, cohort spec or None, cursor): each one's
    (cohort_id, cohort_base), or (None, None) for those that keep their own cursor. Call inside the
    transaction that writes them (a create's insert, a materializer pass's advance), before that write; it
    never waits for a cohort another transaction holds."""
    groups: dict[tuple[str, int, str, datetime], list[int]] = {}
    specs: dict[str, CohortSpec] = {}
    for index, (tenant, shard, spec, cursor) in enumerate(schedules):
        if spec is not None and cursor is not None:
            key = spec.key
            specs[key] = spec
            groups.setdefault((tenant, shard, key, cursor), []).append(index)
    out: list[tuple[uuid.UUID | None, int | None]] = [(None, None)] * len(schedules)
    if not groups:
        return out
    # A stable order: no two claimers take existing cohorts in opposite orders (SKIP LOCKED means they never
    # wait anyway; the order keeps what each one takes predictable).
    wanted = sorted(groups)
    fields = [specs[g[2]] for g in wanted]
    rows = await conn.fetch(
        *QUERIES.claim_cohorts(
            ordinals=list(range(len(wanted))),
            tenant_ids=[g[0] for g in wanted],
            shards=[g[1] for g in wanted],
            spec_keys=[g[2] for g in wanted],
            next_run_ats=[g[3] for g in wanted],
            counts=[len(groups[g]) for g in wanted],
            new_ids=[uuid.uuid4() for _ in wanted],
            kinds=[f.kind for f in fields],
            expressions=[f.expression for f in fields],
            time_zones=[f.time_zone for f in fields],
            dst_repeats=[f.dst_repeat for f in fields],
            dst_gaps=[f.dst_gap for f in fields],
            anchors=[f.anchor for f in fields],
            misfire_policies=[f.misfire_policy for f in fields],
            max_lateness_ss=[f.max_lateness_s for f in fields],
            cap=COHORT_CAP,
            now=now,
        )
    )
    for row in rows:
        for index in groups[wanted[row["ordinal"]]]:
            out[index] = (row["cohort_id"], row["fires"])
    return out


async def leave_cohort(conn: asyncpg.Connection, tenant_id: str, schedule_id: uuid.UUID, now: datetime | None) -> bool:
    """Take a schedule out of its cohort before changing it (a no-op for one with its own cursor). Returns
    whether it was a member."""
    left: bool = await conn.fetchval(*QUERIES.leave_cohort(schedule_id=schedule_id, tenant_id=tenant_id, now=now))
    return left


async def lock_for_change(
    conn: asyncpg.Connection, tenant_id: str, schedule_id: uuid.UUID | str, now: datetime | None
) -> Schedule:
    """A tenant's schedule out of any cohort and locked ``FOR UPDATE`` for a change (a lifecycle change, a
    backfill, a run now), in the caller's transaction: its row holds its own cursor and runs. NotFound for
    another tenant's or an unknown schedule."""
    schedule_id = as_uuid(schedule_id, "schedule")
    await leave_cohort(conn, tenant_id, schedule_id, now)
    row = await conn.fetchrow(*QUERIES.lock_schedule(schedule_id=schedule_id, tenant_id=tenant_id))
    if row is None:
        raise NotFound("schedule", schedule_id)
    return Schedule.from_row(row)

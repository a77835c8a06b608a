"""What should exist: every slot each schedule version produces in a window.

Recomputed from the version history (``schedule_versions``) and the time
contract alone, never from the materializer's code path or its cursor
decisions. The time contract is shared (``engine.rules.timing`` computes cron fires
and parses rate periods and one-time instants); applying it to a million
schedules is set-based:

* cron: fire instants are computed once per (expression, zone, DST options)
  over the window and joined in SQL to every version with that rule (its
  cursor and start/end bounds applied there);
* rate: ``anchor + k * period`` is plain arithmetic, done in SQL with
  ``generate_series`` per version, from the period the contract parses;
* once: the parsed instant.

A version owns the slots from its cursor (``next_run_at`` recorded with it) up
to the next change, except those from the next active version's cursor on (a
pause rewinds the cursor; the resume decides those slots itself). Slots it
produces after the change are optional: materialized ahead, they must have
been CANCELED by the change.

Calendars and exclusions plug in through :class:`SlotFilter`: versions whose
definition names one of its fields are computed one by one and the filter
decides which slots they keep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import asyncpg

from engine.rules import timing
from schemas.queries import QUERIES

_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class Window:
    """Slots with ``start <= scheduled_for < end`` (aware UTC)."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if value.tzinfo is None or value.utcoffset() is None:
                raise ValueError(f"window {name} must be an aware datetime, got {value!r}")
        if self.end <= self.start:
            raise ValueError(f"the window ends ({self.end.isoformat()}) before it starts ({self.start.isoformat()})")

    @property
    def fire_limit(self) -> int:
        """An upper bound on the cron fires of one rule in the window (one per minute, two in a fold)."""
        return int((self.end - self.start).total_seconds() // 60) * 2 + 4


@dataclass(frozen=True)
class FilteredVersion:
    """A version whose slots a :class:`SlotFilter` decides."""

    schedule_id: Any
    version: int
    tenant_id: str
    time_zone: str
    definition: Mapping[str, Any]


@dataclass(frozen=True)
class SlotVerdicts:
    """What a filter says about a version's slots; a slot in neither set must exist.

    excluded: removed (a calendar lists its date): if an occurrence exists, it must not have run.
    uncertain: the filter cannot tell (the calendar changed just before the slot, while the
        materializer may already have decided it): whatever exists, or nothing, is accepted.
    """

    excluded: frozenset[datetime] = frozenset()
    uncertain: frozenset[datetime] = frozenset()


class SlotFilter(Protocol):
    """Removes excluded slots (exclusion calendars, blackout periods) from what a version should produce.

    ``fields``: definition fields that route a version through the filter
    (versions without any of them take the grouped path and keep every slot).
    ``judge`` gets the version and the slots its time rule produces in the
    window, ascending, and says which are excluded or uncertain.
    """

    fields: tuple[str, ...]

    async def judge(
        self, conn: asyncpg.Connection, version: FilteredVersion, slots: Sequence[datetime]
    ) -> SlotVerdicts: ...


@dataclass
class SlotTotals:
    schedules: int = 0
    versions: int = 0
    cron_rules: int = 0
    rate_rules: int = 0
    filtered_versions: int = 0


async def create_run_tables(conn: asyncpg.Connection) -> None:
    """Create the run's temporary tables (schemas/queries/reconciler.sql), empty; they are dropped when the
    run's transaction commits."""
    await conn.execute(*QUERIES.create_run_occurrences())
    await conn.execute(*QUERIES.create_run_versions())
    await conn.execute(*QUERIES.create_run_cron_fires())
    await conn.execute(*QUERIES.create_run_rate_periods())
    await conn.execute(*QUERIES.create_run_once_instants())
    await conn.execute(*QUERIES.create_run_filtered_slots())
    await conn.execute(*QUERIES.create_run_slots())
    await conn.execute(*QUERIES.create_run_anomalies())
    await conn.execute(*QUERIES.create_run_missing())
    await conn.execute(*QUERIES.create_run_unexpected())
    await conn.execute(*QUERIES.create_run_effects())


async def build_expected_slots(
    conn: asyncpg.Connection,
    window: Window,
    tenant_id: str | None,
    slot_filter: SlotFilter | None = None,
    ahead_slack: timedelta = timedelta(hours=1),
) -> SlotTotals:
    """Fill the run's temporary tables: rc_occ (what exists), rc_versions and rc_slots (what should).

    Must run inside the run's transaction (the tables are dropped at commit).
    """
    totals = SlotTotals()
    bounds = {"window_from": window.start, "window_to": window.end}
    await create_run_tables(conn)
    await conn.execute(*QUERIES.collect_occurrences(**bounds, tenant_id=tenant_id))
    await conn.execute(*QUERIES.analyze_occurrences())
    await conn.execute(
        *QUERIES.collect_versions(**bounds, tenant_id=tenant_id, ahead_slack_s=ahead_slack.total_seconds())
    )
    if slot_filter is not None and slot_filter.fields:
        await conn.execute(*QUERIES.mark_filtered_versions(fields=list(slot_filter.fields)))
    await conn.execute(*QUERIES.analyze_versions())

    cron_fires: list[tuple[str, str, str, str, datetime]] = []
    groups = await conn.fetch(*QUERIES.cron_groups())
    for group in groups:
        spec = timing.TimeSpec("cron", group["expression"], group["time_zone"], group["dst_repeat"], group["dst_gap"])
        for instant in timing.fire_times(spec, window.start - _US, window.fire_limit, window.end - _US):
            cron_fires.append((group["expression"], group["time_zone"], group["dst_repeat"], group["dst_gap"], instant))
    totals.cron_rules = len(groups)
    if cron_fires:
        await conn.copy_records_to_table("rc_cron_fires", records=cron_fires)

    periods = []
    for row in await conn.fetch(*QUERIES.rate_expressions()):
        period = timing.parse_duration(row["expression"])
        periods.append((row["expression"], period // _US))
    totals.rate_rules = len(periods)
    if periods:
        await conn.copy_records_to_table("rc_rate_periods", records=periods)

    instants = []
    for row in await conn.fetch(*QUERIES.once_expressions()):
        instants.append((row["expression"], timing.parse_instant(row["expression"], "expression")))
    if instants:
        await conn.copy_records_to_table("rc_once_instants", records=instants)

    if slot_filter is not None and slot_filter.fields:
        totals.filtered_versions = await _filtered_slots(conn, window, slot_filter)

    await conn.execute(*QUERIES.build_slots(**bounds))
    await conn.execute(*QUERIES.analyze_slots())
    counted = await conn.fetchrow(*QUERIES.version_totals())
    totals.schedules, totals.versions = counted["schedules"], counted["versions"]
    return totals


async def _filtered_slots(conn: asyncpg.Connection, window: Window, slot_filter: SlotFilter) -> int:
    rows = await conn.fetch(*QUERIES.filtered_versions())
    records: list[tuple[Any, int, datetime, bool, bool]] = []
    for row in rows:
        spec = timing.TimeSpec(
            row["kind"],
            row["expression"],
            row["time_zone"],
            row["dst_repeat"],
            row["dst_gap"],
            row["anchor"],
            row["start_at"],
            row["end_at"],
        )
        low = window.start - _US  # slots before the cursor too: a backfill may fill them
        limit = window.fire_limit if row["kind"] == "cron" else _rate_limit(row, window)
        slots = timing.fire_times(spec, low, limit, window.end - _US)
        version = FilteredVersion(
            row["schedule_id"], row["version"], row["tenant_id"], row["time_zone"], row["definition"]
        )
        verdicts = await slot_filter.judge(conn, version, slots)
        records.extend(
            (row["schedule_id"], row["version"], slot, slot in verdicts.excluded, slot in verdicts.uncertain)
            for slot in slots
        )
    if records:
        await conn.copy_records_to_table("rc_filtered_slots", records=records)
    return len(rows)


def _rate_limit(row: Mapping[str, Any], window: Window) -> int:
    if row["kind"] != "rate":
        return 1
    period = timing.parse_duration(row["expression"])
    return int((window.end - window.start) / period) + 2

"""Exclusion calendars in the reconciler: which slots a schedule's calendar removed.

A version whose definition names an ``exclusion_calendar`` goes through this
filter. A slot is excluded when the calendar version in force at it lists its
date on the calendar's clock (``engine.rules.timing.excluding_version``, the
same rule the materializer and the timeline apply). The materializer read the
version current when it materialized the slot, up to its horizon earlier; so
a slot for which the version in force ``materialized_ahead`` before it and the
one in force at it disagree is *uncertain*: whatever exists for it (or
nothing) is accepted. Calendar histories are read once per calendar per run.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

import asyncpg

from engine.control.reconciler.slots import FilteredVersion, SlotVerdicts
from engine.rules.exclusion_calendars import ExclusionCalendar, entries_from_stored
from engine.rules.timing.exclusions import excluding_version
from schemas.queries import QUERIES

History = list[tuple[datetime, ExclusionCalendar]]


class CalendarFilter:
    """The reconciler's default slot filter (see the module docstring)."""

    fields: tuple[str, ...] = ("exclusion_calendar",)

    def __init__(self, materialized_ahead: timedelta = timedelta(minutes=2)) -> None:
        self.materialized_ahead = materialized_ahead
        self._histories: dict[uuid.UUID, History] = {}

    async def judge(
        self, conn: asyncpg.Connection, version: FilteredVersion, slots: Sequence[datetime]
    ) -> SlotVerdicts:
        name = version.definition.get("exclusion_calendar")
        if not isinstance(name, str) or not slots:
            return SlotVerdicts()
        history = await self._history(conn, version, name)
        if not history:
            return SlotVerdicts()  # a calendar that never existed excludes nothing (the version's own problem)
        excluded: set[datetime] = set()
        uncertain: set[datetime] = set()
        for slot in slots:
            at_slot = excluding_version(history, version.time_zone, slot) is not None
            ahead = excluding_version(history, version.time_zone, slot - self.materialized_ahead) is not None
            if at_slot and ahead:
                excluded.add(slot)
            elif at_slot or ahead:
                uncertain.add(slot)
        return SlotVerdicts(frozenset(excluded), frozenset(uncertain))

    async def _history(self, conn: asyncpg.Connection, version: FilteredVersion, name: str) -> History:
        calendar_id = await conn.fetchval(
            *QUERIES.calendar_of_version(schedule_id=version.schedule_id, tenant_id=version.tenant_id, name=name)
        )
        if calendar_id is None:
            return []
        found = self._histories.get(calendar_id)
        if found is None:
            rows = await conn.fetch(
                *QUERIES.calendar_history_by_id(tenant_id=version.tenant_id, calendar_id=calendar_id)
            )
            found = [
                (
                    r["changed_at"],
                    ExclusionCalendar(r["name"], r["version"], r["time_zone"], entries_from_stored(r["entries"])),
                )
                for r in rows
            ]
            self._histories[calendar_id] = found
        return found

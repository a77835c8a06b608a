"""The control plane of exclusion calendars: create, read, list, update, import, delete-if-unused.

A calendar belongs to one tenant and is addressed by its name; another
tenant's calendar is not found (404), whether asked for directly or named by a
schedule. Every change runs in one transaction that locks the calendar,
bumps its version and records the version with its full list of entries in
``calendar_versions`` (the history a reconciler reads). A change applies to
every slot not yet materialized (docs/time-contract.md, "Exclusion
calendars"); nothing already materialized is touched. A calendar that a live
(active or paused) schedule references cannot be deleted (409).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg
from opentelemetry import metrics

from engine.control.calendar_requests import (
    CalendarRequest,
    entries_to_json,
    parse_calendar_changes,
    parse_calendar_request,
    validate_calendar_name,
)
from engine.control.icalendar_import import parse_icalendar_dates
from engine.control.pagination import decode_cursor, page_size, split_page
from engine.control.tenants import lock_tenant
from engine.control.views import Page
from engine.records import Calendar, CalendarVersion
from engine.rules.exclusion_calendars import CalendarEntry, ExclusionCalendar, entries_from_stored, entries_to_stored
from engine.rules.timing.zones import validate_zone
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.errors import Conflict, InvalidInput, NotFound
from schemas.messages import format_instant
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.calendars")


def calendar_to_json(calendar: Calendar, dates: tuple[CalendarEntry, ...] | None = None) -> dict[str, Any]:
    """The public representation of a calendar (API field names); listings leave the dates out."""
    data: dict[str, Any] = {
        "name": calendar.name,
        "calendar_id": str(calendar.calendar_id),
        "tenant_id": calendar.tenant_id,
        "version": calendar.version,
        "time_zone": calendar.time_zone,
        "description": calendar.description,
        "date_count": calendar.entry_count,
        "created_at": format_instant(calendar.created_at),
        "updated_at": format_instant(calendar.updated_at),
    }
    if dates is not None:
        data["dates"] = entries_to_json(dates)
    return data


def _with_dates(row: asyncpg.Record | None) -> tuple[Calendar, tuple[CalendarEntry, ...]] | None:
    """A row of get_calendar / get_calendar_by_id: the calendar and its current version's dates."""
    if row is None:
        return None
    return Calendar.from_row(row), entries_from_stored(row["entries"])


def calendar_value(calendar: Calendar, dates: tuple[CalendarEntry, ...]) -> ExclusionCalendar:
    """The immutable value the timing rules take."""
    return ExclusionCalendar(calendar.name, calendar.version, calendar.time_zone, dates)


async def reference_calendar(conn: asyncpg.Connection, tenant_id: str, name: str) -> Calendar:
    """The tenant's live calendar ``name``, share-locked for a schedule that starts referencing it.

    NotFound for a name no live calendar of this tenant has, including
    another tenant's calendar: existence does not leak across tenants.
    """
    row = await conn.fetchrow(
        *QUERIES.share_calendar(tenant_id=tenant_id, name=validate_calendar_name(name, "exclusion_calendar"))
    )
    if row is None:
        raise NotFound("calendar", name)
    return Calendar.from_row(row)


async def calendar_by_id(
    conn: asyncpg.Connection | asyncpg.Pool, tenant_id: str, calendar_id: uuid.UUID
) -> ExclusionCalendar:
    """The current version of a schedule's calendar as a value (for previews of a stored schedule)."""
    found = _with_dates(await conn.fetchrow(*QUERIES.get_calendar_by_id(tenant_id=tenant_id, calendar_id=calendar_id)))
    if found is None:
        raise NotFound("calendar", calendar_id)
    return calendar_value(*found)


class Calendars:
    """Calendar operations against the engine database (the HTTP API, the CLI and the Python API use it)."""

    def __init__(self, pool: asyncpg.Pool, clock: Clock | None = None, meter: metrics.Meter | None = None) -> None:
        self.pool = pool
        self.clock = clock or DatabaseClock()
        self._changes = (meter or obs.get_meter("engine")).create_counter(obs.CALENDAR_CHANGES, unit="1")

    @contextlib.asynccontextmanager
    async def _transaction(self, conn: asyncpg.Connection | None) -> AsyncIterator[asyncpg.Connection]:
        if conn is None:
            async with self.pool.acquire() as own, own.transaction():
                yield own
        else:
            async with conn.transaction():
                yield conn

    async def create_calendar(
        self, tenant_id: str, raw: Mapping[str, Any], *, conn: asyncpg.Connection | None = None
    ) -> dict[str, Any]:
        """Validate and store a new calendar (version 1); Conflict when the tenant already has that name."""
        request = parse_calendar_request(raw)
        async with self._transaction(conn) as conn:
            return await self._create(conn, tenant_id, request, "create")

    async def _create(
        self, conn: asyncpg.Connection, tenant_id: str, request: CalendarRequest, change: str
    ) -> dict[str, Any]:
        await lock_tenant(conn, tenant_id)  # the tenant must exist and be active
        row = await conn.fetchrow(
            *QUERIES.insert_calendar(
                calendar_id=uuid.uuid4(),
                tenant_id=tenant_id,
                name=request.name,
                time_zone=request.time_zone,
                description=request.description,
                entry_count=len(request.entries),
                now=self.clock.now(),
            )
        )
        if row is None:
            raise Conflict(
                f"calendar {request.name} already exists; change it with PATCH"
                f" /v1/calendars/{request.name} or choose another name"
            )
        calendar = Calendar.from_row(row)
        await self._record(conn, calendar, change, request.entries)
        return calendar_to_json(calendar, request.entries)

    async def get_calendar(self, tenant_id: str, name: str) -> dict[str, Any]:
        return calendar_to_json(*await self._current(self.pool, tenant_id, name))

    async def get_calendar_value(self, tenant_id: str, name: str) -> ExclusionCalendar:
        """The current version of the tenant's calendar as a value (previews)."""
        return calendar_value(*await self._current(self.pool, tenant_id, name))

    async def _current(
        self, conn: asyncpg.Connection | asyncpg.Pool, tenant_id: str, name: str
    ) -> tuple[Calendar, tuple[CalendarEntry, ...]]:
        found = _with_dates(await conn.fetchrow(*QUERIES.get_calendar(tenant_id=tenant_id, name=_name(name))))
        if found is None:
            raise NotFound("calendar", name)
        return found

    async def list_calendars(self, tenant_id: str, *, cursor: str | None = None, limit: int = 50) -> Page:
        """A tenant's live calendars in creation order, without their dates (``date_count`` says how many)."""
        after_at, after_id = decode_cursor(cursor)
        limit = page_size(limit)
        rows = await self.pool.fetch(
            *QUERIES.list_calendars(tenant_id=tenant_id, after_at=after_at, after_id=after_id, limit=limit + 1)
        )
        calendars = [Calendar.from_row(row) for row in rows]
        page, next_cursor = split_page(calendars, limit, lambda c: (c.created_at, c.calendar_id))
        return Page([calendar_to_json(c) for c in page], next_cursor)

    async def calendar_history(self, tenant_id: str, name: str) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(*QUERIES.list_calendar_versions(tenant_id=tenant_id, name=_name(name)))
        if not rows:
            raise NotFound("calendar", name)
        versions = [CalendarVersion.from_row(row) for row in rows]
        return [
            {
                "version": v.version,
                "change": v.change,
                "time_zone": v.time_zone,
                "description": v.description,
                "dates": entries_to_json(v.dates),
                "changed_at": format_instant(v.changed_at),
            }
            for v in versions
        ]

    async def update_calendar(
        self, tenant_id: str, name: str, raw: Mapping[str, Any], *, conn: asyncpg.Connection | None = None
    ) -> dict[str, Any]:
        """A new version: the fields given replace the stored ones (``dates`` replaces the whole list).

        ``expected_version`` makes the change conditional: Conflict if the
        calendar has moved on since the caller read it.
        """
        changes = parse_calendar_changes(raw)
        async with self._transaction(conn) as conn:
            calendar = await self._lock(conn, tenant_id, name)
            if changes.expected_version is not None and changes.expected_version != calendar.version:
                raise Conflict(
                    f"calendar {calendar.name} is at version {calendar.version}, not"
                    f" {changes.expected_version}; read it again and reapply your change"
                )
            entries = changes.entries
            if entries is None:
                entries = (await self._current(conn, tenant_id, calendar.name))[1]
            time_zone = changes.time_zone if changes.time_zone_set else calendar.time_zone
            description = changes.description if changes.description is not None else calendar.description
            return await self._new_version(conn, calendar, time_zone, description, entries, "update")

    async def import_calendar(
        self,
        tenant_id: str,
        name: str,
        ics: bytes | str,
        *,
        time_zone: str | None = None,
        description: str | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> dict[str, Any]:
        """Replace the calendar's dates with the all-day events of an iCalendar file, creating it if needed.

        ``time_zone``/``description`` change the calendar only when given.
        The result carries ``imported``: events read, cancelled ones skipped,
        entries stored. A file that cannot be read changes nothing.
        """
        name = _name(name)
        imported = parse_icalendar_dates(ics)
        zone = validate_zone(time_zone) if time_zone is not None else None
        report = {"events": imported.events, "cancelled": imported.cancelled, "entries": len(imported.entries)}
        async with self._transaction(conn) as conn:
            row = await conn.fetchrow(*QUERIES.lock_calendar(tenant_id=tenant_id, name=name))
            if row is None:
                request = CalendarRequest(name, zone, description or (imported.calendar_name or ""), imported.entries)
                created = await self._create(conn, tenant_id, request, "import")
                return {**created, "imported": report, "created": True}
            calendar = Calendar.from_row(row)
            updated = await self._new_version(
                conn,
                calendar,
                zone if time_zone is not None else calendar.time_zone,
                description if description is not None else calendar.description,
                imported.entries,
                "import",
            )
            return {**updated, "imported": report, "created": False}

    async def delete_calendar(
        self, tenant_id: str, name: str, *, conn: asyncpg.Connection | None = None
    ) -> dict[str, Any]:
        """Delete a calendar no live schedule references (Conflict naming some that do)."""
        async with self._transaction(conn) as conn:
            calendar = await self._lock(conn, tenant_id, name)
            users = await conn.fetchrow(*QUERIES.calendar_users(calendar_id=calendar.calendar_id))
            if users["schedules"]:
                some = ", ".join(str(s) for s in users["some"])
                raise Conflict(
                    f"calendar {calendar.name} is used by {users['schedules']} live schedule(s) ({some});"
                    " remove exclusion_calendar from them or cancel them first"
                )
            deleted = Calendar.from_row(
                await conn.fetchrow(
                    *QUERIES.delete_calendar(
                        calendar_id=calendar.calendar_id, tenant_id=tenant_id, now=self.clock.now()
                    )
                )
            )
            await self._record(conn, deleted, "delete", ())
        return {**calendar_to_json(deleted), "deleted": True}

    async def _lock(self, conn: asyncpg.Connection, tenant_id: str, name: str) -> Calendar:
        row = await conn.fetchrow(*QUERIES.lock_calendar(tenant_id=tenant_id, name=_name(name)))
        if row is None:
            raise NotFound("calendar", name)
        return Calendar.from_row(row)

    async def _new_version(
        self,
        conn: asyncpg.Connection,
        calendar: Calendar,
        time_zone: str | None,
        description: str,
        entries: tuple[CalendarEntry, ...],
        change: str,
    ) -> dict[str, Any]:
        updated = Calendar.from_row(
            await conn.fetchrow(
                *QUERIES.update_calendar(
                    calendar_id=calendar.calendar_id,
                    tenant_id=calendar.tenant_id,
                    time_zone=time_zone,
                    description=description,
                    entry_count=len(entries),
                    now=self.clock.now(),
                )
            )
        )
        await self._record(conn, updated, change, entries)
        return calendar_to_json(updated, entries)

    async def _record(
        self, conn: asyncpg.Connection, calendar: Calendar, change: str, entries: tuple[CalendarEntry, ...]
    ) -> None:
        """The version's history row, in the change's transaction (the metric and log follow it)."""
        await conn.execute(
            *QUERIES.insert_calendar_version(
                calendar_id=calendar.calendar_id,
                version=calendar.version,
                tenant_id=calendar.tenant_id,
                change=change,
                time_zone=calendar.time_zone,
                description=calendar.description,
                entries=entries_to_stored(entries),
                now=self.clock.now(),
            )
        )
        self._changes.add(1, {"change": change})
        log.info(
            "calendar changed",
            extra={
                "action": f"calendar.{change}",
                "tenant_id": calendar.tenant_id,
                "calendar": calendar.name,
                "version": calendar.version,
                "dates": len(entries),
            },
        )


def _name(name: str) -> str:
    """A path or CLI name; one that could never be a calendar's is simply not found."""
    try:
        return validate_calendar_name(name)
    except InvalidInput as err:
        raise NotFound("calendar", str(name)[:70]) from err

"""The timeline of a schedule: every expected slot in a window and what happened to it.

The question it answers is the operator's "why did this not run at 09:00?".
Each entry is one expected slot (from :mod:`engine.rules.expected_slots`, the
version history and the time rules) with the occurrences that exist at that
instant (of any version: a pause cancels one, the resume records another), or
an occurrence no slot explains (a manual trigger, a fire of a definition that
an update replaced). Each entry gets one verdict and a sentence:

* ``SUCCEEDED`` after N attempts; ``DEAD`` with its reason and error;
* ``MISSED`` — the schedule was paused, or the engine was down or behind, and
  the misfire policy said skip;
* ``SKIPPED_OVERLAP`` — another occurrence was in flight;
* ``CANCELED`` by version N (the change that invalidated it);
* ``HELD`` — by the overlap gate, or by the tenant's catch-up quota until T;
* in flight: ``SCHEDULED``, ``ENQUEUED``, ``RUNNING``, ``RETRY_WAIT``;
* no occurrence: ``EXCLUDED`` (its date is listed in the schedule's exclusion
  calendar, version N), ``PAUSED`` (not fired while paused), ``UPCOMING``, ``PENDING``
  (due, the materializer has not reached it) or ``ABSENT`` — expected but
  absent although the schedule's cursor passed it, which no healthy engine
  produces (the reconciler's finding).

:func:`explain_timeline` is pure (rows in, entries out); :func:`schedule_timeline`
reads the rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from engine.control.identifiers import as_uuid
from engine.control.schedule_requests import build_time_spec
from engine.control.views import instant
from engine.records import Schedule, ScheduleVersion
from engine.rules.exclusion_calendars import ExclusionCalendar, entries_from_stored
from engine.rules.expected_slots import ExpectedSlot, VersionSpan, expected_slots
from engine.rules.timing import parse_duration
from engine.rules.timing.exclusions import excluding_version
from engine.rules.timing.zones import zone_info
from schemas.errors import InvalidInput, NotFound
from schemas.queries import QUERIES

#: The widest window one timeline shows (bounded work per request).
MAX_WINDOW = timedelta(days=7)
MAX_ENTRIES = 2000


@dataclass(frozen=True)
class TimelineEntry:
    scheduled_for: datetime
    verdict: str
    explanation: str
    version: int | None  # the version in force at the slot (None: no slot here)
    occurrences: list[dict[str, Any]] = field(default_factory=list)
    origin: str = "schedule"  # schedule | backfill | manual: of the deciding occurrence

    def to_json(self) -> dict[str, Any]:
        return {
            "scheduled_for": instant(self.scheduled_for),
            "verdict": self.verdict,
            "explanation": self.explanation,
            "version": self.version,
            "origin": self.origin,
            "occurrences": self.occurrences,
        }


@dataclass(frozen=True)
class Timeline:
    schedule_id: str
    window_from: datetime
    window_to: datetime
    entries: list[TimelineEntry]
    truncated: bool
    counts: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule_id": self.schedule_id,
            "from": instant(self.window_from),
            "to": instant(self.window_to),
            "truncated": self.truncated,
            "counts": self.counts,
            "entries": [entry.to_json() for entry in self.entries],
        }


def version_spans(versions: Sequence[ScheduleVersion]) -> list[VersionSpan]:
    """The version history as values for :func:`expected_slots` (definitions were validated when stored)."""
    spans = []
    for row in versions:
        definition = row.definition
        spec = build_time_spec(
            definition["kind"],
            definition["expression"],
            definition.get("time_zone"),
            dst_repeat=definition.get("dst_repeat"),
            dst_gap=definition.get("dst_gap"),
            anchor=definition.get("anchor"),
            start_at=definition.get("start_at"),
            end_at=definition.get("end_at"),
        )
        lateness = definition.get("max_lateness")
        spans.append(
            VersionSpan(
                row.version, row.change, row.state, spec, row.changed_at, _seconds(lateness, timedelta(minutes=1))
            )
        )
    return spans


def _seconds(value: Any, default: timedelta) -> timedelta:
    if value is None:
        return default
    if isinstance(value, (int, float)):
        return timedelta(seconds=value)
    return parse_duration(str(value), "max_lateness")


def explain_timeline(
    schedule: Schedule,
    version_rows: Sequence[ScheduleVersion],
    occurrences: Sequence[Mapping[str, Any]],
    slots: Sequence[ExpectedSlot],
    now: datetime,
    catch_up_per_minute: int | None = None,
    excluded: Mapping[datetime, str] | None = None,
) -> list[TimelineEntry]:
    """One entry per expected slot and per occurrence no slot explains, oldest first. Pure.

    ``excluded`` explains the slots the schedule's exclusion calendar removed:
    such a slot with no occurrence is EXCLUDED, not ABSENT.
    """
    excluded = excluded or {}
    versions = {row.version: row for row in version_rows}
    at: dict[datetime, list[Mapping[str, Any]]] = {}
    manual: list[Mapping[str, Any]] = []
    for occ in occurrences:
        if occ["origin"] == "manual":
            manual.append(occ)
        else:
            at.setdefault(occ["scheduled_for"], []).append(occ)
    entries: list[TimelineEntry] = []
    for slot in slots:
        found = at.pop(slot.scheduled_for, [])
        if not found and slot.scheduled_for in excluded:
            entries.append(TimelineEntry(slot.scheduled_for, "EXCLUDED", excluded[slot.scheduled_for], slot.version))
            continue
        entries.append(
            _entry(schedule, versions, slot.scheduled_for, slot.version, slot.paused, found, now, catch_up_per_minute)
        )
    for scheduled_for, found in at.items():
        entries.append(_entry(schedule, versions, scheduled_for, None, False, found, now, catch_up_per_minute))
    for occ in manual:
        entries.append(_entry(schedule, versions, occ["scheduled_for"], None, False, [occ], now, catch_up_per_minute))
    entries.sort(key=lambda e: (e.scheduled_for, e.origin == "manual"))
    return entries


def _entry(
    schedule: Schedule,
    versions: Mapping[int, ScheduleVersion],
    scheduled_for: datetime,
    version: int | None,
    paused: bool,
    found: Sequence[Mapping[str, Any]],
    now: datetime,
    catch_up_per_minute: int | None,
) -> TimelineEntry:
    views = [_occurrence_view(occ) for occ in found]
    if not found:
        verdict, text = _absent(schedule, scheduled_for, version, paused, now)
        return TimelineEntry(scheduled_for, verdict, text, version, views)
    ordered = sorted(found, key=lambda o: (o["schedule_version"], o["created_at"]))
    deciding = ordered[-1]
    verdict, text = _verdict(schedule, versions, deciding, paused, now, catch_up_per_minute)
    earlier = [_earlier(versions, occ) for occ in ordered[:-1]]
    if earlier:
        text = "; ".join(earlier) + "; then " + text[0].lower() + text[1:]
    if version is None and deciding["origin"] == "schedule":
        text += " (no version in force fires at this instant now: a later change replaced this definition)"
    return TimelineEntry(scheduled_for, verdict, text, version, views, deciding["origin"])


def _absent(
    schedule: Schedule, scheduled_for: datetime, version: int | None, paused: bool, now: datetime
) -> tuple[str, str]:
    if paused:
        return "PAUSED", (
            f"not fired: the schedule was paused (version {version}); on resume the misfire"
            f" policy {schedule.misfire_policy} decides this slot"
        )
    if scheduled_for > now:
        return "UPCOMING", "not due yet"
    cursor = schedule.next_run_at
    if cursor is not None and scheduled_for >= cursor:
        return "PENDING", (
            "due, but the materializer has not reached it yet (due backlog: the engine is down or behind)"
        )
    return "ABSENT", (
        "expected but absent: no occurrence exists although the schedule's cursor passed this"
        " slot (a reconciler finding: report it)"
    )


def _by(occ: Mapping[str, Any]) -> str:
    if occ["origin"] == "backfill":
        return f" (backfill requested by {occ['requested_by']})"
    if occ["origin"] == "manual":
        return f" (manual trigger requested by {occ['requested_by']})"
    return ""


def _attempts(n: int) -> str:
    return f"{n} attempt" + ("" if n == 1 else "s")


def _verdict(
    schedule: Schedule,
    versions: Mapping[int, ScheduleVersion],
    occ: Mapping[str, Any],
    paused: bool,
    now: datetime,
    catch_up_per_minute: int | None,
) -> tuple[str, str]:
    """The verdict and sentence of the occurrence that decides a slot."""
    state = occ["state"]
    by = _by(occ)
    if state == "MISSED":
        return state, _missed(schedule, occ, paused)
    if state == "CANCELED":
        return state, _canceled(versions, occ)
    if state == "SCHEDULED":
        return _scheduled(schedule, occ, now, catch_up_per_minute)
    if state == "DEAD":
        error = ": ".join(part for part in (occ["last_error_class"], occ["last_error_message"]) if part)
        return state, (
            f"DEAD after {_attempts(occ['attempt_count'])} ({occ['dead_reason'] or 'no retry left'})"
            f"{': ' + error if error else ''}{by}; replay it from the dead letters"
        )
    sentences = {
        "SUCCEEDED": f"succeeded after {_attempts(occ['attempt_count'])}{by}",
        "SKIPPED_OVERLAP": (
            f"skipped: another occurrence of the schedule was in flight (overlap policy {schedule.overlap_policy}){by}"
        ),
        "ENQUEUED": f"in Kafka since {instant(occ['enqueued_at'])}, no attempt started yet{by}",
        "RUNNING": f"running attempt {occ['attempt_count']}{by}",
        "RETRY_WAIT": (
            f"attempt {occ['attempt_count']} failed ({occ['last_error_class'] or 'an error'}); next delivery at"
            f" {instant(occ['available_at'])}{by}"
        ),
    }
    return state, sentences.get(state, state.lower())


def _missed(schedule: Schedule, occ: Mapping[str, Any], paused: bool) -> str:
    late = occ["created_at"] - occ["scheduled_for"]
    policy = f"the misfire policy {schedule.misfire_policy} (max lateness {_duration(schedule)})"
    if paused:
        return (
            f"MISSED: the schedule was paused at this instant; when it resumed (version"
            f" {occ['schedule_version']}) the slot was {_human(late)} late and {policy} skipped it"
        )
    return f"MISSED: materialized {_human(late)} late (the engine was down or behind) and {policy} skipped it"


def _scheduled(
    schedule: Schedule, occ: Mapping[str, Any], now: datetime, catch_up_per_minute: int | None
) -> tuple[str, str]:
    by = _by(occ)
    if occ.get("held"):
        return "HELD", (
            f"held by the overlap policy {schedule.overlap_policy}: waits until the occurrence in flight finishes{by}"
        )
    if occ["available_at"] > now and occ["origin"] == "backfill":
        quota = f" ({catch_up_per_minute}/min)" if catch_up_per_minute is not None else ""
        return "HELD", f"held by the tenant's catch-up quota{quota} until {instant(occ['available_at'])}{by}"
    if occ["available_at"] > now:
        return "SCHEDULED", f"scheduled for delivery at {instant(occ['available_at'])}{by}"
    return "SCHEDULED", f"due, waiting for the relay to publish it{by}"


def _canceled(versions: Mapping[int, ScheduleVersion], occ: Mapping[str, Any]) -> str:
    # Every change cancels the unclaimed occurrences of older versions in its own transaction, so the
    # version right after the occurrence's is the one that canceled it.
    by = versions.get(occ["schedule_version"] + 1)
    if by is None:
        return f"CANCELED while it ran (cooperative cancellation){_by(occ)}"
    return f"CANCELED by version {by.version} ({by.change} at {instant(by.changed_at)}){_by(occ)}"


def _earlier(versions: Mapping[int, ScheduleVersion], occ: Mapping[str, Any]) -> str:
    if occ["state"] == "CANCELED":
        return f"version {occ['schedule_version']}'s occurrence was " + _canceled(versions, occ)
    return f"version {occ['schedule_version']}'s occurrence is {occ['state']}"


def _duration(schedule: Schedule) -> str:
    return _human(timedelta(seconds=schedule.max_lateness_s))


def _human(span: timedelta) -> str:
    seconds = max(int(span.total_seconds()), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _occurrence_view(occ: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "occurrence_id": str(occ["occurrence_id"]),
        "version": occ["schedule_version"],
        "state": occ["state"],
        "attempts": occ["attempt_count"],
        "origin": occ["origin"],
        "requested_by": occ["requested_by"],
    }


def count_verdicts(entries: Sequence[TimelineEntry]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.verdict] = counts.get(entry.verdict, 0) + 1
    return dict(sorted(counts.items()))


async def schedule_timeline(
    pool: asyncpg.Pool,
    tenant_id: str | None,
    schedule_id: uuid.UUID | str,
    window_from: datetime,
    window_to: datetime,
    now: datetime,
) -> Timeline:
    """The timeline of one schedule (of ``tenant_id``; None: an operator, any tenant)."""
    if window_to <= window_from:
        raise InvalidInput("to", "must be after from", instant(window_from + timedelta(hours=1)))
    if window_to - window_from > MAX_WINDOW:
        raise InvalidInput("to", f"the window is at most {MAX_WINDOW.days} days", instant(window_from + MAX_WINDOW))
    sid = as_uuid(schedule_id, "schedule")
    row = await pool.fetchrow(*QUERIES.scoped_schedule(schedule_id=sid, tenant_id=tenant_id))
    if row is None:
        raise NotFound("schedule", schedule_id)
    schedule = Schedule.from_row(row)
    versions = [ScheduleVersion.from_row(v) for v in await pool.fetch(*QUERIES.schedule_versions_of(schedule_id=sid))]
    expected = expected_slots(version_spans(versions), window_from, window_to, MAX_ENTRIES)
    occurrences = await pool.fetch(
        *QUERIES.timeline_occurrences(
            schedule_id=sid, window_from=window_from, window_to=window_to, limit=MAX_ENTRIES + 1
        )
    )
    quota = await pool.fetchval(*QUERIES.tenant_catch_up_quota(tenant_id=schedule.tenant_id))
    excluded = await _excluded_slots(pool, schedule, versions, expected.slots)
    entries = explain_timeline(schedule, versions, occurrences[:MAX_ENTRIES], expected.slots, now, quota, excluded)
    return Timeline(
        str(sid),
        window_from,
        window_to,
        entries,
        expected.truncated or len(occurrences) > MAX_ENTRIES,
        count_verdicts(entries),
    )


async def _excluded_slots(
    pool: asyncpg.Pool, schedule: Schedule, versions: Sequence[ScheduleVersion], slots: Sequence[ExpectedSlot]
) -> dict[datetime, str]:
    """The expected slots the schedule's calendar excluded, each with the sentence that says why.

    A slot is judged by the calendar version in force at it (the materializer
    read the version current when it materialized the slot, at most its
    horizon earlier), and only if the schedule version in force at it named
    that same calendar.
    """
    if schedule.calendar_id is None or schedule.calendar_name is None:
        return {}
    rows = await pool.fetch(
        *QUERIES.calendar_history_by_id(tenant_id=schedule.tenant_id, calendar_id=schedule.calendar_id)
    )
    history = [
        (r["changed_at"], ExclusionCalendar(r["name"], r["version"], r["time_zone"], entries_from_stored(r["entries"])))
        for r in rows
    ]
    named = {v.version: v.definition.get("exclusion_calendar") for v in versions}
    found: dict[datetime, str] = {}
    for slot in slots:
        if named.get(slot.version) != schedule.calendar_name:
            continue
        calendar = excluding_version(history, schedule.time_zone, slot.scheduled_for)
        if calendar is None:
            continue
        day = slot.scheduled_for.astimezone(zone_info(calendar.zone_for(schedule.time_zone))).date()
        label = calendar.label_for(day)
        found[slot.scheduled_for] = (
            f"not fired: {day.isoformat()} is listed in the exclusion calendar {schedule.calendar_name}"
            f" (version {calendar.version}{': ' + label if label else ''})"
        )
    return found

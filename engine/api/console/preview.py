"""The console's live preview: the next fires of a definition, with daylight-saving days marked.

A fire on a local date when the zone's UTC offset changes (spring forward or
fall back) is marked with the change, and a fire in a repeated hour says which
of the two it is, so "every day at 02:30 in New York" shows on its face that
the spring-forward day has no 02:30.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from engine.control.schedule_requests import build_time_spec
from engine.rules import timing
from engine.rules.exclusion_calendars import ExclusionCalendar
from schemas.errors import InvalidInput
from schemas.messages import format_instant


def dst_change(zone: ZoneInfo, day: datetime) -> timedelta | None:
    """The change of UTC offset during ``day``'s local date (None when there is none)."""
    date = day.date()
    start = datetime.combine(date, time(0), zone).utcoffset()
    end = datetime.combine(date + timedelta(days=1), time(0), zone).utcoffset()
    if start is None or end is None or start == end:
        return None
    return end - start


def preview_with_dst(
    definition: Mapping[str, Any], after: datetime, count: int, calendar: ExclusionCalendar | None = None
) -> list[dict[str, Any]]:
    """The next ``count`` fires strictly after ``after``: ``{"utc", "local", "dst", "rule"}`` (dst None or a note).

    ``calendar`` is the schedule's exclusion calendar: fires on its dates are not listed.
    """
    kind, expression = definition.get("kind"), definition.get("expression")
    if not isinstance(kind, str) or not isinstance(expression, str) or not expression.strip():
        raise InvalidInput("expression", "is required", "0 9 * * MON-FRI")
    anchor = definition.get("anchor")
    if kind == "rate" and anchor is None:
        anchor = after.replace(microsecond=0)
    spec = build_time_spec(
        kind,
        expression,
        definition.get("time_zone"),
        dst_repeat=definition.get("dst_repeat"),
        dst_gap=definition.get("dst_gap"),
        anchor=anchor,
        start_at=definition.get("start_at"),
        end_at=definition.get("end_at"),
    )
    spec = dataclasses.replace(spec, calendar=calendar)
    zone = ZoneInfo(spec.time_zone)
    fires = []
    for fire in timing.preview(spec, after, count):
        change = dst_change(zone, fire.local)
        note = None
        if change is not None:
            hours = change.total_seconds() / 3600
            note = f"DST day: clocks {'spring forward' if hours > 0 else 'fall back'} {abs(hours):g}h"
            if fire.local.fold:
                note += " (second of the repeated hour)"
        fires.append({"utc": format_instant(fire.utc), "local": fire.local.isoformat(), "dst": note, "rule": fire.rule})
    return fires

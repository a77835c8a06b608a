"""Why a fire happens: the rule that produced it, in words, for previews.

For cron: the day rule (``day-of-week TUE#2: second Tuesday of the month``,
``day-of-month 13`` under the OR rule, ``every day``) and, when daylight
saving shaped the fire, what happened to the wall time (``02:30 does not
exist on 2026-03-08 (daylight saving gap): shifted to 03:00``, ``01:30 happens
twice on 2026-11-01: the second time (dst_repeat=both)``). For rate and once,
the arithmetic. Pure; the text is for people, not for parsing.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from engine.rules.cron_expression import CronExpression, parse_cron
from engine.rules.timing.instants import EPOCH, UTC, iso
from engine.rules.timing.spec import TimeSpec
from engine.rules.timing.zones import zone_info

_SECOND = timedelta(seconds=1)
_MINUTE = timedelta(minutes=1)
_SHOWN_TIMES = 4


def fire_reason(spec: TimeSpec, instant: datetime) -> str:
    """The rule that produced the fire at ``instant`` (aware UTC), assumed to be a fire of ``spec``."""
    if spec.kind == "once":
        return "once"
    if spec.kind == "rate":
        anchor = spec.anchor or spec.start_at or EPOCH.replace(tzinfo=UTC)
        return f"rate {spec.expression} from {iso(anchor)}"
    cron = parse_cron(spec.expression)
    zone = zone_info(spec.time_zone)
    local = instant.astimezone(zone)
    wall = local.replace(tzinfo=None, fold=0)
    regular = (
        wall.second == 0
        and wall.microsecond == 0
        and wall.hour * 60 + wall.minute in cron.times
        and wall.day in cron.month_days(wall.year, wall.month)
    )
    notes: list[str] = []
    day_rule: str | None = None
    if regular:
        day_rule = cron.describe_day(wall.year, wall.month, wall.day)
        first = wall.replace(tzinfo=zone).utcoffset()
        second = wall.replace(tzinfo=zone, fold=1).utcoffset()
        if first is not None and second is not None and first > second:  # a repeated wall time
            if local.fold:
                notes.append(f"{_clock(wall)} happens twice on {wall.date()}: the second time (dst_repeat=both)")
            elif spec.dst_repeat == "both":
                notes.append(f"{_clock(wall)} happens twice on {wall.date()}: the first time")
            else:
                notes.append(f"{_clock(wall)} happens twice on {wall.date()}: fires the first time only")
    if spec.dst_gap == "shift":
        skipped = _skipped_wall_times(cron, zone, instant)
        if skipped:
            if day_rule is None:
                day_rule = cron.describe_day(skipped[0].year, skipped[0].month, skipped[0].day)
            shown = ", ".join(_clock(t) for t in skipped[:_SHOWN_TIMES]) + (
                ", ..." if len(skipped) > _SHOWN_TIMES else ""
            )
            verb = "does" if len(skipped) == 1 else "do"
            days = sorted({t.date() for t in skipped})
            on = " and ".join(str(d) for d in days)
            note = f"{shown} {verb} not exist on {on} (daylight saving gap): shifted to {_clock(wall)}" + (
                f", where {_clock(wall)} fires too" if regular else ""
            )
            notes.append(note)
    return "; ".join([day_rule or cron.describe_day(wall.year, wall.month, wall.day), *notes])


def _skipped_wall_times(cron: CronExpression, zone: ZoneInfo, instant: datetime) -> list[datetime]:
    """Matching wall times inside the gap that ends exactly at ``instant`` (none if it ends no gap)."""
    before = (instant - _SECOND).astimezone(zone)
    after = instant.astimezone(zone)
    offset_before, offset_after = before.utcoffset(), after.utcoffset()
    if offset_before is None or offset_after is None or offset_after <= offset_before:
        return []
    # Wall times from (the clock just before the jump) up to (the clock at the jump) never existed.
    low = instant.replace(tzinfo=None) + offset_before
    high = instant.replace(tzinfo=None) + offset_after
    found: list[datetime] = []
    day: date = low.date()
    while day <= high.date():
        if day.day in cron.month_days(day.year, day.month):
            for minutes in cron.times:
                wall = datetime(day.year, day.month, day.day) + minutes * _MINUTE
                if low <= wall < high:
                    found.append(wall)
        day += timedelta(days=1)
    return found


def _clock(wall: datetime) -> str:
    return wall.strftime("%H:%M:%S" if wall.second else "%H:%M")

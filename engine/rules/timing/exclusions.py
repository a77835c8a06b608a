"""Fires that an exclusion calendar removes, and the source that removes them.

A spec with a ``calendar`` fires at the instants of the same spec without
it, minus those whose date on the calendar's clock is listed
(:mod:`engine.rules.exclusion_calendars`). Exclusion comes last: the cron
rules, the daylight-saving options and the bounds decide the instants, then
the calendar removes some. Nothing is moved to another day.

Work stays bounded by the calendar's size, not by the excluded fires: a fire
inside an excluded interval makes the walk resume at the interval's end, so a
calendar that excludes a whole year costs one jump, however often the
schedule would have fired in it.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING

from engine.rules.exclusion_calendars import ExclusionCalendar, Interval, excluded_intervals
from engine.rules.timing.instants import MICROSECOND, UTC, naive_utc
from engine.rules.timing.spec import TimeSpec
from engine.rules.timing.zones import zone_info

if TYPE_CHECKING:  # sources wraps its sources with ExcludingSource, so it imports this module
    from engine.rules.timing.sources import Source


class Exclusions:
    """The excluded intervals of one calendar on one clock, with lookups by instant (naive UTC)."""

    __slots__ = ("intervals", "_starts")

    def __init__(self, intervals: tuple[Interval, ...]) -> None:
        self.intervals = intervals
        self._starts = [start for start, _ in intervals]

    def containing(self, instant: datetime) -> Interval | None:
        """The interval that excludes ``instant``, or None."""
        index = bisect_right(self._starts, instant) - 1
        if index >= 0 and instant < self.intervals[index][1]:
            return self.intervals[index]
        return None

    def next_start_after(self, instant: datetime) -> datetime | None:
        """The start of the first interval that begins strictly after ``instant``."""
        index = bisect_right(self._starts, instant)
        return self._starts[index] if index < len(self._starts) else None

    def overlapping(self, low: datetime, high: datetime) -> list[Interval]:
        """Intervals that meet the open range (low, high)."""
        index = max(0, bisect_right(self._starts, low) - 1)
        found = []
        for interval in self.intervals[index:]:
            if interval[0] >= high:
                break
            if interval[1] > low:
                found.append(interval)
        return found


def exclusions_of(spec: TimeSpec) -> Exclusions | None:
    """The exclusions of a spec's calendar on its clock (memoized per calendar version and zone)."""
    calendar = spec.calendar
    if calendar is None:
        return None
    return _exclusions(calendar, calendar.zone_for(spec.time_zone))


_CACHE: dict[tuple[ExclusionCalendar, str], Exclusions] = {}


def _exclusions(calendar: ExclusionCalendar, zone_key: str) -> Exclusions:
    key = (calendar, zone_key)
    found = _CACHE.get(key)
    if found is None:
        if len(_CACHE) > 256:  # bounded: calendars change rarely, schedules share them
            _CACHE.clear()
        found = _CACHE[key] = Exclusions(excluded_intervals(calendar, zone_key))
    return found


def clear_exclusion_caches() -> None:
    _CACHE.clear()
    excluded_intervals.cache_clear()


class ExcludingSource:
    """Another source's fire instants minus the excluded ones (forward, backward and counts)."""

    __slots__ = ("inner", "exclusions")

    def __init__(self, inner: Source, exclusions: Exclusions) -> None:
        self.inner = inner
        self.exclusions = exclusions

    def forward(self, after: datetime, until: datetime | None) -> Iterator[datetime]:
        cursor = after
        while True:
            for instant in self.inner.forward(cursor, until):
                interval = self.exclusions.containing(instant)
                if interval is None:
                    yield instant
                    continue
                cursor = interval[1] - MICROSECOND  # resume at the interval's end
                break
            else:
                return
            if until is not None and cursor >= until:
                return

    def backward(self, before: datetime, since: datetime | None) -> Iterator[datetime]:
        cursor = before
        while True:
            for instant in self.inner.backward(cursor, since):
                interval = self.exclusions.containing(instant)
                if interval is None:
                    yield instant
                    continue
                cursor = interval[0]  # resume before the interval's start
                break
            else:
                return
            if since is not None and cursor <= since:
                return

    def count(self, low: datetime, high: datetime) -> int | None:
        total = self.inner.count(low, high)
        if total is None:
            return None
        for start, end in self.exclusions.overlapping(low, high):
            excluded = self.inner.count(max(low, start - MICROSECOND), min(high, end))
            if excluded is None:
                return None
            total -= excluded
        return total


@dataclass(frozen=True, slots=True)
class ExcludedSlot:
    """A fire the calendar removed: when it would have been, the listed date, and the entry's label."""

    utc: datetime  # aware UTC
    local: datetime  # on the schedule's clock
    date: date  # on the calendar's clock
    label: str | None


def excluded_slots(
    spec: TimeSpec, calendar: ExclusionCalendar | None, after: datetime, until: datetime, limit: int = 1000
) -> list[ExcludedSlot]:
    """The fires of ``spec`` in (after, until] that ``calendar`` removes (default: the spec's own), oldest first.

    For previews and reconcilers: an expected slot with no occurrence is
    *excluded* when it is listed here, not missing. At most ``limit``; work is
    O(limit + calendar intervals in the window).
    """
    from engine.rules.timing.sources import forward_fires  # sources wraps with this module's source

    calendar = calendar if calendar is not None else spec.calendar
    if calendar is None or limit <= 0:
        return []
    plain = dataclasses.replace(spec, calendar=None)
    exclusions = _exclusions(calendar, calendar.zone_for(spec.time_zone))
    zone = zone_info(spec.time_zone)
    calendar_zone = zone_info(calendar.zone_for(spec.time_zone))
    cursor = naive_utc(after, "after")
    high = naive_utc(until, "until")
    found: list[ExcludedSlot] = []
    while len(found) < limit and cursor < high:
        interval = exclusions.containing(cursor + MICROSECOND)
        if interval is None:
            start = exclusions.next_start_after(cursor)
            if start is None or start > high:
                break
            cursor = start - MICROSECOND  # nothing is excluded before the next interval
            interval = exclusions.containing(start)
            assert interval is not None
        for instant in forward_fires(plain, cursor, min(high, interval[1] - MICROSECOND)):
            aware = instant.replace(tzinfo=UTC)
            day = aware.astimezone(calendar_zone).date()
            found.append(ExcludedSlot(aware, aware.astimezone(zone), day, calendar.label_for(day)))
            if len(found) == limit:
                break
        cursor = interval[1] - MICROSECOND
    return found


def excluding_version(
    history: Sequence[tuple[datetime, ExclusionCalendar]], schedule_zone: str, instant: datetime
) -> ExclusionCalendar | None:
    """The calendar version in force at ``instant`` if it excludes that instant, else None.

    ``history`` is (changed_at, version) in ascending order; the version in
    force is the last one changed at or before the instant (the first one for
    instants before it existed). For a reconciler or a timeline that must tell
    an excluded slot from a missing one: the materializer used the version
    current when it materialized the slot, at most its horizon earlier.
    """
    if not history:
        return None
    in_force = history[0][1]
    for changed_at, calendar in history:
        if changed_at > instant:
            break
        in_force = calendar
    exclusions = _exclusions(in_force, in_force.zone_for(schedule_zone))
    return in_force if exclusions.containing(naive_utc(instant, "instant")) is not None else None

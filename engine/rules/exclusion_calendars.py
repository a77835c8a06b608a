"""Exclusion calendars: named lists of local dates on which a schedule does not fire.

A calendar is a tenant's named, versioned list of dates and inclusive date
ranges, read on one clock: its own ``time_zone``, or, when it has none, the
clock of each schedule that references it. A fire instant is excluded when
its date on that clock is listed (docs/time-contract.md, "Exclusion
calendars"). Excluding acts on the fire instants that the schedule's rules,
daylight-saving options and bounds produce; it never moves a fire elsewhere.

This module holds the value (:class:`ExclusionCalendar`) and turns it into
the exact set of UTC instants it excludes in a zone
(:func:`excluded_intervals`): half-open intervals, found from each range's
boundary midnights with zoneinfo, so that a midnight inside a daylight-saving
gap (America/Havana) or a repeated hour that crosses midnight is exact.
Pure: no I/O beyond zone data, no clock.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

MAX_ENTRIES = 10_000
"""Entries (dates or ranges) per calendar: decades of holidays fit many times over."""
FIRST_YEAR, LAST_YEAR = 1900, 8999
_DAY = timedelta(days=1)
_SECOND = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class CalendarEntry:
    """One listed date (``start == end``) or inclusive range, with an optional label (a holiday's name)."""

    start: date
    end: date
    label: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class ExclusionCalendar:
    """A calendar as one immutable value.

    ``time_zone`` None means "on the clock of the schedule that references
    it". Equality and hashing use (name, version, zone, a digest of the
    entries), so a spec carrying a calendar of ten thousand dates stays a
    cheap cache key; the merged ranges are computed once, at construction.
    """

    name: str
    version: int
    time_zone: str | None
    entries: tuple[CalendarEntry, ...]
    digest: str = field(default="", compare=False)
    ranges: tuple[tuple[date, date], ...] = field(default=(), init=False, compare=False, repr=False)
    _by_start: tuple[CalendarEntry, ...] = field(default=(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.digest:
            text = "\n".join(f"{e.start.isoformat()}/{e.end.isoformat()}" for e in self.entries)
            object.__setattr__(self, "digest", hashlib.sha256(text.encode()).hexdigest()[:32])
        by_start = tuple(sorted(self.entries, key=lambda e: (e.start, e.end)))
        object.__setattr__(self, "_by_start", by_start)
        object.__setattr__(self, "ranges", _merged(by_start))

    def _key(self) -> tuple[str, int, str | None, str]:
        return (self.name, self.version, self.time_zone, self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExclusionCalendar) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def zone_for(self, schedule_zone: str) -> str:
        """The clock this calendar is read on for a schedule in ``schedule_zone``."""
        return self.time_zone or schedule_zone

    def excludes(self, day: date) -> bool:
        """Whether ``day`` is listed."""
        ranges = self.ranges
        index = bisect_right(ranges, (day, date.max)) - 1
        return index >= 0 and ranges[index][0] <= day <= ranges[index][1]

    def entries_between(self, first: date, last: date) -> list[CalendarEntry]:
        """Entries that list at least one day from ``first`` to ``last`` (inclusive), ordered by start."""
        by_start = self._by_start
        stop = bisect_right(by_start, last, key=lambda e: e.start)
        return [e for e in by_start[:stop] if e.end >= first]

    def label_for(self, day: date) -> str | None:
        """The label of the earliest-starting entry that lists ``day`` and has one."""
        ranges = self.ranges
        index = bisect_right(ranges, (day, date.max)) - 1
        if index < 0 or not ranges[index][0] <= day <= ranges[index][1]:
            return None
        by_start = self._by_start  # only entries starting inside day's merged range can list it
        low = bisect_left(by_start, ranges[index][0], key=lambda e: e.start)
        high = bisect_right(by_start, day, key=lambda e: e.start)
        return next((e.label for e in by_start[low:high] if e.end >= day and e.label), None)


def merged_ranges(entries: tuple[CalendarEntry, ...]) -> tuple[tuple[date, date], ...]:
    """Sorted, disjoint ranges; overlapping and adjacent ones are joined (21-22 and 23-24 make 21-24)."""
    return _merged(sorted(entries, key=lambda e: (e.start, e.end)))


def _merged(by_start: tuple[CalendarEntry, ...] | list[CalendarEntry]) -> tuple[tuple[date, date], ...]:
    merged: list[list[date]] = []
    for entry in by_start:
        if merged and entry.start <= merged[-1][1] + _DAY:
            if entry.end > merged[-1][1]:
                merged[-1][1] = entry.end
        else:
            merged.append([entry.start, entry.end])
    return tuple((start, end) for start, end in merged)


def entries_to_stored(entries: tuple[CalendarEntry, ...]) -> list[list[Any]]:
    """The stored form (calendar_versions.entries): ``[[start, end, label], ...]``."""
    return [[e.start.isoformat(), e.end.isoformat(), e.label] for e in entries]


def entries_from_stored(stored: list[list[Any]]) -> tuple[CalendarEntry, ...]:
    return tuple(
        CalendarEntry(date.fromisoformat(start), date.fromisoformat(end), label) for start, end, label in stored
    )


# --------------------------------------------------------------------------- instants


Interval = tuple[datetime, datetime]
"""[start, end) in naive UTC."""


@lru_cache(maxsize=512)
def excluded_intervals(calendar: ExclusionCalendar, zone_key: str) -> tuple[Interval, ...]:
    """Every UTC instant whose local date in ``zone_key`` the calendar lists, as sorted disjoint intervals.

    Exact: an instant t is in an interval iff the date of t on the zone's
    clock is listed. Memoized per (calendar version, zone).
    """
    zone = ZoneInfo(zone_key)
    pieces: list[Interval] = []
    for first, last in calendar.ranges:
        begin, begin_hole = _date_begins(zone, first)
        after, after_hole = (
            _date_begins(zone, last + _DAY) if last < date(LAST_YEAR, 12, 31) else (datetime(LAST_YEAR + 1, 1, 2), None)
        )
        # {date >= first} = [begin, oo) minus begin_hole; {date > last} = [after, oo) minus after_hole.
        span = [(begin, after)]
        if after_hole is not None:
            span.append(after_hole)
        for piece in span:
            pieces.extend(_minus(piece, begin_hole))
    return _normalized(pieces)


def _date_begins(zone: ZoneInfo, day: date) -> tuple[datetime, Interval | None]:
    """Where the local date ``day`` begins: the first instant whose date is >= ``day``, and a hole.

    The hole is the stretch after that instant whose date is back before
    ``day``: a repeated hour that crosses midnight (the clock reaches 00:00,
    then goes back to the previous evening). None when there is none.
    """
    midnight = datetime(day.year, day.month, day.day)
    off0 = midnight.replace(tzinfo=zone).utcoffset()
    off1 = midnight.replace(tzinfo=zone, fold=1).utcoffset()
    assert off0 is not None and off1 is not None
    if off0 == off1:
        return midnight - off0, None
    if off0 < off1:
        # Midnight does not exist (spring forward over it): the date begins at the transition.
        return _transition(zone, midnight - off1, midnight - off0), None
    # Midnight happens twice: the date begins at the first; between the transition
    # and the second midnight the clock shows the previous date again.
    first, second = midnight - off0, midnight - off1
    back = _transition(zone, first, second)
    return first, ((back, second) if back < second else None)


def _transition(zone: ZoneInfo, low: datetime, high: datetime) -> datetime:
    """The first whole second in (low, high] that has the offset of ``high`` (a transition lies in between)."""

    def offset(instant: datetime) -> timedelta | None:
        return zone.fromutc(instant.replace(tzinfo=zone)).utcoffset()

    target = offset(high)
    below, above = 0, int((high - low) / _SECOND)
    while above - below > 1:
        middle = (below + above) // 2
        if offset(low + middle * _SECOND) == target:
            above = middle
        else:
            below = middle
    return low + above * _SECOND


def _minus(piece: Interval, hole: Interval | None) -> list[Interval]:
    start, end = piece
    if hole is None or hole[1] <= start or hole[0] >= end:
        return [piece] if start < end else []
    found = []
    if start < hole[0]:
        found.append((start, hole[0]))
    if hole[1] < end:
        found.append((hole[1], end))
    return found


def _normalized(pieces: list[Interval]) -> tuple[Interval, ...]:
    result: list[list[datetime]] = []
    for start, end in sorted(p for p in pieces if p[0] < p[1]):
        if result and start <= result[-1][1]:
            result[-1][1] = max(result[-1][1], end)
        else:
            result.append([start, end])
    return tuple((start, end) for start, end in result)

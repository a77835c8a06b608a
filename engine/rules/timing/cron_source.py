"""Cron evaluated in local wall-clock time, with the daylight-saving rules of the contract.

A local time that does not exist (spring forward) is skipped (``dst_gap="skip"``)
or fires at the first instant after the gap (``dst_gap="shift"``); a wall time
that occurs twice (fall back) fires at the earlier instant
(``dst_repeat="first"``) or at both (``dst_repeat="both"``).

Evaluation walks the matching local calendar days (skipping non-matching
months and days without looking at them) and the matching wall times of each,
and resolves each wall time to instants with zoneinfo's PEP 495 ``fold``. Two
assumptions about zone data, true of every zone since 1900: UTC offsets lie in
[-12h, +14h], and a zone never changes its offset twice within six hours.
Instants are naive UTC.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from functools import lru_cache
from itertools import islice
from zoneinfo import ZoneInfo

from engine.rules.cron_expression import CronExpression, parse_cron
from engine.rules.timing.instants import CEILING, DAY, EPOCH, FLOOR, MICROSECOND
from engine.rules.timing.zones import zone_info

_MINUTE = timedelta(minutes=1)
# A valid expression fires within ~40 years (Feb 29 on a given weekday); the
# Gregorian calendar repeats every 400, so a 400-year scan finding nothing is final.
_SCAN_DAYS = 146_097
# Offsets are sampled every six hours over 30 hours to find the lowest/highest
# offset near an instant (see the module docstring for why that is enough).
_OFFSET_SAMPLES = tuple(timedelta(hours=h) for h in (6, 12, 18, 24, 30))
_MAX_OFFSET = timedelta(hours=14)
_COUNT_LIMIT = timedelta(days=3660)  # counting missed cron fires over longer spans answers "unknown"


class CronSource:
    """Cron evaluated in local wall-clock time with the DST rules of the contract."""

    __slots__ = ("cron", "zone", "both", "shift", "hours_minutes", "hours_minutes_descending")

    def __init__(self, cron: CronExpression, zone: ZoneInfo, both: bool, shift: bool) -> None:
        self.cron = cron
        self.zone = zone
        self.both = both
        self.shift = shift
        self.hours_minutes = tuple(divmod(m, 60) for m in cron.times)
        self.hours_minutes_descending = self.hours_minutes[::-1]

    def _offset_at(self, instant: datetime) -> timedelta:
        """The zone's UTC offset at a (naive UTC) instant."""
        local = self.zone.fromutc(instant.replace(tzinfo=self.zone))
        return local.utcoffset()  # type: ignore[return-value]

    def resolve(self, wall: datetime) -> tuple[tuple[datetime, ...], datetime | None, datetime | None]:
        """The fire instants of one matching local wall time, plus ordering bounds.

        Returns (instants, earliest, latest): ``earliest`` is a lower bound of
        every instant of every later wall time and ``latest`` an upper bound of
        every instant of every earlier one (both are monotonic in the wall time),
        or None when the wall time is skipped and gives no bound.
        """
        zone = self.zone
        off0 = wall.replace(tzinfo=zone).utcoffset()
        off1 = wall.replace(tzinfo=zone, fold=1).utcoffset()
        assert off0 is not None and off1 is not None
        if off0 == off1:
            instant = wall - off0
            return (instant,), instant, instant
        first = wall - off0  # PEP 495: fold=0 uses the offset from before the transition
        second = wall - off1
        if off0 > off1:
            # The clock went back: this wall time happens at `first` and again at `second`.
            if self.both:
                return (first, second), first, second
            return (first,), first, first
        # The clock jumped forward over this wall time: it does not exist.
        if self.shift:
            instant = _gap_end(zone, second, first)
            return (instant,), instant, instant
        return (), None, None

    def _days_forward(self, first_day: date, last_day: date) -> Iterator[date]:
        """Matching local days from ``first_day`` to ``last_day``; a non-matching month costs one lookup."""
        month_days = self.cron.month_days
        year, month = first_day.year, first_day.month
        numbers = month_days(year, month)
        numbers = numbers[bisect_left(numbers, first_day.day) :]
        while True:
            for number in numbers:
                current = date(year, month, number)
                if current > last_day:
                    return
                yield current
            month += 1
            if month == 13:
                year, month = year + 1, 1
            if (year, month) > (last_day.year, last_day.month):
                return
            numbers = month_days(year, month)

    def _days_backward(self, last_day: date, first_day: date) -> Iterator[date]:
        month_days = self.cron.month_days
        year, month = last_day.year, last_day.month
        numbers = month_days(year, month)
        numbers = numbers[: bisect_right(numbers, last_day.day)]
        while True:
            for number in reversed(numbers):
                current = date(year, month, number)
                if current < first_day:
                    return
                yield current
            month -= 1
            if month == 0:
                year, month = year - 1, 12
            if (year, month) < (first_day.year, first_day.month):
                return
            numbers = month_days(year, month)

    def _start_forward(self, after: datetime) -> datetime:
        """The earliest wall time that can fire strictly after ``after``.

        Wall times below after + (lowest offset in the next 30 h) cannot, and
        starting there instead of a day earlier keeps "* * * * *" cheap.
        """
        offset = self._offset_at(after)
        wall = after + offset
        day = wall.date()
        if self.plain_offset(day) == offset and self.plain_offset(day + DAY) == offset:
            return wall  # no transition today or tomorrow: the common case, two memo lookups
        lowest = min(offset, *(self._offset_at(after + step) for step in _OFFSET_SAMPLES))
        return after + lowest

    def _start_backward(self, before: datetime) -> datetime:
        """The latest wall time that can fire strictly before ``before`` (mirror of _start_forward)."""
        offset = self._offset_at(before)
        wall = before + offset
        day = wall.date()
        if self.plain_offset(day) == offset and self.plain_offset(day - DAY) == offset:
            return wall
        highest = max(offset, *(self._offset_at(before - step) for step in _OFFSET_SAMPLES))
        return before + highest

    def forward(self, after: datetime, until: datetime | None) -> Iterator[datetime]:
        start = self._start_forward(after).replace(second=0, microsecond=0)
        start_day = start.date()
        first_index = bisect_left(self.cron.times, start.hour * 60 + start.minute)
        limit = (until + _MAX_OFFSET + DAY).date() if until is not None else start_day + timedelta(_SCAN_DAYS)
        all_times = self.hours_minutes
        # Instants come out of wall-time order only for the second pass of a repeated
        # hour with dst_repeat="both"; a small heap restores the order, and an
        # instant is released once no later wall time can produce an earlier one.
        pending: list[datetime] = []
        last: datetime | None = None
        for day in self._days_forward(start_day, min(limit, CEILING.date())):
            year, month, number = day.year, day.month, day.day
            # islice, not a slice: the first day is often abandoned after one fire
            times = islice(all_times, first_index, None) if day == start_day else all_times
            offset = self.plain_offset(day)
            if offset is not None and not pending:
                for hour, minute in times:  # fast path: no transition this day
                    instant = datetime(year, month, number, hour, minute) - offset
                    if instant > after and instant != last:
                        last = instant
                        yield instant
                continue
            for hour, minute in times:
                instants, earliest, _ = self.resolve(datetime(year, month, number, hour, minute))
                for instant in instants:
                    if instant > after:
                        heapq.heappush(pending, instant)
                if earliest is not None:
                    while pending and pending[0] <= earliest:
                        instant = heapq.heappop(pending)
                        if instant != last:  # shifted gap times collapse onto one instant
                            last = instant
                            yield instant
        yield from _drain_ascending(pending, last)

    def backward(self, before: datetime, since: datetime | None) -> Iterator[datetime]:
        start = self._start_backward(before)
        start_day = start.date()
        last_index = bisect_right(self.cron.times, start.hour * 60 + start.minute)
        limit = (since - _MAX_OFFSET - DAY).date() if since is not None else start_day - timedelta(_SCAN_DAYS)
        all_times = self.hours_minutes_descending
        count = len(all_times)
        pending: list[timedelta] = []  # max-heap of instants, stored as EPOCH - instant
        last: datetime | None = None
        for day in self._days_backward(start_day, max(limit, FLOOR.date())):
            year, month, number = day.year, day.month, day.day
            times = islice(all_times, count - last_index, None) if day == start_day else all_times
            offset = self.plain_offset(day)
            if offset is not None and not pending:
                for hour, minute in times:
                    instant = datetime(year, month, number, hour, minute) - offset
                    if instant < before and instant != last:
                        last = instant
                        yield instant
                continue
            for hour, minute in times:
                instants, _, latest = self.resolve(datetime(year, month, number, hour, minute))
                for instant in instants:
                    if instant < before:
                        heapq.heappush(pending, EPOCH - instant)
                if latest is not None:
                    while pending and EPOCH - pending[0] >= latest:
                        instant = EPOCH - heapq.heappop(pending)
                        if instant != last:
                            last = instant
                            yield instant
        yield from _drain_descending(pending, last)

    def plain_offset(self, day: date) -> timedelta | None:
        """The UTC offset of a local day without any transition, or None for a transition day (memoized per zone)."""
        days = _PLAIN_DAYS.get(self.zone)
        if days is None:
            days = _PLAIN_DAYS.setdefault(self.zone, {})
        found = days.get(day, _UNKNOWN)
        if found is _UNKNOWN:
            if len(days) > 100_000:  # bounded
                days.clear()
            found = days[day] = self._compute_plain_offset(day)
        return found  # type: ignore[return-value]

    def _compute_plain_offset(self, day: date) -> timedelta | None:
        zone = self.zone
        midnight = datetime(day.year, day.month, day.day)
        offset = midnight.replace(tzinfo=zone).utcoffset()
        following = midnight + DAY
        if (
            offset is None
            or midnight.replace(tzinfo=zone, fold=1).utcoffset() != offset
            or following.replace(tzinfo=zone).utcoffset() != offset
            or following.replace(tzinfo=zone, fold=1).utcoffset() != offset
        ):
            return None
        instant = midnight - offset
        for step in _OFFSET_SAMPLES[:3]:  # 6h, 12h, 18h: no transition went there and back
            if self._offset_at(instant + step) != offset:
                return None
        return offset

    def count(self, low: datetime, high: datetime) -> int | None:
        """Exact count in O(days): plain days by arithmetic, transition days by enumeration."""
        if high - low <= MICROSECOND:
            return 0
        if high - low > _COUNT_LIMIT:
            return None
        times = self.cron.times
        total = 0
        cursor = low  # every instant <= cursor has been counted (or is out of range)
        day = (low + self._offset_at(low)).date() - 2 * DAY
        last_day = (high + self._offset_at(high)).date() + 2 * DAY
        while day <= last_day:
            offset = self.plain_offset(day)
            if offset is not None:
                midnight = datetime(day.year, day.month, day.day)
                span_start = midnight - offset
                if span_start - cursor > MICROSECOND:
                    # The transition days before this plain one: enumerate them.
                    total += self._count_by_enumeration(cursor, min(span_start, high))
                if day.day in self.cron.month_days(day.year, day.month):
                    below = (cursor + offset - midnight) // _MINUTE  # minutes m with m <= below are out
                    above = -((midnight - high - offset) // _MINUTE)  # minutes m with m >= above are out
                    total += max(0, bisect_left(times, above) - bisect_right(times, below))
                cursor = max(cursor, span_start + DAY - MICROSECOND)
                if cursor >= high:
                    return total
            day += DAY
        if high - cursor > MICROSECOND:
            total += self._count_by_enumeration(cursor, high)
        return total

    def _count_by_enumeration(self, low: datetime, high: datetime) -> int:
        found = 0
        for instant in self.forward(low, high):
            if instant >= high:
                break
            found += 1
        return found


def _drain_ascending(pending: list[datetime], last: datetime | None) -> Iterator[datetime]:
    """What a min-heap of instants still holds, ascending, never repeating ``last`` or an instant."""
    while pending:
        instant = heapq.heappop(pending)
        if instant != last:
            last = instant
            yield instant


def _drain_descending(pending: list[timedelta], last: datetime | None) -> Iterator[datetime]:
    """What a max-heap of instants (stored as ``EPOCH - instant``) still holds, descending, without repeats."""
    while pending:
        instant = EPOCH - heapq.heappop(pending)
        if instant != last:
            last = instant
            yield instant


_UNKNOWN = object()
# zone -> local day -> offset of a day without transition (None: a transition day).
# Shared by every expression in the zone; bounded per zone.
_PLAIN_DAYS: dict[ZoneInfo, dict[date, timedelta | None]] = {}


@lru_cache(maxsize=65_536)
def _gap_end(zone: ZoneInfo, before: datetime, after: datetime) -> datetime:
    """The first whole second in (before, after] with the post-transition offset."""

    def offset(instant: datetime) -> timedelta | None:
        return zone.fromutc(instant.replace(tzinfo=zone)).utcoffset()

    target = offset(after)
    low, high = 0, int((after - before).total_seconds())
    while high - low > 1:  # offset(before + low) != target == offset(before + high)
        middle = (low + high) // 2
        if offset(before + timedelta(seconds=middle)) == target:
            high = middle
        else:
            low = middle
    return before + timedelta(seconds=high)


@lru_cache(maxsize=16_384)
def cron_source(expression: str, time_zone: str, both: bool, shift: bool) -> CronSource:
    """Compiled once per (expression, zone, DST options) and shared by every schedule using them."""
    return CronSource(parse_cron(expression), zone_info(time_zone), both, shift)


def clear_cron_caches() -> None:
    """Forget compiled expressions, gap ends and plain days."""
    cron_source.cache_clear()
    _gap_end.cache_clear()
    _PLAIN_DAYS.clear()

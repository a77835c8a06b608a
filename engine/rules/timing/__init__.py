"""When schedules fire: the time contract of chronoq (see docs/time-contract.md).

Everything here is pure: no I/O beyond loading zone data, no wall clock (every
"now"/"after" is an argument), no process-dependent ``hash()``.

The contract:

* ``cron`` is evaluated in the local wall-clock time of the schedule's IANA
  zone. A local time that does not exist (spring forward) is skipped
  (``dst_gap="skip"``, default) or fires at the first instant after the gap
  (``dst_gap="shift"``; several nonexistent times, and a regular fire at that
  instant, collapse onto one fire). A wall time that occurs twice (fall back)
  fires once at the earlier instant (``dst_repeat="first"``, default) or at
  both instants (``dst_repeat="both"``).
* ``rate`` fires at ``anchor + k * period`` (k = 0, 1, ...) of elapsed time and
  ignores daylight saving. Without an anchor it is anchored at ``start_at``,
  else at 1970-01-01T00:00Z (so "15m" fires at :00, :15, :30, :45 UTC).
* ``once`` fires at one instant.
* ``start_at`` and ``end_at`` are inclusive bounds on the fire instants.

Instants are aware UTC datetimes at the API; inside, fire computation works on
naive UTC datetimes (cheaper to compare and hash). Fire times are computed for
instants between 1800 and 9000 (beyond, a schedule counts as exhausted).

Cron evaluation walks the matching local calendar days (skipping non-matching
months and days without looking at them) and the matching wall times of each,
and resolves each wall time to instants with zoneinfo's PEP 495 ``fold``. Two
assumptions about zone data, true of every zone since 1900: UTC offsets lie in
[-12h, +14h], and a zone never changes its offset twice within six hours.
"""

from __future__ import annotations

import hashlib
import heapq
import re
import uuid
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from functools import lru_cache
from itertools import islice
from typing import Iterator, Literal, Protocol
from zoneinfo import ZoneInfo, available_timezones

from engine.rules.cron_expression import MAX_EXPRESSION_LENGTH, CronExpression, normalize_cron, parse_cron
from schemas.errors import InvalidInput

__all__ = [
    "Kind", "TimeSpec", "FirePreview", "MisfirePolicy", "MisfireDecision", "MAX_EXPRESSION_LENGTH",
    "build_time_spec", "parse_duration", "next_fire_after", "fire_times", "previous_fire_before", "preview",
    "jitter_offset", "smallest_gap", "fires_per_minute", "parse_misfire_policy", "decide_misfire",
    "next_fire_cache_info", "clear_time_caches",
]

Kind = Literal["once", "cron", "rate"]
KINDS: tuple[str, ...] = ("once", "cron", "rate")
DST_REPEAT_CHOICES: tuple[str, ...] = ("first", "both")
DST_GAP_CHOICES: tuple[str, ...] = ("skip", "shift")
MISFIRE_KINDS: tuple[str, ...] = ("skip", "fire_once", "catch_up")
MAX_CATCH_UP = 1000
MAX_DURATION = timedelta(days=3660)

UTC = timezone.utc
_EPOCH = datetime(1970, 1, 1)
_US = timedelta(microseconds=1)
_MINUTE = timedelta(minutes=1)
_DAY = timedelta(days=1)
_FLOOR = datetime(1800, 1, 1)    # instants considered: [_FLOOR, _CEILING]
_CEILING = datetime(9000, 1, 1)
_INPUT_YEARS = (1900, 8999)      # accepted years of user-given instants
# A valid expression fires within ~40 years (Feb 29 on a given weekday); the
# Gregorian calendar repeats every 400, so a 400-year scan finding nothing is final.
_SCAN_DAYS = 146_097
# Offsets are sampled every six hours over 30 hours to find the lowest/highest
# offset near an instant (see the module docstring for why that is enough).
_OFFSET_SAMPLES = tuple(timedelta(hours=h) for h in (6, 12, 18, 24, 30))
_MAX_OFFSET = timedelta(hours=14)
_COUNT_LIMIT = timedelta(days=3660)  # counting missed cron fires over longer spans answers "unknown"


# --------------------------------------------------------------------------- types


@dataclass(frozen=True, slots=True)
class TimeSpec:
    """When a schedule fires. Build it with :func:`build_time_spec` (which validates).

    Hashable: used as a cache key. ``start_at``/``end_at``/``anchor`` are aware UTC.
    """

    kind: Kind
    expression: str               # cron text, ISO-8601 instant, or duration like "15m"/"1h30m"
    time_zone: str = "UTC"        # IANA key
    dst_repeat: Literal["first", "both"] = "first"
    dst_gap: Literal["skip", "shift"] = "skip"
    anchor: datetime | None = None     # rate only: fires at anchor + k*period
    start_at: datetime | None = None   # inclusive bound (aware UTC)
    end_at: datetime | None = None     # inclusive bound (aware UTC)


@dataclass(frozen=True, slots=True)
class FirePreview:
    """One fire: the UTC instant and the same instant on the schedule's local clock."""

    utc: datetime    # aware UTC
    local: datetime  # aware, in the schedule's zone, with the right fold/offset


@dataclass(frozen=True, slots=True)
class MisfirePolicy:
    """What to do with fire instants that are more than ``max_lateness`` late."""

    kind: Literal["skip", "fire_once", "catch_up"]
    catch_up_limit: int = 0           # K for catch_up
    max_lateness: timedelta = timedelta(minutes=1)


@dataclass(frozen=True)
class MisfireDecision:
    """What a materializer does with the fire instants from the durable cursor up to now + horizon."""

    enqueue: list[datetime]      # scheduled_for instants to materialize as occurrences (oldest first)
    missed: list[datetime]       # instants to record as MISSED (at most record_limit of them, oldest first)
    missed_unlisted: int | None  # how many further missed instants were not listed (None = more, count unknown)
    next_run_at: datetime | None  # the durable cursor after this decision: first fire strictly after `until`


# --------------------------------------------------------------------------- validation


def build_time_spec(kind: str, expression: str, time_zone: str | None = None, *,
                    dst_repeat: str | None = None, dst_gap: str | None = None,
                    anchor: datetime | str | None = None, start_at: datetime | str | None = None,
                    end_at: datetime | str | None = None) -> TimeSpec:
    """Validate and normalize a schedule's time fields, or raise :class:`InvalidInput`.

    ``InvalidInput.field`` is the API field at fault. A ``once`` instant in the
    past is accepted: whether it is too late is decided with the control
    plane's clock, not here.
    """
    if not isinstance(kind, str) or kind.strip() not in KINDS:
        shown = kind.strip()[:40] if isinstance(kind, str) else type(kind).__name__
        raise InvalidInput("kind", f"must be once, cron or rate; got {shown!r}", "cron")
    kind_value: Kind = kind.strip()  # type: ignore[assignment]
    examples = {"cron": "0 9 * * MON-FRI", "rate": "15m", "once": "2027-03-01T09:00:00Z"}
    if not isinstance(expression, str):
        raise InvalidInput("expression", f"must be a string, got {type(expression).__name__}", examples[kind_value])
    stripped = expression.strip()
    if len(stripped) > MAX_EXPRESSION_LENGTH:
        raise InvalidInput("expression", f"is {len(stripped)} characters long; the limit is"
                           f" {MAX_EXPRESSION_LENGTH}", examples[kind_value])
    if not stripped:
        raise InvalidInput("expression", "is empty", examples[kind_value])
    zone_key = _validate_zone(time_zone if time_zone is not None else "UTC")
    repeat = _choice("dst_repeat", dst_repeat, DST_REPEAT_CHOICES)
    gap = _choice("dst_gap", dst_gap, DST_GAP_CHOICES)
    if kind_value != "cron":
        if repeat != "first":
            raise InvalidInput("dst_repeat", f"applies only to kind cron ({kind_value} ignores wall-clock time);"
                               " leave it out", "first")
        if gap != "skip":
            raise InvalidInput("dst_gap", f"applies only to kind cron ({kind_value} ignores wall-clock time);"
                               " leave it out", "skip")
    anchor_at = _parse_instant(anchor, "anchor") if anchor is not None else None
    if anchor_at is not None and kind_value != "rate":
        raise InvalidInput("anchor", "applies only to kind rate; leave it out", "2027-01-01T00:00:00Z")
    start = _parse_instant(start_at, "start_at") if start_at is not None else None
    end = _parse_instant(end_at, "end_at") if end_at is not None else None
    if start is not None and end is not None and end < start:
        raise InvalidInput("end_at", f"{_iso(end)} is before start_at {_iso(start)}", _iso(start + _DAY))

    if kind_value == "cron":
        text = normalize_cron(stripped)
        parse_cron(text)
    elif kind_value == "rate":
        text = stripped
        period = parse_duration(text, "expression")
        if period <= timedelta(0):
            raise InvalidInput("expression", "a rate period must be at least 1s", "15m")
    else:
        text = stripped
        instant = _parse_instant(text, "expression")
        if start is not None and instant < start:
            raise InvalidInput("start_at", f"is after the one-time instant {_iso(instant)}; the schedule could"
                               " never fire", _iso(instant))
        if end is not None and instant > end:
            raise InvalidInput("end_at", f"is before the one-time instant {_iso(instant)}; the schedule could"
                               " never fire", _iso(instant))
    spec = TimeSpec(kind_value, text, zone_key, repeat, gap, anchor_at, start, end)  # type: ignore[arg-type]
    if kind_value != "once" and start is not None and end is not None:
        if next_fire_after(spec, start - _US) is None:
            raise InvalidInput("end_at", f"there is no fire time between start_at {_iso(start)} and end_at"
                               f" {_iso(end)}; move end_at later", _iso(end + timedelta(days=30)))
    return spec


_DURATION = re.compile(r"^(?:(\d{1,7})d)?(?:(\d{1,7})h)?(?:(\d{1,7})m)?(?:(\d{1,7})s)?$")


def parse_duration(text: str, field: str = "expression") -> timedelta:
    """Parse ``"90s"``, ``"15m"``, ``"1h"``, ``"1d"``, ``"1h30m"``, ``"2d12h"`` (units in d h m s order).

    Whole seconds only, zero allowed (callers that need a positive value say so),
    at most 3660 days. Raises :class:`InvalidInput` for ``field``.
    """
    if not isinstance(text, str):
        raise InvalidInput(field, f"must be a duration string, got {type(text).__name__}", "1h30m")
    raw = "".join(text.split()).lower()
    shown = text.strip()[:30]
    if not raw:
        raise InvalidInput(field, "is empty; give a duration with units d, h, m, s", "15m")
    if raw.startswith("-"):
        raise InvalidInput(field, f"{shown!r} is negative; a duration must be positive", "15m")
    if re.fullmatch(r"\d+", raw):
        raise InvalidInput(field, f"{shown!r} has no unit; use d, h, m or s", f"{raw}s")
    if re.search(r"\d(ms|us|µs|ns)$", raw) or re.search(r"\d[.,]\d", raw):
        raise InvalidInput(field, f"{shown!r} is fractional or below one second; the smallest unit is 1s", "1s")
    match = _DURATION.match(raw)
    if match is None or not any(match.groups()):
        raise InvalidInput(field, f"{shown!r} is not a duration; write numbers with units d, h, m, s in that"
                           " order", "1h30m")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    total = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if total > MAX_DURATION:
        raise InvalidInput(field, f"{shown!r} is longer than the limit of {MAX_DURATION.days}d", "30d")
    return total


def _choice(field: str, value: object, choices: tuple[str, ...]) -> str:
    if value is None:
        return choices[0]
    if not isinstance(value, str) or value.strip() not in choices:
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise InvalidInput(field, f"must be {' or '.join(choices)}; got {shown!r}", choices[0])
    return value.strip()


_ZONE_KEY = re.compile(r"^[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*$")
# Files in the zone directory that are not zones: "localtime" is whatever the
# host is set to, "Factory" means "zone not configured".
_NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})


@lru_cache(maxsize=1)
def _zone_keys() -> frozenset[str]:
    return frozenset(available_timezones()) - _NOT_ZONES


def _validate_zone(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput("time_zone", f"must be an IANA zone name, got {type(value).__name__}", "Europe/Berlin")
    key = value.strip()
    if not key:
        raise InvalidInput("time_zone", "is empty; give an IANA zone name", "Europe/Berlin")
    # Checked before any lookup so that "../etc/passwd" never reaches the file system.
    if len(key) > 64 or not _ZONE_KEY.match(key):
        raise InvalidInput("time_zone", f"{key[:64]!r} is not an IANA zone name", "America/New_York")
    if key not in _zone_keys():
        folded = {k.lower(): k for k in _zone_keys()}
        hint = f"; did you mean {folded[key.lower()]!r}?" if key.lower() in folded else ""
        raise InvalidInput("time_zone", f"{key!r} is not a known IANA zone{hint}", "America/New_York")
    return key


def _parse_instant(value: object, field: str) -> datetime:
    """An aware instant from a datetime or ISO-8601 text, normalized to UTC."""
    example = "2027-03-01T09:00:00Z"
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidInput(field, f"{text[:40]!r} is not an ISO-8601 instant", example) from None
    elif isinstance(value, datetime):
        parsed = value
    else:
        raise InvalidInput(field, f"must be an ISO-8601 instant, got {type(value).__name__}", example)
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidInput(field, f"{parsed.isoformat()!r} has no UTC offset; add an offset or Z", example)
    try:
        instant = parsed.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(field, "is out of range", example) from None
    if not _INPUT_YEARS[0] <= instant.year <= _INPUT_YEARS[1]:
        raise InvalidInput(field, f"year {instant.year} is outside {_INPUT_YEARS[0]}-{_INPUT_YEARS[1]}", example)
    return instant


def _iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


# --------------------------------------------------------------------------- fire sources
#
# A source enumerates the fire instants of a spec without its start/end bounds
# (bounds are applied once, in _forward/_backward/_count). Instants are naive UTC.


class _Source(Protocol):
    def forward(self, after: datetime, until: datetime | None) -> Iterator[datetime]:
        """Fire instants strictly after ``after`` in ascending order (may stop once past ``until``)."""

    def backward(self, before: datetime, since: datetime | None) -> Iterator[datetime]:
        """Fire instants strictly before ``before`` in descending order (may stop once before ``since``)."""

    def count(self, low: datetime, high: datetime) -> int | None:
        """How many fire instants t satisfy low < t < high; None when that is too costly to know."""


class _CronSource:
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
        numbers = numbers[bisect_left(numbers, first_day.day):]
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
        numbers = numbers[:bisect_right(numbers, last_day.day)]
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
        if self.plain_offset(day) == offset and self.plain_offset(day + _DAY) == offset:
            return wall  # no transition today or tomorrow: the common case, two memo lookups
        lowest = min(offset, *(self._offset_at(after + step) for step in _OFFSET_SAMPLES))
        return after + lowest

    def _start_backward(self, before: datetime) -> datetime:
        """The latest wall time that can fire strictly before ``before`` (mirror of _start_forward)."""
        offset = self._offset_at(before)
        wall = before + offset
        day = wall.date()
        if self.plain_offset(day) == offset and self.plain_offset(day - _DAY) == offset:
            return wall
        highest = max(offset, *(self._offset_at(before - step) for step in _OFFSET_SAMPLES))
        return before + highest

    def forward(self, after: datetime, until: datetime | None) -> Iterator[datetime]:
        start = self._start_forward(after).replace(second=0, microsecond=0)
        start_day = start.date()
        first_index = bisect_left(self.cron.times, start.hour * 60 + start.minute)
        limit = (until + _MAX_OFFSET + _DAY).date() if until is not None else start_day + timedelta(_SCAN_DAYS)
        all_times = self.hours_minutes
        # Instants come out of wall-time order only for the second pass of a repeated
        # hour with dst_repeat="both"; a small heap restores the order, and an
        # instant is released once no later wall time can produce an earlier one.
        pending: list[datetime] = []
        last: datetime | None = None
        for day in self._days_forward(start_day, min(limit, _CEILING.date())):
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
        while pending:
            instant = heapq.heappop(pending)
            if instant != last:
                last = instant
                yield instant

    def backward(self, before: datetime, since: datetime | None) -> Iterator[datetime]:
        start = self._start_backward(before)
        start_day = start.date()
        last_index = bisect_right(self.cron.times, start.hour * 60 + start.minute)
        limit = (since - _MAX_OFFSET - _DAY).date() if since is not None else start_day - timedelta(_SCAN_DAYS)
        all_times = self.hours_minutes_descending
        count = len(all_times)
        pending: list[timedelta] = []  # max-heap of instants, stored as _EPOCH - instant
        last: datetime | None = None
        for day in self._days_backward(start_day, max(limit, _FLOOR.date())):
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
                        heapq.heappush(pending, _EPOCH - instant)
                if latest is not None:
                    while pending and _EPOCH - pending[0] >= latest:
                        instant = _EPOCH - heapq.heappop(pending)
                        if instant != last:
                            last = instant
                            yield instant
        while pending:
            instant = _EPOCH - heapq.heappop(pending)
            if instant != last:
                last = instant
                yield instant

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
        following = midnight + _DAY
        if (offset is None or midnight.replace(tzinfo=zone, fold=1).utcoffset() != offset
                or following.replace(tzinfo=zone).utcoffset() != offset
                or following.replace(tzinfo=zone, fold=1).utcoffset() != offset):
            return None
        instant = midnight - offset
        for step in _OFFSET_SAMPLES[:3]:  # 6h, 12h, 18h: no transition went there and back
            if self._offset_at(instant + step) != offset:
                return None
        return offset

    def count(self, low: datetime, high: datetime) -> int | None:
        """Exact count in O(days): plain days by arithmetic, transition days by enumeration."""
        if high - low <= _US:
            return 0
        if high - low > _COUNT_LIMIT:
            return None
        times = self.cron.times
        total = 0
        cursor = low  # every instant <= cursor has been counted (or is out of range)
        day = (low + self._offset_at(low)).date() - 2 * _DAY
        last_day = (high + self._offset_at(high)).date() + 2 * _DAY
        while day <= last_day:
            offset = self.plain_offset(day)
            if offset is not None:
                midnight = datetime(day.year, day.month, day.day)
                span_start = midnight - offset
                if span_start - cursor > _US:
                    # The transition days before this plain one: enumerate them.
                    total += self._count_by_enumeration(cursor, min(span_start, high))
                if day.day in self.cron.month_days(day.year, day.month):
                    below = (cursor + offset - midnight) // _MINUTE        # minutes m with m <= below are out
                    above = -((midnight - high - offset) // _MINUTE)     # minutes m with m >= above are out
                    total += max(0, bisect_left(times, above) - bisect_right(times, below))
                cursor = max(cursor, span_start + _DAY - _US)
                if cursor >= high:
                    return total
            day += _DAY
        if high - cursor > _US:
            total += self._count_by_enumeration(cursor, high)
        return total

    def _count_by_enumeration(self, low: datetime, high: datetime) -> int:
        found = 0
        for instant in self.forward(low, high):
            if instant >= high:
                break
            found += 1
        return found


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


class _RateSource:
    """anchor + k * period, k >= 0: plain arithmetic, no calendar."""

    __slots__ = ("anchor", "period")

    def __init__(self, anchor: datetime, period: timedelta) -> None:
        self.anchor = anchor
        self.period = period

    def _first_index_after(self, instant: datetime) -> int:
        if instant < self.anchor:
            return 0
        return (instant - self.anchor) // self.period + 1

    def _last_index_before(self, instant: datetime) -> int:
        if instant <= self.anchor:
            return -1
        return (instant - self.anchor - _US) // self.period

    def forward(self, after: datetime, until: datetime | None) -> Iterator[datetime]:
        index = self._first_index_after(after)
        stop = min(until, _CEILING) if until is not None else _CEILING
        while True:
            instant = self.anchor + index * self.period
            if instant > stop:
                return
            yield instant
            index += 1

    def backward(self, before: datetime, since: datetime | None) -> Iterator[datetime]:
        index = self._last_index_before(min(before, _CEILING + _US))
        while index >= 0:
            instant = self.anchor + index * self.period
            if since is not None and instant < since:
                return
            yield instant
            index -= 1

    def count(self, low: datetime, high: datetime) -> int | None:
        return max(0, self._last_index_before(high) - self._first_index_after(low) + 1)


class _OnceSource:
    __slots__ = ("instant",)

    def __init__(self, instant: datetime) -> None:
        self.instant = instant

    def forward(self, after: datetime, until: datetime | None) -> Iterator[datetime]:
        if self.instant > after:
            yield self.instant

    def backward(self, before: datetime, since: datetime | None) -> Iterator[datetime]:
        if self.instant < before:
            yield self.instant

    def count(self, low: datetime, high: datetime) -> int | None:
        return int(low < self.instant < high)


@lru_cache(maxsize=16_384)
def _cron_source(expression: str, time_zone: str, both: bool, shift: bool) -> _CronSource:
    """Compiled once per (expression, zone, DST options) and shared by every schedule using them."""
    return _CronSource(parse_cron(expression), _zone(time_zone), both, shift)


@lru_cache(maxsize=1024)
def _zone(key: str) -> ZoneInfo:
    if key not in _zone_keys():  # specs can be built without build_time_spec (e.g. from a database row)
        _validate_zone(key)
    return ZoneInfo(key)


@lru_cache(maxsize=16_384)
def _rate_period(expression: str) -> timedelta:
    period = parse_duration(expression, "expression")
    if period <= timedelta(0):
        raise InvalidInput("expression", "a rate period must be at least 1s", "15m")
    return period


@lru_cache(maxsize=16_384)
def _once_instant(expression: str) -> datetime:
    return _parse_instant(expression, "expression").replace(tzinfo=None)


def _naive_utc(instant: datetime, name: str) -> datetime:
    if instant.tzinfo is None:
        raise ValueError(f"{name} must be an aware datetime (UTC), got naive {instant!r}")
    if instant.tzinfo is not UTC:
        instant = instant.astimezone(UTC)
    return instant.replace(tzinfo=None)


def _source(spec: TimeSpec) -> _Source:
    if spec.kind == "cron":
        return _cron_source(spec.expression, spec.time_zone, spec.dst_repeat == "both", spec.dst_gap == "shift")
    if spec.kind == "rate":
        if spec.anchor is not None:
            anchor = _naive_utc(spec.anchor, "anchor")
        elif spec.start_at is not None:
            anchor = _naive_utc(spec.start_at, "start_at")
        else:
            anchor = _EPOCH
        return _RateSource(anchor, _rate_period(spec.expression))
    if spec.kind == "once":
        return _OnceSource(_once_instant(spec.expression))
    raise InvalidInput("kind", f"must be once, cron or rate; got {str(spec.kind)[:40]!r}", "cron")


def _bounds(spec: TimeSpec) -> tuple[datetime | None, datetime | None]:
    start = _naive_utc(spec.start_at, "start_at") if spec.start_at is not None else None
    end = _naive_utc(spec.end_at, "end_at") if spec.end_at is not None else None
    return start, end


def _forward(spec: TimeSpec, after: datetime, until: datetime | None = None) -> Iterator[datetime]:
    """Bounded fire instants (naive UTC) strictly after ``after`` and not after ``until``, ascending."""
    start, end = _bounds(spec)
    if start is not None and start - _US > after:
        after = start - _US
    if end is not None and (until is None or end < until):
        until = end
    after = max(after, _FLOOR - _US)
    if after >= _CEILING or (until is not None and until <= after):
        return
    for instant in _source(spec).forward(after, until):
        if until is not None and instant > until:
            return
        yield instant


def _backward(spec: TimeSpec, before: datetime, since: datetime | None = None) -> Iterator[datetime]:
    """Bounded fire instants strictly before ``before`` and not before ``since``, descending."""
    start, end = _bounds(spec)
    if end is not None and end + _US < before:
        before = end + _US
    if start is not None and (since is None or start > since):
        since = start
    before = min(before, _CEILING + _US)
    if before <= _FLOOR or (since is not None and since >= before):
        return
    for instant in _source(spec).backward(before, since):
        if since is not None and instant < since:
            return
        yield instant


def _count(spec: TimeSpec, low: datetime, high: datetime) -> int | None:
    """Bounded fire instants t with low < t < high; None when unknown."""
    start, end = _bounds(spec)
    if start is not None:
        low = max(low, start - _US)
    if end is not None:
        high = min(high, end + _US)
    if high - low <= _US:
        return 0
    return _source(spec).count(low, high)


# --------------------------------------------------------------------------- public queries


def _next_cron_fire_uncached(expression: str, time_zone: str, both: bool, shift: bool,
                             after: datetime) -> datetime | None:
    """The unbounded next cron fire after an aware UTC instant, aware UTC."""
    low = after.replace(tzinfo=None)
    if low < _FLOOR:
        low = _FLOOR - _US
    if low >= _CEILING:
        return None
    found = next(_cron_source(expression, time_zone, both, shift).forward(low, None), None)
    return found.replace(tzinfo=UTC) if found is not None else None


# Memo of the unbounded next cron fire: at the top of an hour thousands of schedules share
# (expression, zone, DST options, cursor), and only the first pays for the calendar walk.
# Keys and values are aware UTC datetimes: datetime.replace costs more than the lookup.
_next_cron_fire = lru_cache(maxsize=65_536)(_next_cron_fire_uncached)


def _aware_utc(instant: datetime, name: str) -> datetime:
    if instant.tzinfo is UTC:
        return instant
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime (UTC), got naive {instant!r}")
    return instant.astimezone(UTC)


def next_fire_after(spec: TimeSpec, after: datetime, *, cached: bool = True) -> datetime | None:
    """The first fire instant strictly after ``after`` (aware UTC), or None when exhausted.

    Computed from ``after`` only (recovery passes the durable cursor, never
    "now"); an ``after`` exactly on a fire instant yields the next one.
    ``cached=False`` bypasses the shared memo (for benchmarks and tests).
    """
    if after.tzinfo is not UTC:
        after = _aware_utc(after, "after")
    start = spec.start_at
    if start is not None:
        start = _aware_utc(start, "start_at") - _US
        if start > after:
            after = start  # bounds shift the question, not the memo key: bounded specs share the memo
    if spec.kind == "cron":
        compute = _next_cron_fire if cached else _next_cron_fire_uncached
        found = compute(spec.expression, spec.time_zone, spec.dst_repeat == "both", spec.dst_gap == "shift", after)
    else:
        following = next(_forward(spec, after.replace(tzinfo=None)), None)
        found = following.replace(tzinfo=UTC) if following is not None else None
    end = spec.end_at
    if found is None or (end is not None and found > end):
        return None
    return found


def fire_times(spec: TimeSpec, after: datetime, limit: int, until: datetime | None = None) -> list[datetime]:
    """Up to ``limit`` fire instants strictly after ``after`` (and not after ``until``), ascending, aware UTC."""
    if limit < 0:
        raise ValueError("limit must not be negative")
    low = _naive_utc(after, "after")
    high = _naive_utc(until, "until") if until is not None else None
    return [instant.replace(tzinfo=UTC) for instant in islice(_forward(spec, low, high), limit)]


def previous_fire_before(spec: TimeSpec, before: datetime) -> datetime | None:
    """The last fire instant strictly before ``before`` (aware UTC), or None.

    Consistent with :func:`next_fire_after`: for a fire instant f,
    ``next_fire_after(spec, previous_fire_before(spec, f)) == f``.
    """
    found = next(_backward(spec, _naive_utc(before, "before")), None)
    return found.replace(tzinfo=UTC) if found is not None else None


def preview(spec: TimeSpec, after: datetime, count: int) -> list[FirePreview]:
    """The next ``count`` fires with their local wall-clock time (fold set for a repeated hour)."""
    zone = _zone(spec.time_zone)
    return [FirePreview(instant, instant.astimezone(zone)) for instant in fire_times(spec, after, count)]


def smallest_gap(spec: TimeSpec, after: datetime, sample: int = 1000) -> timedelta | None:
    """The smallest gap between consecutive fires among the next ``sample`` fires; None if fewer than two.

    For a tenant's minimum-interval quota. Daylight saving can make a gap
    shorter than the expression suggests ("30 2,3 * * *" with dst_gap="shift"
    fires 30 minutes apart on the spring-forward day); that shows only when the
    sample reaches a transition.
    """
    if sample < 2:
        raise ValueError("sample must be at least 2")
    if spec.kind == "rate":
        sample = 2  # the gap is constant
    fires = list(islice(_forward(spec, _naive_utc(after, "after")), sample))
    if len(fires) < 2:
        return None
    return min(later - earlier for earlier, later in zip(fires, fires[1:]))


def fires_per_minute(spec: TimeSpec, after: datetime) -> float:
    """The long-run average trigger rate the schedule implies, in fires per minute.

    For tenant trigger-rate quotas: ``"* * * * *"`` is 1.0, ``"*/15 * * * *"``
    0.0667, rate ``"1s"`` 60.0, once and exhausted schedules 0.0. Cron is
    averaged over the four years (1461 local days) from the next fire, counted
    day by day (bounded work); daylight saving's +-1 hour days are ignored.
    """
    first = next_fire_after(spec, after)
    if first is None or spec.kind == "once":
        return 0.0
    if spec.kind == "rate":
        return 60.0 / _rate_period(spec.expression).total_seconds()
    cron = _cron_source(spec.expression, spec.time_zone, spec.dst_repeat == "both", spec.dst_gap == "shift").cron
    day = first.astimezone(_zone(spec.time_zone)).date()
    window = 1461
    end = day + timedelta(days=window)
    matching = 0
    year, month = day.year, day.month
    while (year, month) <= (end.year, end.month):
        for number in cron.month_days(year, month):
            if day <= date(year, month, number) < end:
                matching += 1
        month += 1
        if month == 13:
            year, month = year + 1, 1
    return matching * len(cron.times) / (window * 1440)


def next_fire_cache_info() -> dict[str, int]:
    """Hits, misses and size of the shared next-fire memo (for the benchmark and metrics)."""
    info = _next_cron_fire.cache_info()
    return {"hits": info.hits, "misses": info.misses, "size": info.currsize, "maxsize": info.maxsize or 0}


def clear_time_caches() -> None:
    """Forget memoized fires and compiled expressions (tests; after a tzdata reload)."""
    _next_cron_fire.cache_clear()
    _cron_source.cache_clear()
    _gap_end.cache_clear()
    _PLAIN_DAYS.clear()
    parse_cron.cache_clear()


# --------------------------------------------------------------------------- misfire


def parse_misfire_policy(text: str, max_lateness: str | timedelta | None = None) -> MisfirePolicy:
    """Parse ``"skip"``, ``"fire_once"`` or ``"catch_up:K"`` (K from 1 to 1000) and the lateness threshold.

    ``max_lateness`` defaults to one minute; ``"0s"`` makes every instant that is
    not exactly on time late.
    """
    example = "catch_up:3"
    if not isinstance(text, str):
        raise InvalidInput("misfire_policy", f"must be skip, fire_once or catch_up:K, got {type(text).__name__}",
                           example)
    raw = text.strip().lower()
    if raw in ("skip", "fire_once"):
        kind, limit = raw, 0
    elif raw.startswith("catch_up"):
        match = re.fullmatch(r"catch_up:(\d{1,7})", raw)
        if match is None:
            raise InvalidInput("misfire_policy", f"{text.strip()[:30]!r}: catch_up needs a bound K, written"
                               f" catch_up:K with K from 1 to {MAX_CATCH_UP}", example)
        kind, limit = "catch_up", int(match.group(1))
        if not 1 <= limit <= MAX_CATCH_UP:
            raise InvalidInput("misfire_policy", f"catch_up bound {limit} must be from 1 to {MAX_CATCH_UP}", example)
    else:
        raise InvalidInput("misfire_policy", f"{text.strip()[:30]!r} is not a policy; use skip, fire_once or"
                           " catch_up:K", example)
    if max_lateness is None:
        lateness = timedelta(minutes=1)
    elif isinstance(max_lateness, timedelta):
        if max_lateness < timedelta(0):
            raise InvalidInput("max_lateness", "must not be negative", "5m")
        if max_lateness > MAX_DURATION:
            raise InvalidInput("max_lateness", f"must be at most {MAX_DURATION.days}d", "5m")
        lateness = max_lateness
    else:
        lateness = parse_duration(max_lateness, "max_lateness")  # type: ignore[arg-type]
    return MisfirePolicy(kind, limit, lateness)  # type: ignore[arg-type]


def decide_misfire(spec: TimeSpec, next_fire: datetime, now: datetime, policy: MisfirePolicy,
                   horizon: timedelta = timedelta(0), record_limit: int = 1000) -> MisfireDecision:
    """Decide every fire instant t with next_fire <= t <= now + horizon; nothing is silently dropped.

    An instant is late when ``now - t > max_lateness`` (exactly at the
    threshold is on time). On-time instants, including future ones within the
    horizon, are enqueued. Late ones: ``skip`` records them all MISSED;
    ``catch_up:K`` enqueues the K most recent and records the older ones
    MISSED; ``fire_once`` enqueues the most recent late one, unless an on-time
    instant at or before ``now`` exists (the schedule is already running on
    time, so a catch-up run would be a second run for the same outage), and
    records the rest MISSED.

    ``missed`` lists the oldest missed instants, at most ``record_limit``;
    ``missed_unlisted`` counts the others exactly (rate, once, and cron over
    spans up to ten years; None beyond). Work is O(record_limit + K + on-time
    instants + days of outage for cron), never O(missed instants).
    """
    if record_limit < 0:
        raise ValueError("record_limit must not be negative")
    if horizon < timedelta(0):
        raise ValueError("horizon must not be negative")
    cursor = _naive_utc(next_fire, "next_fire")
    current = _naive_utc(now, "now")
    until = current + horizon
    late_before = current - policy.max_lateness  # t < late_before  <=>  t is late

    on_time = list(_forward(spec, max(cursor, late_before) - _US, until))
    late_enqueue: list[datetime] = []
    if cursor < late_before:
        if policy.kind == "catch_up":
            late_enqueue = list(islice(_backward(spec, late_before, cursor), policy.catch_up_limit))
        elif policy.kind == "fire_once" and not (on_time and on_time[0] <= current):
            late_enqueue = list(islice(_backward(spec, late_before, cursor), 1))
        late_enqueue.reverse()
    missed_before = late_enqueue[0] if late_enqueue else late_before
    missed: list[datetime] = []
    unlisted: int | None = 0
    if cursor < missed_before:
        for instant in _forward(spec, cursor - _US, missed_before - _US):
            if len(missed) == record_limit:
                unlisted = _count(spec, missed[-1] if missed else cursor - _US, missed_before)
                break
            missed.append(instant)
    following = next_fire_after(spec, max(until, cursor - _US).replace(tzinfo=UTC))
    return MisfireDecision(
        enqueue=[instant.replace(tzinfo=UTC) for instant in late_enqueue + on_time],
        missed=[instant.replace(tzinfo=UTC) for instant in missed],
        missed_unlisted=unlisted,
        next_run_at=following,
    )


# --------------------------------------------------------------------------- jitter


def jitter_offset(occurrence_id: uuid.UUID, window: timedelta) -> timedelta:
    """Deterministic jitter in [0, window) at millisecond granularity.

    ``int.from_bytes(sha256(occurrence_id.bytes)[:8], "big") % window_ms``
    milliseconds: the same for every process, host and Python version (unlike
    ``hash()``), so a replayed occurrence gets the same ``available_at``.
    """
    if window < timedelta(0):
        raise ValueError("window must not be negative")
    window_ms = window // timedelta(milliseconds=1)
    if window_ms <= 0:
        return timedelta(0)
    digest = hashlib.sha256(occurrence_id.bytes).digest()
    return timedelta(milliseconds=int.from_bytes(digest[:8], "big") % window_ms)

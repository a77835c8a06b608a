"""The public questions about a spec: next fire, fires in a range, previous fire, preview, rates.

Every answer is computed from its arguments only (recovery passes the durable
cursor, never "now"). The next cron fire is memoized across schedules: at the
top of an hour thousands of schedules share (expression, zone, DST options,
cursor), and only the first pays for the calendar walk.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from functools import lru_cache
from itertools import islice, pairwise

from engine.rules.cron_expression import parse_cron
from engine.rules.timing.cron_source import clear_cron_caches, cron_source
from engine.rules.timing.exclusions import clear_exclusion_caches, exclusions_of
from engine.rules.timing.fire_reasons import fire_reason
from engine.rules.timing.instants import CEILING, FLOOR, MICROSECOND, UTC, aware_utc, naive_utc
from engine.rules.timing.sources import backward_fires, forward_fires, rate_period
from engine.rules.timing.spec import FirePreview, TimeSpec
from engine.rules.timing.zones import zone_info


def _next_cron_fire_uncached(
    expression: str, time_zone: str, both: bool, shift: bool, after: datetime
) -> datetime | None:
    """The unbounded next cron fire after an aware UTC instant, aware UTC."""
    low = after.replace(tzinfo=None)
    if low < FLOOR:
        low = FLOOR - MICROSECOND
    if low >= CEILING:
        return None
    found = next(cron_source(expression, time_zone, both, shift).forward(low, None), None)
    return found.replace(tzinfo=UTC) if found is not None else None


# Memo of the unbounded next cron fire: at the top of an hour thousands of schedules share
# (expression, zone, DST options, cursor), and only the first pays for the calendar walk.
# Keys and values are aware UTC datetimes: datetime.replace costs more than the lookup.
_next_cron_fire = lru_cache(maxsize=65_536)(_next_cron_fire_uncached)


def next_fire_after(spec: TimeSpec, after: datetime, *, cached: bool = True) -> datetime | None:
    """The first fire instant strictly after ``after`` (aware UTC), or None when exhausted.

    Computed from ``after`` only (recovery passes the durable cursor, never
    "now"); an ``after`` exactly on a fire instant yields the next one.
    ``cached=False`` bypasses the shared memo (for benchmarks and tests).
    """
    if after.tzinfo is not UTC:
        after = aware_utc(after, "after")
    start = spec.start_at
    if start is not None:
        start = aware_utc(start, "start_at") - MICROSECOND
        if start > after:
            after = start  # bounds shift the question, not the memo key: bounded specs share the memo
    if spec.kind == "cron":
        compute = _next_cron_fire if cached else _next_cron_fire_uncached
        both, shift = spec.dst_repeat == "both", spec.dst_gap == "shift"
        found = compute(spec.expression, spec.time_zone, both, shift, after)
        exclusions = exclusions_of(spec)
        while found is not None and exclusions is not None:
            # An excluded fire: ask again from the end of its interval (still through the shared memo).
            interval = exclusions.containing(found.replace(tzinfo=None))
            if interval is None:
                break
            found = compute(
                spec.expression, spec.time_zone, both, shift, (interval[1] - MICROSECOND).replace(tzinfo=UTC)
            )
    else:
        following = next(forward_fires(spec, after.replace(tzinfo=None)), None)
        found = following.replace(tzinfo=UTC) if following is not None else None
    end = spec.end_at
    if found is None or (end is not None and found > end):
        return None
    return found


def fire_times(spec: TimeSpec, after: datetime, limit: int, until: datetime | None = None) -> list[datetime]:
    """Up to ``limit`` fire instants strictly after ``after`` (and not after ``until``), ascending, aware UTC."""
    if limit < 0:
        raise ValueError("limit must not be negative")
    low = naive_utc(after, "after")
    high = naive_utc(until, "until") if until is not None else None
    return [instant.replace(tzinfo=UTC) for instant in islice(forward_fires(spec, low, high), limit)]


def previous_fire_before(spec: TimeSpec, before: datetime) -> datetime | None:
    """The last fire instant strictly before ``before`` (aware UTC), or None.

    Consistent with :func:`next_fire_after`: for a fire instant f,
    ``next_fire_after(spec, previous_fire_before(spec, f)) == f``.
    """
    found = next(backward_fires(spec, naive_utc(before, "before")), None)
    return found.replace(tzinfo=UTC) if found is not None else None


def preview(spec: TimeSpec, after: datetime, count: int) -> list[FirePreview]:
    """The next ``count`` fires with their local wall-clock time (fold set for a repeated hour) and the
    rule that produced each (:func:`~engine.rules.timing.fire_reasons.fire_reason`)."""
    zone = zone_info(spec.time_zone)
    return [
        FirePreview(instant, instant.astimezone(zone), fire_reason(spec, instant))
        for instant in fire_times(spec, after, count)
    ]


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
    fires = list(islice(forward_fires(spec, naive_utc(after, "after")), sample))
    if len(fires) < 2:
        return None
    return min(later - earlier for earlier, later in pairwise(fires))


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
        return 60.0 / rate_period(spec.expression).total_seconds()
    day = first.astimezone(zone_info(spec.time_zone)).date()
    return _cron_rate(spec.expression, spec.time_zone, spec.dst_repeat == "both", spec.dst_gap == "shift", day)


@lru_cache(maxsize=16_384)
def _cron_rate(expression: str, time_zone: str, both: bool, shift: bool, day: date) -> float:
    """Fires per minute of a cron expression averaged over the 1461 local days from ``day`` (memoized: a
    batch import repeats a few expressions thousands of times)."""
    cron = cron_source(expression, time_zone, both, shift).cron
    window = 1461
    end = day + timedelta(days=window)
    matching = 0
    year, month = day.year, day.month
    while (year, month) <= (end.year, end.month):
        days = cron.month_days(year, month)
        if (year, month) in ((day.year, day.month), (end.year, end.month)):
            matching += sum(1 for number in days if day <= date(year, month, number) < end)
        else:  # a month wholly inside the window: every matching day counts (no date per day)
            matching += len(days)
        month += 1
        if month == 13:
            year, month = year + 1, 1
    return matching * len(cron.times) / (window * 1440)


def next_fire_cache_info() -> dict[str, int]:
    """Hits, misses and size of the shared next-fire memo (for the benchmark and metrics)."""
    info = _next_cron_fire.cache_info()
    return {"hits": info.hits, "misses": info.misses, "size": info.currsize, "maxsize": info.maxsize or 0}


def clear_time_caches() -> None:
    """Forget memoized fires, compiled expressions and excluded intervals (tests; after a tzdata reload)."""
    _next_cron_fire.cache_clear()
    _cron_rate.cache_clear()
    clear_cron_caches()
    clear_exclusion_caches()
    parse_cron.cache_clear()

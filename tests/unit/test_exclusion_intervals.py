"""Exclusion calendars as UTC instants: exact around midnights inside gaps and repeated hours.

The check is by observation, independent of the interval computation: walk
UTC minute by minute, read the local date with zoneinfo, and compare "the
calendar lists that date" with "the instant lies in an excluded interval".
"""

from __future__ import annotations

import os
from bisect import bisect_right
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.rules.exclusion_calendars import (
    CalendarEntry,
    ExclusionCalendar,
    excluded_intervals,
    merged_ranges,
)

UTC = UTC
# A minute-by-minute walk of ten days per case: 40 cases keep the suite quick; CHRONOQ_PROPERTY_EXAMPLES (and
# python -m load_tests.oracle_agreement) run as many as asked.
EXAMPLES = int(os.environ.get("CHRONOQ_PROPERTY_EXAMPLES", "40"))
MINUTE = timedelta(minutes=1)


def calendar(*ranges: tuple[str, str], zone: str | None = None) -> ExclusionCalendar:
    return ExclusionCalendar(
        "holidays", 1, zone, tuple(CalendarEntry(date.fromisoformat(a), date.fromisoformat(b)) for a, b in ranges)
    )


def inside(intervals: tuple[tuple[datetime, datetime], ...], instant: datetime) -> bool:
    index = bisect_right(intervals, (instant, datetime.max)) - 1
    return index >= 0 and intervals[index][0] <= instant < intervals[index][1]


def assert_exact(cal: ExclusionCalendar, zone: str, low: datetime, high: datetime, step: timedelta = MINUTE) -> int:
    """Every instant from low to high (naive UTC) is excluded iff its local date is listed; returns how many are."""
    intervals = excluded_intervals(cal, zone)
    tz = ZoneInfo(zone)
    excluded = 0
    instant = low
    while instant <= high:
        local_date = instant.replace(tzinfo=UTC).astimezone(tz).date()
        expected = cal.excludes(local_date)
        assert inside(intervals, instant) == expected, (zone, instant, local_date)
        excluded += expected
        instant += step
    return excluded


def test_merging_joins_overlapping_and_adjacent_ranges() -> None:
    cal = calendar(
        ("2026-12-24", "2026-12-26"),
        ("2026-12-27", "2026-12-27"),
        ("2026-12-25", "2026-12-25"),
        ("2026-12-31", "2027-01-01"),
    )
    assert merged_ranges(cal.entries) == (
        (date(2026, 12, 24), date(2026, 12, 27)),
        (date(2026, 12, 31), date(2027, 1, 1)),
    )
    assert cal.excludes(date(2026, 12, 27)) and not cal.excludes(date(2026, 12, 28))


def test_equal_calendars_hash_alike_and_versions_differ() -> None:
    first = calendar(("2026-12-25", "2026-12-25"))
    same = calendar(("2026-12-25", "2026-12-25"))
    assert first == same and hash(first) == hash(same)
    assert first != ExclusionCalendar("holidays", 2, None, first.entries)
    assert first != calendar(("2026-12-26", "2026-12-26"))


def test_havana_date_that_begins_in_a_gap_begins_at_the_transition() -> None:
    # 2026-03-08 00:00 CST -> 01:00 CDT: the 8th begins at 05:00Z, when the clock shows 01:00.
    intervals = excluded_intervals(calendar(("2026-03-08", "2026-03-08")), "America/Havana")
    assert intervals == ((datetime(2026, 3, 8, 5), datetime(2026, 3, 9, 4)),)


def test_havana_date_with_a_repeated_first_hour() -> None:
    # 2026-11-01 01:00 CDT -> 00:00 CST: the 1st lasts 25 hours, 04:00Z to 05:00Z the next day.
    intervals = excluded_intervals(calendar(("2026-11-01", "2026-11-01")), "America/Havana")
    assert intervals == ((datetime(2026, 11, 1, 4), datetime(2026, 11, 2, 5)),)


def test_st_johns_repeated_hour_crossing_midnight_leaves_a_hole() -> None:
    # Until 2011 St. John's fell back at 00:01 NDT to 23:01 NST of the previous day: the clock
    # shows 7 November for one minute, then 6 November again for an hour.
    zone = "America/St_Johns"
    cal = calendar(("2010-11-07", "2010-11-07"))
    intervals = excluded_intervals(cal, zone)
    assert len(intervals) == 2
    assert_exact(cal, zone, datetime(2010, 11, 6), datetime(2010, 11, 9))
    neighbour = calendar(("2010-11-06", "2010-11-06"))
    assert len(excluded_intervals(neighbour, zone)) == 2
    assert_exact(neighbour, zone, datetime(2010, 11, 5), datetime(2010, 11, 8))


def test_apia_skipped_day_excludes_nothing_of_its_own() -> None:
    # Samoa skipped 2011-12-30 entirely (UTC-10 -> UTC+14).
    zone = "Pacific/Apia"
    assert excluded_intervals(calendar(("2011-12-30", "2011-12-30")), zone) == ()
    assert_exact(calendar(("2011-12-29", "2011-12-31")), zone, datetime(2011, 12, 28), datetime(2012, 1, 2))


def test_lord_howe_half_hour_shift_days() -> None:
    zone = "Australia/Lord_Howe"
    cal = calendar(("2026-04-05", "2026-04-05"), ("2026-10-04", "2026-10-04"))
    assert assert_exact(cal, zone, datetime(2026, 4, 3), datetime(2026, 4, 7)) == 24 * 60 + 30
    assert assert_exact(cal, zone, datetime(2026, 10, 2), datetime(2026, 10, 6)) == 24 * 60 - 30


def test_calendar_in_its_own_zone_is_read_there() -> None:
    cal = calendar(("2026-07-04", "2026-07-04"), zone="America/New_York")
    assert cal.zone_for("Asia/Tokyo") == "America/New_York"
    assert calendar(("2026-07-04", "2026-07-04")).zone_for("Asia/Tokyo") == "Asia/Tokyo"


ZONES_WITH_MIDNIGHT_TRANSITIONS = [
    "America/Havana",
    "America/Santiago",
    "Asia/Beirut",
    "America/St_Johns",
    "America/Goose_Bay",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Europe/Dublin",
    "Pacific/Apia",
    "America/Asuncion",
    "Asia/Tehran",
    "Africa/Casablanca",
    "America/Sao_Paulo",
    "Asia/Gaza",
    "Europe/Berlin",
    "UTC",
]


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    zone=st.sampled_from(ZONES_WITH_MIDNIGHT_TRANSITIONS),
    year=st.integers(1980, 2037),
    starts=st.lists(st.integers(0, 364), min_size=1, max_size=4),
    lengths=st.lists(st.integers(0, 3), min_size=4, max_size=4),
    data=st.data(),
)
def test_intervals_agree_with_the_local_date_near_transitions(
    zone: str, year: int, starts: list[int], lengths: list[int], data: st.DataObject
) -> None:
    tz = ZoneInfo(zone)
    # Centre the ranges on one of the year's transitions when there is one, so the edges matter.
    transitions = [
        day
        for day in (date(year, 1, 1) + timedelta(d) for d in range(365))
        if datetime(day.year, day.month, day.day, tzinfo=tz).utcoffset()
        != (datetime(day.year, day.month, day.day, tzinfo=tz) + timedelta(days=1)).utcoffset()
    ]
    centre = data.draw(st.sampled_from(transitions)) if transitions else date(year, 6, 1)
    entries = []
    for start, length in zip(starts, lengths, strict=False):  # lengths has spares
        first = centre + timedelta(days=start % 5 - 2)
        entries.append(CalendarEntry(first, first + timedelta(days=length)))
    cal = ExclusionCalendar("probe", 1, None, tuple(entries))
    low = datetime(centre.year, centre.month, centre.day) - timedelta(days=4)
    assert_exact(
        cal, zone, low, low + timedelta(days=10), step=timedelta(minutes=data.draw(st.sampled_from([1, 7, 15])))
    )


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Etc/GMT+12", "Asia/Kolkata"])
def test_extreme_and_fractional_offsets(zone: str) -> None:
    cal = calendar(("2026-01-01", "2026-01-01"))
    assert assert_exact(cal, zone, datetime(2025, 12, 30), datetime(2026, 1, 3)) == 24 * 60

"""Fixed cases of the time contract: DST transitions in several zones, calendars, bounds, kinds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from engine.control.schedule_requests import build_time_spec
from engine.rules.timing import (
    TimeSpec,
    fire_times,
    fires_per_minute,
    next_fire_after,
    preview,
    previous_fire_before,
    smallest_gap,
)
from tests.unit.time_oracle import oracle_fire_times

UTC = UTC


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def fires(spec: TimeSpec, low: str, high: str) -> list[str]:
    found = fire_times(spec, at(low), 10_000, at(high))
    return [t.isoformat().replace("+00:00", "Z") for t in found]


# --------------------------------------------------------------------------- New York


def test_new_york_spring_forward_skips_the_missing_half_hour() -> None:
    spec = build_time_spec("cron", "30 2 * * *", "America/New_York")
    assert fires(spec, "2026-03-06T00:00Z", "2026-03-10T23:59Z") == [
        "2026-03-06T07:30:00Z",
        "2026-03-07T07:30:00Z",  # 02:30 EST
        # 2026-03-08: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist
        "2026-03-09T06:30:00Z",
        "2026-03-10T06:30:00Z",  # 02:30 EDT
    ]


def test_new_york_spring_forward_shift_fires_at_three() -> None:
    spec = build_time_spec("cron", "30 2 * * *", "America/New_York", dst_gap="shift")
    on_the_day = [p for p in preview(spec, at("2026-03-08T00:00Z"), 2)]
    assert on_the_day[0].utc == at("2026-03-08T07:00Z")
    assert on_the_day[0].local.replace(tzinfo=None) == datetime(2026, 3, 8, 3, 0)
    assert on_the_day[0].local.utcoffset() == timedelta(hours=-4)
    assert on_the_day[1].utc == at("2026-03-09T06:30Z")


def test_shift_collapses_several_missing_times_and_a_regular_fire_onto_one() -> None:
    # 02:00, 02:15, 02:30, 02:45 do not exist; 03:00 does. All five fire once at 03:00 EDT.
    spec = build_time_spec("cron", "*/15 2,3 * * *", "America/New_York", dst_gap="shift")
    assert fires(spec, "2026-03-08T06:00Z", "2026-03-08T07:50Z") == [
        "2026-03-08T07:00:00Z",
        "2026-03-08T07:15:00Z",
        "2026-03-08T07:30:00Z",
        "2026-03-08T07:45:00Z",
    ]


def test_new_york_fall_back_fires_once_at_the_earlier_instant() -> None:
    spec = build_time_spec("cron", "30 1 * * *", "America/New_York")
    assert fires(spec, "2026-11-01T00:00Z", "2026-11-02T00:00Z") == ["2026-11-01T05:30:00Z"]


def test_new_york_fall_back_both_fires_twice() -> None:
    spec = build_time_spec("cron", "30 1 * * *", "America/New_York", dst_repeat="both")
    assert fires(spec, "2026-11-01T00:00Z", "2026-11-02T00:00Z") == ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]
    local = preview(spec, at("2026-11-01T00:00Z"), 2)
    assert [p.local.fold for p in local] == [0, 1]
    assert [p.local.utcoffset() for p in local] == [timedelta(hours=-4), timedelta(hours=-5)]


def test_both_interleaves_the_repeated_hour_in_instant_order() -> None:
    # 01:00 EDT, 01:20 EDT, 01:40 EDT, then the clock repeats: 01:00 EST, 01:20 EST, 01:40 EST.
    spec = build_time_spec("cron", "0,20,40 1 * * *", "America/New_York", dst_repeat="both")
    assert fires(spec, "2026-11-01T04:00Z", "2026-11-01T07:00Z") == [
        "2026-11-01T05:00:00Z",
        "2026-11-01T05:20:00Z",
        "2026-11-01T05:40:00Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01T06:20:00Z",
        "2026-11-01T06:40:00Z",
    ]
    first_only = build_time_spec("cron", "0,20,40 1 * * *", "America/New_York")
    assert fires(first_only, "2026-11-01T04:00Z", "2026-11-01T07:00Z") == [
        "2026-11-01T05:00:00Z",
        "2026-11-01T05:20:00Z",
        "2026-11-01T05:40:00Z",
    ]


def test_after_inside_the_repeated_hour_gives_the_second_pass_with_both() -> None:
    spec = build_time_spec("cron", "30 1 * * *", "America/New_York", dst_repeat="both")
    assert next_fire_after(spec, at("2026-11-01T05:30Z")) == at("2026-11-01T06:30Z")
    assert previous_fire_before(spec, at("2026-11-01T06:30Z")) == at("2026-11-01T05:30Z")
    first_only = build_time_spec("cron", "30 1 * * *", "America/New_York")
    assert next_fire_after(first_only, at("2026-11-01T05:30Z")) == at("2026-11-02T06:30Z")


# --------------------------------------------------------------------------- other zones


@pytest.mark.parametrize(
    ("zone", "expression", "repeat", "gap", "low", "high", "expected"),
    [
        # Lord Howe moves by 30 minutes: 02:00 -> 02:30 on 2026-10-04, 02:00 -> 01:30 on 2026-04-05.
        (
            "Australia/Lord_Howe",
            "15 2 * * *",
            "first",
            "skip",
            "2026-10-02T12:00Z",
            "2026-10-05T12:00Z",
            ["2026-10-02T15:45:00Z", "2026-10-04T15:15:00Z"],
        ),  # 10-04 02:15 does not exist
        (
            "Australia/Lord_Howe",
            "15 2 * * *",
            "first",
            "shift",
            "2026-10-03T12:00Z",
            "2026-10-04T12:00Z",
            ["2026-10-03T15:30:00Z"],
        ),
        (
            "Australia/Lord_Howe",
            "45 1 * * *",
            "both",
            "skip",
            "2026-04-04T12:00Z",
            "2026-04-05T12:00Z",
            ["2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z"],
        ),
        (
            "Australia/Lord_Howe",
            "45 1 * * *",
            "first",
            "skip",
            "2026-04-04T12:00Z",
            "2026-04-05T12:00Z",
            ["2026-04-04T14:45:00Z"],
        ),
        # Europe/Dublin's tzdata uses negative DST (IST is standard); offsets are what count.
        (
            "Europe/Dublin",
            "30 1 * * *",
            "first",
            "skip",
            "2026-03-28T00:00Z",
            "2026-03-30T01:00Z",
            ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"],
        ),
        (
            "Europe/Dublin",
            "30 1 * * *",
            "both",
            "skip",
            "2026-10-24T12:00Z",
            "2026-10-25T12:00Z",
            ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"],
        ),
        # America/Havana changes at midnight: 00:00 -> 01:00 on 2026-03-08, 01:00 -> 00:00 on 2026-11-01.
        (
            "America/Havana",
            "0 0 * * *",
            "first",
            "skip",
            "2026-03-07T00:00Z",
            "2026-03-09T12:00Z",
            ["2026-03-07T05:00:00Z", "2026-03-09T04:00:00Z"],
        ),
        (
            "America/Havana",
            "0 0 * * *",
            "first",
            "shift",
            "2026-03-07T12:00Z",
            "2026-03-08T12:00Z",
            ["2026-03-08T05:00:00Z"],
        ),
        (
            "America/Havana",
            "30 0 * * *",
            "both",
            "skip",
            "2026-10-31T12:00Z",
            "2026-11-01T12:00Z",
            ["2026-11-01T04:30:00Z", "2026-11-01T05:30:00Z"],
        ),
        # Pacific/Chatham (+12:45/+13:45) springs forward at 02:45 local.
        ("Pacific/Chatham", "0 3 * * *", "first", "skip", "2026-09-26T00:00Z", "2026-09-27T00:00Z", []),
        (
            "Pacific/Chatham",
            "0 3 * * *",
            "first",
            "shift",
            "2026-09-26T00:00Z",
            "2026-09-27T00:00Z",
            ["2026-09-26T14:00:00Z"],
        ),
        # America/St_Johns (-03:30/-02:30).
        (
            "America/St_Johns",
            "30 1 * * *",
            "both",
            "skip",
            "2026-10-31T12:00Z",
            "2026-11-01T12:00Z",
            ["2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z"],
        ),
    ],
)
def test_transitions_in_several_zones(
    zone: str, expression: str, repeat: str, gap: str, low: str, high: str, expected: list[str]
) -> None:
    spec = build_time_spec("cron", expression, zone, dst_repeat=repeat, dst_gap=gap)
    got = fires(spec, low, high)
    assert got == expected
    assert [at(t) for t in got] == oracle_fire_times(expression, zone, at(low), at(high), repeat, gap)


def test_santiago_midnight_transition_skips_midnight() -> None:
    # Chile springs forward at 24:00 Saturday: 2026-09-06 00:00 does not exist.
    spec = build_time_spec("cron", "0 0 * * *", "America/Santiago")
    shift = build_time_spec("cron", "0 0 * * *", "America/Santiago", dst_gap="shift")
    day = fires(spec, "2026-09-05T12:00Z", "2026-09-06T12:00Z")
    assert day == []
    shifted = preview(shift, at("2026-09-05T12:00Z"), 1)[0]
    assert shifted.local.replace(tzinfo=None) == datetime(2026, 9, 6, 1, 0)
    for candidate in (spec, shift):
        low, high = at("2026-09-03T00:00Z"), at("2026-09-08T00:00Z")
        assert fire_times(candidate, low, 100, high) == oracle_fire_times(
            "0 0 * * *", "America/Santiago", low, high, "first", candidate.dst_gap
        )


# --------------------------------------------------------------------------- rate and once


def test_rate_keeps_elapsed_time_across_transitions() -> None:
    spec = build_time_spec("rate", "1h30m", "America/New_York", anchor="2026-03-07T12:00:00Z")
    got = fire_times(spec, at("2026-03-08T05:00Z"), 4)
    assert got == [at("2026-03-08T06:00Z"), at("2026-03-08T07:30Z"), at("2026-03-08T09:00Z"), at("2026-03-08T10:30Z")]
    assert {b - a for a, b in pairwise(got)} == {timedelta(minutes=90)}
    local = [p.local.strftime("%H:%M%z") for p in preview(spec, at("2026-03-08T05:00Z"), 3)]
    assert local == ["01:00-0500", "03:30-0400", "05:00-0400"]  # wall clock jumps, elapsed time does not


def test_rate_defaults_to_start_then_epoch_anchor() -> None:
    epoch = build_time_spec("rate", "15m")
    assert next_fire_after(epoch, at("2026-05-05T10:07:13Z")) == at("2026-05-05T10:15Z")
    started = build_time_spec("rate", "15m", start_at="2026-05-05T10:07:00Z")
    assert next_fire_after(started, at("2026-01-01T00:00Z")) == at("2026-05-05T10:07Z")
    assert next_fire_after(started, at("2026-05-05T10:07Z")) == at("2026-05-05T10:22Z")
    anchored = build_time_spec("rate", "15m", anchor="2026-05-05T10:01:00Z")
    assert previous_fire_before(anchored, at("2026-05-05T10:01Z")) is None  # the anchor is the first fire
    assert previous_fire_before(anchored, at("2026-05-05T10:16:01Z")) == at("2026-05-05T10:16Z")


def test_once_fires_a_single_instant() -> None:
    spec = build_time_spec("once", "2026-07-01T09:00:00+02:00", "Europe/Berlin")
    assert next_fire_after(spec, at("2026-01-01T00:00Z")) == at("2026-07-01T07:00Z")
    assert next_fire_after(spec, at("2026-07-01T07:00Z")) is None
    assert previous_fire_before(spec, at("2026-07-01T07:00:01Z")) == at("2026-07-01T07:00Z")
    assert previous_fire_before(spec, at("2026-07-01T07:00Z")) is None
    assert fire_times(spec, at("2020-01-01T00:00Z"), 5) == [at("2026-07-01T07:00Z")]
    assert preview(spec, at("2026-01-01T00:00Z"), 3)[0].local.hour == 9
    assert smallest_gap(spec, at("2026-01-01T00:00Z")) is None
    assert fires_per_minute(spec, at("2026-01-01T00:00Z")) == 0.0


# --------------------------------------------------------------------------- calendar


def test_leap_day() -> None:
    spec = build_time_spec("cron", "0 12 29 2 *", "UTC")
    assert next_fire_after(spec, at("2026-01-01T00:00Z")) == at("2028-02-29T12:00Z")
    assert next_fire_after(spec, at("2096-03-01T00:00Z")) == at("2104-02-29T12:00Z")  # 2100 is not leap


def test_end_of_month_skips_short_months() -> None:
    spec = build_time_spec("cron", "0 0 31 * *", "UTC")
    got = fire_times(spec, at("2026-01-01T00:00Z"), 7)
    assert [t.month for t in got] == [1, 3, 5, 7, 8, 10, 12]


def test_day_fields_or_rule() -> None:
    # Both restricted: the 13th OR any Friday.
    spec = build_time_spec("cron", "0 0 13 * FRI", "UTC")
    got = fire_times(spec, at("2026-02-01T00:00Z"), 6)
    assert [t.date().isoformat() for t in got] == [
        "2026-02-06",
        "2026-02-13",
        "2026-02-20",
        "2026-02-27",
        "2026-03-06",
        "2026-03-13",
    ]
    # A day field starting with "*" makes it AND: the 13th that is a Friday.
    both = build_time_spec("cron", "0 0 */1 * FRI", "UTC")
    assert all(t.weekday() == 4 for t in fire_times(both, at("2026-02-01T00:00Z"), 5))
    friday_13 = build_time_spec("cron", "0 0 13 * */5", "UTC")  # */5 = Sunday, Friday
    assert [t.date().isoformat() for t in fire_times(friday_13, at("2026-01-01T00:00Z"), 2)] == [
        "2026-02-13",
        "2026-03-13",
    ]
    # "30 2" never exists, yet "0 0 30 2 1" fires on every Monday of February (OR rule).
    mondays = build_time_spec("cron", "0 0 30 2 1", "UTC")
    assert [t.day for t in fire_times(mondays, at("2026-01-01T00:00Z"), 4)] == [2, 9, 16, 23]


def test_names_sunday_seven_and_aliases() -> None:
    low = at("2026-01-01T00:00Z")
    assert (
        fire_times(build_time_spec("cron", "0 0 * * 7", "UTC"), low, 3)
        == fire_times(build_time_spec("cron", "0 0 * * SUN", "UTC"), low, 3)
        == fire_times(build_time_spec("cron", "@weekly", "UTC"), low, 3)
    )
    assert fire_times(build_time_spec("cron", "0 9 * jan-mar mon-fri", "UTC"), low, 1) == [at("2026-01-01T09:00Z")]
    assert fire_times(build_time_spec("cron", "@yearly", "Asia/Tokyo"), low, 1) == [at("2026-12-31T15:00Z")]
    assert next_fire_after(build_time_spec("cron", "@hourly", "Asia/Kolkata"), low) == at("2026-01-01T00:30Z")


# --------------------------------------------------------------------------- bounds and cursors


def test_start_and_end_are_inclusive() -> None:
    spec = build_time_spec("cron", "0 * * * *", "UTC", start_at="2026-01-01T03:00Z", end_at="2026-01-01T06:00Z")
    assert fire_times(spec, at("2026-01-01T00:00Z"), 100) == [at(f"2026-01-01T0{h}:00Z") for h in (3, 4, 5, 6)]
    assert next_fire_after(spec, at("2026-01-01T06:00Z")) is None
    assert previous_fire_before(spec, at("2026-01-02T00:00Z")) == at("2026-01-01T06:00Z")
    assert previous_fire_before(spec, at("2026-01-01T03:00Z")) is None


def test_start_exactly_on_a_fire_time_yields_the_strictly_next_one() -> None:
    spec = build_time_spec("cron", "*/5 * * * *", "Europe/Paris")
    assert next_fire_after(spec, at("2026-06-01T10:05Z")) == at("2026-06-01T10:10Z")
    assert next_fire_after(spec, at("2026-06-01T10:04:59.999999Z")) == at("2026-06-01T10:05Z")
    assert previous_fire_before(spec, at("2026-06-01T10:05Z")) == at("2026-06-01T10:00Z")
    rate = build_time_spec("rate", "5m")
    assert next_fire_after(rate, at("2026-06-01T10:05Z")) == at("2026-06-01T10:10Z")


def test_cached_and_uncached_agree_and_after_may_be_any_zone() -> None:
    spec = build_time_spec("cron", "17 */3 * * *", "Asia/Kathmandu")
    paris = datetime(2026, 6, 1, 12, 0, tzinfo=__import__("zoneinfo").ZoneInfo("Europe/Paris"))
    assert (
        next_fire_after(spec, paris)
        == next_fire_after(spec, paris, cached=False)
        == next_fire_after(spec, paris.astimezone(UTC))
    )


def test_naive_after_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="aware"):
        next_fire_after(build_time_spec("cron", "* * * * *"), datetime(2026, 1, 1))


def test_exhausted_and_far_away() -> None:
    spec = build_time_spec("cron", "0 0 * * *", end_at="2026-01-02T00:00Z")
    assert fire_times(spec, at("2026-01-01T00:00Z"), 5) == [at("2026-01-02T00:00Z")]
    assert next_fire_after(spec, at("2026-01-02T00:00Z")) is None
    assert fires_per_minute(spec, at("2026-01-02T00:00Z")) == 0.0
    assert next_fire_after(build_time_spec("cron", "0 0 * * *"), datetime.max.replace(tzinfo=UTC)) is None
    assert previous_fire_before(build_time_spec("rate", "1h"), datetime.min.replace(tzinfo=UTC)) is None
    assert previous_fire_before(build_time_spec("cron", "0 0 * * *"), datetime.min.replace(tzinfo=UTC)) is None
    assert fire_times(build_time_spec("cron", "0 0 * * *"), datetime.max.replace(tzinfo=UTC), 3) == []
    assert next_fire_after(build_time_spec("rate", "1h"), datetime.max.replace(tzinfo=UTC)) is None


# --------------------------------------------------------------------------- quotas


@pytest.mark.parametrize(
    ("kind", "expression", "expected"),
    [
        ("cron", "* * * * *", 1.0),
        ("cron", "*/15 * * * *", 4 / 60),
        ("cron", "0 * * * *", 1 / 60),
        ("cron", "0 9 * * *", 1 / 1440),
        ("rate", "1s", 60.0),
        ("rate", "2m", 0.5),
    ],
)
def test_fires_per_minute(kind: str, expression: str, expected: float) -> None:
    spec = build_time_spec(kind, expression, "Europe/Berlin")
    assert fires_per_minute(spec, at("2026-01-01T00:00Z")) == pytest.approx(expected, rel=1e-9)


def test_fires_per_minute_weekdays_and_leap_days() -> None:
    weekdays = build_time_spec("cron", "0 9 * * MON-FRI", "UTC")
    assert fires_per_minute(weekdays, at("2026-01-01T00:00Z")) == pytest.approx(5 / 7 / 1440, rel=0.01)
    leap = build_time_spec("cron", "0 0 29 2 *", "UTC")
    assert fires_per_minute(leap, at("2026-01-01T00:00Z")) == pytest.approx(1 / 1461 / 1440)


def test_smallest_gap() -> None:
    low = at("2026-01-01T00:00Z")
    assert smallest_gap(build_time_spec("cron", "* * * * *"), low) == timedelta(minutes=1)
    assert smallest_gap(build_time_spec("cron", "0,59 0,23 * * *"), low) == timedelta(minutes=1)  # 23:59 -> 00:00
    assert smallest_gap(build_time_spec("cron", "0 9,17 * * *"), low) == timedelta(hours=8)
    assert smallest_gap(build_time_spec("rate", "90s"), low) == timedelta(seconds=90)
    assert smallest_gap(build_time_spec("rate", "90s", end_at="2026-01-01T00:01:30Z"), low) is None
    # The shift rule can make a gap shorter than the expression suggests; the sample sees it.
    shifted = build_time_spec("cron", "30 2,3 * * *", "America/New_York", dst_gap="shift")
    assert smallest_gap(shifted, at("2026-03-07T00:00Z"), sample=10) == timedelta(minutes=30)


# --------------------------------------------------------------------------- zone data


def test_zone_data_meets_the_modules_assumptions() -> None:
    """engine/timing.py assumes offsets within -12h..+14h and no two transitions within six hours.

    Checked on the installed tzdata through the pure-Python zoneinfo's transition list, so a tzdata
    upgrade that breaks an assumption fails here rather than as a wrong fire time.
    """
    from zoneinfo import (  # type: ignore[attr-defined]  # the pure-Python implementation exposes transitions
        _zoneinfo,
        available_timezones,
    )

    floor = datetime(1900, 1, 1, tzinfo=UTC).timestamp()
    checked = 0
    for key in sorted(available_timezones() - {"localtime", "Factory", "posixrules"}):
        zone = _zoneinfo.ZoneInfo.no_cache(key)
        found = getattr(zone, "_trans_utc", None)
        if found is None:
            pytest.skip("this Python's zoneinfo does not expose transitions")
        moments = [t for t in found if t >= floor]
        for earlier, later in pairwise(moments):
            assert later - earlier >= 6 * 3600, (key, datetime.fromtimestamp(earlier, UTC))
        for moment in moments:
            offset = datetime.fromtimestamp(moment, zone).utcoffset()
            assert offset is not None and timedelta(hours=-12) <= offset <= timedelta(hours=14), (key, moment)
        checked += 1
    assert checked > 300

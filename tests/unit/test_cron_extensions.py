"""Fixed cases of the cron calendar terms: L, L-n, nW, LW, dL and d#k (docs/time-contract.md)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engine.control.schedule_requests import build_time_spec
from engine.rules.cron_expression import parse_cron
from engine.rules.timing import fire_times, preview
from schemas.errors import InvalidInput

UTC = UTC


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def local_dates(expression: str, zone: str, low: str, high: str) -> list[str]:
    spec = build_time_spec("cron", expression, zone)
    return [t.astimezone(spec_zone(zone)).strftime("%Y-%m-%d %H:%M") for t in fire_times(spec, at(low), 1000, at(high))]


def spec_zone(zone: str):
    from zoneinfo import ZoneInfo

    return ZoneInfo(zone)


# --------------------------------------------------------------------------- the cases of issue 15


def test_last_day_of_the_month_in_berlin() -> None:
    spec = build_time_spec("cron", "0 9 L * *", "Europe/Berlin")
    fires = fire_times(spec, at("2027-01-01T00:00Z"), 3)
    assert fires == [at("2027-01-31T08:00Z"), at("2027-02-28T08:00Z"), at("2027-03-31T07:00Z")]  # CEST from 03-28
    leap = fire_times(spec, at("2028-02-01T00:00Z"), 1)
    assert leap == [at("2028-02-29T08:00Z")]


def test_nearest_weekday_to_a_saturday_15th_is_friday_the_14th() -> None:
    # 2026-08-15 is a Saturday.
    assert local_dates("0 9 15W * *", "Europe/Berlin", "2026-08-01T00:00Z", "2026-08-31T00:00Z") == ["2026-08-14 09:00"]


def test_nearest_weekday_to_a_saturday_1st_is_monday_the_3rd() -> None:
    # 2026-08-01 is a Saturday: the Friday before would leave the month.
    assert local_dates("0 9 1W * *", "Europe/Berlin", "2026-07-31T12:00Z", "2026-08-31T00:00Z") == ["2026-08-03 09:00"]


def test_second_tuesday() -> None:
    assert local_dates("0 9 * * TUE#2", "Europe/Berlin", "2026-01-01T00:00Z", "2026-04-30T00:00Z") == [
        "2026-01-13 09:00",
        "2026-02-10 09:00",
        "2026-03-10 09:00",
        "2026-04-14 09:00",
    ]
    assert local_dates("0 9 * * 2#2", "Europe/Berlin", "2026-01-01T00:00Z", "2026-04-30T00:00Z") == [
        "2026-01-13 09:00",
        "2026-02-10 09:00",
        "2026-03-10 09:00",
        "2026-04-14 09:00",
    ]


# --------------------------------------------------------------------------- each term


@pytest.mark.parametrize(
    ("expression", "days_2026"),
    [
        ("L", [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]),
        ("L-0", [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]),
        ("L-1", [30, 27, 30, 29, 30, 29, 30, 30, 29, 30, 29, 30]),
        ("L-3", [28, 25, 28, 27, 28, 27, 28, 28, 27, 28, 27, 28]),  # Quartz: three days before the last
        ("15W", [15, 16, 16, 15, 15, 15, 15, 14, 15, 15, 16, 15]),  # Feb/Mar 15 Sunday, Aug 15 Saturday
        ("1W", [1, 2, 2, 1, 1, 1, 1, 3, 1, 1, 2, 1]),
        ("31W", [30, None, 31, None, 29, None, 31, 31, None, 30, None, 31]),  # Sat 31 -> Fri 30; Sun 31 -> Fri 29
        ("LW", [30, 27, 31, 30, 29, 30, 31, 31, 30, 30, 30, 31]),
        ("1,L", None),
    ],
)
def test_day_of_month_terms(expression: str, days_2026: list[int | None] | None) -> None:
    cron = parse_cron(f"0 9 {expression} * *")
    found = [cron.month_days(2026, month) for month in range(1, 13)]
    if days_2026 is None:
        assert found == [
            (1, 31),
            (1, 28),
            (1, 31),
            (1, 30),
            (1, 31),
            (1, 30),
            (1, 31),
            (1, 31),
            (1, 30),
            (1, 31),
            (1, 30),
            (1, 31),
        ]
        return
    assert found == [(d,) if d is not None else () for d in days_2026]


@pytest.mark.parametrize(
    ("expression", "days_2026"),
    [
        ("FRIL", [30, 27, 27, 24, 29, 26, 31, 28, 25, 30, 27, 25]),
        ("5L", [30, 27, 27, 24, 29, 26, 31, 28, 25, 30, 27, 25]),
        ("0L", [25, 22, 29, 26, 31, 28, 26, 30, 27, 25, 29, 27]),
        ("7L", [25, 22, 29, 26, 31, 28, 26, 30, 27, 25, 29, 27]),  # 7 is Sunday too
        ("MON#1", [5, 2, 2, 6, 4, 1, 6, 3, 7, 5, 2, 7]),
        ("1#5", [None, None, 30, None, None, 29, None, 31, None, None, 30, None]),
        ("thu#3", [15, 19, 19, 16, 21, 18, 16, 20, 17, 15, 19, 17]),
    ],
)
def test_day_of_week_terms(expression: str, days_2026: list[int | None]) -> None:
    cron = parse_cron(f"0 9 * * {expression}")
    assert [cron.month_days(2026, month) for month in range(1, 13)] == [
        (d,) if d is not None else () for d in days_2026
    ]


def test_terms_mix_with_plain_values_in_a_list() -> None:
    cron = parse_cron("0 9 * * MON#1,FRIL,WED")
    assert cron.month_days(2026, 7) == (1, 6, 8, 15, 22, 29, 31)  # Wednesdays, first Monday 6, last Friday 31
    assert parse_cron("0 9 1,15W,L * *").month_days(2026, 8) == (1, 14, 31)


def test_and_rule_with_a_stepped_star() -> None:
    # "*/2" starts with "*", so the day fields combine with AND: odd days that are a fifth Thursday.
    cron = parse_cron("0 9 */2 * THU#5")
    assert [m for m in range(1, 13) if cron.month_days(2026, m)] == [1, 10, 12]  # April, July: the 30th
    assert cron.month_days(2026, 1) == (29,)


@pytest.mark.parametrize(("gap", "first"), [("skip", "2025-03-31T00:30Z"), ("shift", "2024-03-31T01:00Z")])
def test_a_term_on_a_spring_forward_day_follows_dst_gap(gap: str, first: str) -> None:
    # 2024-03-31 is the last day of March and Berlin's spring-forward Sunday: 02:30 does not exist.
    spec = build_time_spec("cron", "30 2 L 3 *", "Europe/Berlin", dst_gap=gap)
    assert fire_times(spec, at("2024-03-01T00:00Z"), 1) == [at(first)]


def test_months_without_the_day_do_not_fire() -> None:
    assert local_dates("0 9 31W * *", "UTC", "2026-04-01T00:00Z", "2026-05-01T00:00Z") == []
    assert local_dates("0 9 L-29 * *", "UTC", "2026-01-01T00:00Z", "2026-12-31T00:00Z") == [
        "2026-01-02 09:00",
        "2026-03-02 09:00",
        "2026-04-01 09:00",
        "2026-05-02 09:00",
        "2026-06-01 09:00",
        "2026-07-02 09:00",
        "2026-08-02 09:00",
        "2026-09-01 09:00",
        "2026-10-02 09:00",
        "2026-11-01 09:00",
        "2026-12-02 09:00",
    ]


def test_fifth_weekday_of_february_fires_in_leap_years() -> None:
    # February has a fifth Sunday only when it has 29 days and starts on a Sunday: 2032 and 2060.
    spec = build_time_spec("cron", "0 12 * 2 SUN#5", "UTC")
    assert fire_times(spec, at("2026-01-01T00:00Z"), 2) == [at("2032-02-29T12:00Z"), at("2060-02-29T12:00Z")]


# --------------------------------------------------------------------------- rejected


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("0 9 31W 2 *", "can never fire"),
        ("0 9 30W 2 *", "can never fire"),
        ("0 9 L-29 2 *", "can never fire"),
        ("0 9 */10 2 MON#5", "can never fire"),  # AND: days 1, 11, 21, 31 are never a fifth Monday of Feb
        ("0 9 L * FRI", "ambiguous"),
        ("0 9 15 * TUE#2", "ambiguous"),
        ("0 9 L * MON#1", "ambiguous"),
        ("0 9 1-5 * FRIL", "ambiguous"),
        ("0 9 * * L", "bare 'L' in the day-of-week field"),
        ("0 9 L/2 * *", "not valid in the day-of-month field"),
        ("0 9 1-5W * *", "not valid in the day-of-month field"),
        ("0 9 L-3W * *", "not valid in the day-of-month field"),
        ("0 9 L-31 * *", "must be 0-30"),
        ("0 9 0W * *", "needs a day 1-31"),
        ("0 9 32W * *", "needs a day 1-31"),
        ("0 9 * * MON#6", "must be 1-5"),
        ("0 9 * * MON#0", "must be 1-5"),
        ("0 9 * * 8#1", "not valid in the day-of-week field"),
        ("0 9 * * MON-FRI#2", "not valid in the day-of-week field"),
        ("0 9 2#1 * *", "belongs in the day-of-week field"),
        ("0 9 * * 15W", "belongs in the day-of-month field"),
        ("0 L * * *", "only in the day-of-month and day-of-week fields"),
        ("0 9 * L *", "only in the day-of-month and day-of-week fields"),
        ("0 9 ? * MON", "'?'"),
    ],
)
def test_rejected_with_a_reason(expression: str, problem: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        build_time_spec("cron", expression, "UTC")
    assert caught.value.field == "expression"
    assert problem in str(caught.value), str(caught.value)


def test_plain_never_firing_messages_are_unchanged() -> None:
    with pytest.raises(InvalidInput, match="no selected month has the selected day of month"):
        parse_cron("0 9 30 2 *")


# --------------------------------------------------------------------------- which rule produced a fire


@pytest.mark.parametrize(
    ("expression", "after", "rule"),
    [
        ("0 9 L * *", "2026-02-01T00:00Z", "day-of-month L: last day of the month"),
        ("0 9 L-3 * *", "2026-02-01T00:00Z", "day-of-month L-3: 3 days before the last day"),
        ("0 9 15W * *", "2026-08-01T00:00Z", "day-of-month 15W: weekday nearest to day 15 (Saturday 15 -> Friday 14)"),
        ("0 9 LW * *", "2026-05-01T00:00Z", "day-of-month LW: weekday nearest to last day (Sunday 31 -> Friday 29)"),
        ("0 9 * * TUE#2", "2026-01-01T00:00Z", "day-of-week TUE#2: second Tuesday of the month"),
        ("0 9 * * FRIL", "2026-01-01T00:00Z", "day-of-week FRIL: last Friday of the month"),
        ("0 9 1,15W * *", "2026-01-02T00:00Z", "day-of-month 15W: weekday nearest to day 15 (itself a weekday)"),
        ("0 9 1,15W * *", "2025-12-31T00:00Z", "day-of-month 1"),
        # Vixie's OR rule: say which field matched.
        ("0 0 13 * FRI", "2026-02-12T00:00Z", "day-of-month 13 and day-of-week FRI"),
        ("0 0 13 * FRI", "2026-02-14T00:00Z", "day-of-week FRI"),
        ("0 0 13 * FRI", "2026-04-12T00:00Z", "day-of-month 13"),
        ("0 9 */2 * MON", "2026-01-01T00:00Z", "day-of-month */2 and day-of-week MON"),
        ("0 9 * * MON-FRI", "2026-01-01T00:00Z", "day-of-week MON-FRI"),
        ("0 9 * * *", "2026-01-01T00:00Z", "every day"),
    ],
)
def test_preview_names_the_rule(expression: str, after: str, rule: str) -> None:
    spec = build_time_spec("cron", expression, "UTC")
    (fire,) = preview(spec, at(after), 1)
    assert fire.rule == rule


def test_preview_names_the_daylight_saving_treatment() -> None:
    shifted = build_time_spec("cron", "30 2 * * *", "America/New_York", dst_gap="shift")
    (fire,) = preview(shifted, at("2026-03-08T00:00Z"), 1)
    assert fire.rule == "every day; 02:30 does not exist on 2026-03-08 (daylight saving gap): shifted to 03:00"
    both = build_time_spec("cron", "30 1 * * *", "America/New_York", dst_repeat="both")
    first, second = preview(both, at("2026-11-01T00:00Z"), 2)
    assert first.rule == "every day; 01:30 happens twice on 2026-11-01: the first time"
    assert second.rule == "every day; 01:30 happens twice on 2026-11-01: the second time (dst_repeat=both)"
    rate = build_time_spec("rate", "90m", "UTC", anchor="2026-01-01T00:00:00Z")
    assert preview(rate, at("2026-01-01T00:00Z"), 1)[0].rule == "rate 90m from 2026-01-01T00:00:00Z"
    once = build_time_spec("once", "2026-06-01T09:00:00Z", "UTC")
    assert preview(once, at("2026-01-01T00:00Z"), 1)[0].rule == "once"

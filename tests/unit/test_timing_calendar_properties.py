"""Property tests: cron calendar terms and exclusion calendars against the brute-force oracle.

The oracle (time_oracle.py) tests each day rule on the date itself ("is the
day after this one in another month?", "is this the weekday closest to the
15th among the month's weekdays?") and reads exclusions as "the local date of
this instant on the calendar's clock is listed", walking UTC minute by
minute. Neither shares code with engine/.

Expressions are aimed at the days where it matters: a term is derived from
the local date of one of the zone's real offset transitions (midnight
transitions in Havana, Santiago, Beirut, Asunción, Tehran; 00:01 transitions
in St. John's; 30-minute shifts on Lord Howe...), so the DST rules run on
the very day a term selects; calendars list that date, its neighbours or
ranges around it. Every dst_repeat x dst_gap. CHRONOQ_PROPERTY_EXAMPLES
raises the budget (python -m load_tests.oracle_agreement runs a large one).
"""

from __future__ import annotations

import calendar as gregorian
import dataclasses
import os
from datetime import UTC, date, datetime, timedelta
from functools import cache
from itertools import pairwise
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine.control.schedule_requests import build_time_spec
from engine.rules.cron_expression import parse_cron
from engine.rules.exclusion_calendars import CalendarEntry, ExclusionCalendar
from engine.rules.timing import (
    decide_misfire,
    fire_times,
    next_fire_after,
    parse_misfire_policy,
    previous_fire_before,
)
from engine.rules.timing.exclusions import excluded_slots
from schemas.errors import InvalidInput
from tests.unit.time_oracle import OracleCron, oracle_fire_times, transitions

UTC = UTC
EXAMPLES = int(os.environ.get("CHRONOQ_PROPERTY_EXAMPLES", "120"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]

ZONES = [
    "America/Havana",  # midnight: 00:00 -> 01:00, 01:00 -> 00:00
    "America/Santiago",  # midnight: 24:00 -> 23:00, 00:00 -> 01:00
    "Asia/Beirut",  # midnight
    "America/Asuncion",  # midnight
    "Asia/Tehran",  # midnight (until 2022)
    "America/Sao_Paulo",  # midnight (until 2019)
    "America/St_Johns",  # 00:01 until 2011: the repeated hour crosses midnight
    "America/Goose_Bay",  # 00:01 too
    "Australia/Lord_Howe",  # 30-minute shift
    "Pacific/Chatham",  # +12:45 / +13:45
    "Europe/Dublin",  # negative DST in tzdata
    "America/New_York",
    "Europe/Berlin",
    "Pacific/Apia",  # skipped 2011-12-30
]
OPTIONS = st.tuples(st.sampled_from(["first", "both"]), st.sampled_from(["skip", "shift"]))


@cache
def zone_transitions(zone: str, year: int) -> tuple[datetime, ...]:
    return tuple(transitions(zone, year))


@st.composite
def transition_window(draw: st.DrawFn, zone: str) -> tuple[datetime, datetime, date]:
    """A window of up to three days around one of the zone's transitions, and a local date in it."""
    year = draw(st.integers(1975, 2037))
    found = zone_transitions(zone, year)
    if found:
        centre = draw(st.sampled_from(found))
    else:
        centre = datetime(year, 1, 1, tzinfo=UTC) + timedelta(minutes=draw(st.integers(0, 364 * 1440)))
    low = centre - timedelta(minutes=draw(st.integers(0, 36 * 60)))
    low += timedelta(seconds=draw(st.sampled_from([0, 0, 1, 59])))
    high = low + timedelta(minutes=draw(st.integers(60, 72 * 60)))
    probe = centre + timedelta(minutes=draw(st.integers(-12 * 60, 12 * 60)))
    return low, high, probe.astimezone(ZoneInfo(zone)).date()


def _weekday(day: date) -> int:
    return day.isoweekday() % 7


@st.composite
def day_of_month_term(draw: st.DrawFn, day: date) -> str:
    """A day-of-month term; usually one that selects (or is near) ``day``."""
    last = gregorian.monthrange(day.year, day.month)[1]
    return draw(
        st.one_of(
            st.just(f"L-{last - day.day}" if last - day.day else "L"),
            st.just(f"{day.day}W"),
            st.integers(max(1, day.day - 2), min(31, day.day + 2)).map(lambda n: f"{n}W"),
            st.just("LW"),
            st.just("L"),
            st.integers(0, 30).map(lambda n: f"L-{n}"),
            st.integers(1, 31).map(lambda n: f"{n}W"),
        )
    )


@st.composite
def day_of_week_term(draw: st.DrawFn, day: date) -> str:
    weekday = _weekday(day)
    nth = (day.day - 1) // 7 + 1
    name = draw(st.sampled_from([str(weekday), DAYS[weekday], DAYS[weekday].lower()] + (["7"] if weekday == 0 else [])))
    return draw(
        st.one_of(
            st.just(f"{name}#{nth}"),
            st.just(f"{name}L"),
            st.tuples(st.sampled_from(DAYS + [str(n) for n in range(8)]), st.integers(1, 5)).map(
                lambda t: f"{t[0]}#{t[1]}"
            ),
            st.sampled_from(DAYS + [str(n) for n in range(8)]).map(lambda d: f"{d}L"),
        )
    )


@st.composite
def term_expressions(draw: st.DrawFn, day: date) -> str:
    """A five-field expression with a calendar term in one day field, aimed at ``day``."""
    minute = draw(st.sampled_from(["0", "30", "*/15", "0,30", "45", "59", "*", "1", "0-5"]))
    hour = draw(st.sampled_from(["*", "0", "1", "2", "3", "0-3", "23", "0,12", "22-23", "*/2"]))
    plain_dom = st.integers(1, 31).map(str)
    plain_dow = st.sampled_from(DAYS + [str(n) for n in range(8)] + ["MON-FRI"])
    if draw(st.booleans()):
        items = draw(st.lists(day_of_month_term(day), min_size=1, max_size=2))
        items += draw(st.lists(plain_dom, max_size=1))
        dom = ",".join(draw(st.permutations(items)))
        dow = draw(st.sampled_from(["*", "*", "*/2", "*/3"]))
    else:
        items = draw(st.lists(day_of_week_term(day), min_size=1, max_size=2))
        items += draw(st.lists(plain_dow, max_size=1))
        dow = ",".join(draw(st.permutations(items)))
        dom = draw(st.sampled_from(["*", "*", "*/2", "*/10"]))
    month = draw(st.sampled_from(["*", str(day.month), f"{day.month},{day.month % 12 + 1}", "*/2", "*"]))
    return f"{minute} {hour} {dom} {month} {dow}"


def spec_or_reject(expression: str, zone: str, repeat: str, gap: str, calendar: ExclusionCalendar | None = None):
    try:
        spec = build_time_spec("cron", expression, zone, dst_repeat=repeat, dst_gap=gap)
    except InvalidInput:
        assume(False)  # never-firing combinations (0 9 31W 2 *): covered by the fixed cases
    return dataclasses.replace(spec, calendar=calendar)


# --------------------------------------------------------------------------- day rules alone


@settings(max_examples=EXAMPLES, deadline=None, database=None)
@given(data=st.data(), year=st.integers(1900, 2390), anchor_day=st.integers(0, 3650))
def test_days_agree_with_the_oracle_over_ten_years(data: st.DataObject, year: int, anchor_day: int) -> None:
    """month_days against the oracle's date-by-date predicates, ten years at a time (leap years, centuries)."""
    day = date(year, 1, 1) + timedelta(days=anchor_day)
    expression = data.draw(term_expressions(day))
    try:
        cron = parse_cron(expression)
    except InvalidInput:
        assume(False)
    oracle = OracleCron(expression)
    first, last = date(year, 1, 1), date(year + 10, 1, 1)
    expected = [d for d in (first + timedelta(n) for n in range((last - first).days)) if oracle.day_matches(d)]
    found = [date(y, m, n) for y in range(year, year + 10) for m in range(1, 13) for n in cron.month_days(y, m)]
    assert found == expected, expression


# --------------------------------------------------------------------------- terms across transitions


@PROPERTY
@given(data=st.data(), zone=st.sampled_from(ZONES), options=OPTIONS)
def test_term_fire_times_match_the_oracle_across_transitions(
    data: st.DataObject, zone: str, options: tuple[str, str]
) -> None:
    low, high, day = data.draw(transition_window(zone))
    expression = data.draw(term_expressions(day))
    repeat, gap = options
    spec = spec_or_reject(expression, zone, repeat, gap)
    expected = oracle_fire_times(expression, zone, low, high, repeat, gap)
    assert fire_times(spec, low, 10_000, high) == expected
    if expected:
        assert next_fire_after(spec, low) == expected[0]
        assert previous_fire_before(spec, high + timedelta(microseconds=1)) == expected[-1]
    for earlier, later in pairwise(expected):
        assert next_fire_after(spec, earlier) == later
        assert previous_fire_before(spec, later) == earlier


# --------------------------------------------------------------------------- exclusion calendars


@st.composite
def calendars_near(draw: st.DrawFn, day: date) -> ExclusionCalendar:
    """A calendar listing ``day``, its neighbours, ranges around it, or unrelated dates; maybe in another zone."""
    entries = []
    for _ in range(draw(st.integers(1, 4))):
        start = day + timedelta(days=draw(st.integers(-3, 3)))
        entries.append(CalendarEntry(start, start + timedelta(days=draw(st.sampled_from([0, 0, 0, 1, 2, 40])))))
    if draw(st.booleans()):
        far = day + timedelta(days=draw(st.integers(100, 2000)))
        entries.append(CalendarEntry(far, far))
    zone = draw(st.one_of(st.none(), st.none(), st.sampled_from(ZONES + ["UTC", "Pacific/Kiritimati"])))
    return ExclusionCalendar("probe", draw(st.integers(1, 3)), zone, tuple(entries))


def listed_dates(calendar: ExclusionCalendar) -> set[date]:
    return {e.start + timedelta(days=n) for e in calendar.entries for n in range((e.end - e.start).days + 1)}


@PROPERTY
@given(data=st.data(), zone=st.sampled_from(ZONES), options=OPTIONS, with_term=st.booleans())
def test_calendar_fire_times_match_the_oracle(
    data: st.DataObject, zone: str, options: tuple[str, str], with_term: bool
) -> None:
    low, high, day = data.draw(transition_window(zone))
    if with_term:
        expression = data.draw(term_expressions(day))
    else:
        expression = data.draw(
            st.sampled_from(
                [
                    "0 * * * *",
                    "*/15 * * * *",
                    "30 0-3 * * *",
                    "0 0 * * *",
                    "59 23 * * *",
                    "*/20 1,2 * * MON-FRI",
                    "0,30 * * * *",
                    "15 2 * * *",
                    "45 1 * * *",
                    "0 12 * * *",
                ]
            )
        )
    calendar = data.draw(calendars_near(day))
    repeat, gap = options
    spec = spec_or_reject(expression, zone, repeat, gap, calendar)
    listed = listed_dates(calendar)
    every = oracle_fire_times(expression, zone, low, high, repeat, gap)
    expected = oracle_fire_times(
        expression, zone, low, high, repeat, gap, excluded=listed, calendar_zone=calendar.time_zone
    )
    assert fire_times(spec, low, 10_000, high) == expected
    if expected:
        assert next_fire_after(spec, low) == expected[0]
        assert previous_fire_before(spec, high + timedelta(microseconds=1)) == expected[-1]
    for earlier, later in pairwise(expected):
        assert next_fire_after(spec, earlier) == later
        assert previous_fire_before(spec, later) == earlier
    # What the calendar removed, shown as excluded (not missing) to previews and reconcilers.
    removed = [s.utc for s in excluded_slots(spec, None, low, high, limit=10_000)]
    assert removed == [t for t in every if t not in set(expected)]
    clock = ZoneInfo(calendar.zone_for(zone))
    assert all(t.astimezone(clock).date() in listed for t in removed)


@PROPERTY
@given(data=st.data(), zone=st.sampled_from(ZONES), options=OPTIONS, limit=st.integers(0, 5))
def test_missed_count_with_a_calendar_matches_the_oracle(
    data: st.DataObject, zone: str, options: tuple[str, str], limit: int
) -> None:
    """Excluded slots are neither enqueued nor missed; the count of unlisted missed fires stays exact."""
    low, high, day = data.draw(transition_window(zone))
    expression = data.draw(
        st.one_of(term_expressions(day), st.sampled_from(["*/5 * * * *", "0 * * * *", "*/30 0-4 * * *"]))
    )
    calendar = data.draw(calendars_near(day))
    repeat, gap = options
    spec = spec_or_reject(expression, zone, repeat, gap, calendar)
    expected = oracle_fire_times(
        expression, zone, low, high, repeat, gap, excluded=listed_dates(calendar), calendar_zone=calendar.time_zone
    )
    every = oracle_fire_times(expression, zone, low, high, repeat, gap)
    cursor = low + timedelta(microseconds=1)
    decision = decide_misfire(spec, cursor, high, parse_misfire_policy("skip", timedelta(0)), record_limit=limit)
    assert decision.excluded == len(every) - len(expected)
    late = [t for t in expected if t < high]
    assert decision.missed == late[:limit]
    assert decision.missed_unlisted == len(late) - len(decision.missed)
    assert decision.enqueue == [t for t in expected if t == high]
    # The durable cursor walks slots, excluded or not: a calendar changed later still applies to them.
    assert decision.next_run_at == next_fire_after(dataclasses.replace(spec, calendar=None), high)


@PROPERTY
@given(
    data=st.data(),
    zone=st.sampled_from(ZONES),
    options=OPTIONS,
    remaining=st.integers(0, 6),
    policy=st.sampled_from(["skip", "fire_once", "catch_up:3", "catch_up:1000"]),
)
def test_run_limit_enqueues_at_most_the_remaining_runs(
    data: st.DataObject, zone: str, options: tuple[str, str], remaining: int, policy: str
) -> None:
    low, high, day = data.draw(transition_window(zone))
    expression = data.draw(st.sampled_from(["*/5 * * * *", "0 * * * *", "*/30 0-4 * * *", "15 2 * * *"]))
    repeat, gap = options
    spec = spec_or_reject(expression, zone, repeat, gap)
    now = low + (high - low) / 2
    rules = parse_misfire_policy(policy, timedelta(minutes=1))
    free = decide_misfire(spec, low, now, rules, timedelta(hours=1))
    limited = decide_misfire(spec, low, now, rules, timedelta(hours=1), remaining_runs=remaining)
    assert limited.enqueue == free.enqueue[:remaining]
    # Missed instants are older than every enqueued one, so they come before the last run; a schedule
    # with no run left decides nothing at all.
    assert limited.missed == (free.missed if remaining else [])
    if len(free.enqueue) >= remaining and (free.enqueue or remaining == 0):
        assert limited.next_run_at is None  # the last run is materialized: the schedule completes
        assert limited.runs_exhausted
    else:
        assert limited.next_run_at == free.next_run_at
        assert not limited.runs_exhausted

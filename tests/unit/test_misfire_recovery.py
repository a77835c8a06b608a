"""Bounded misfire recovery: the engine's on-time limit caps max_lateness, catch-up is listed apart and never
exceeds its bound, unlisted missed instants come as one range, and lateness is checked again at dispatch."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.control.schedule_requests import build_time_spec
from engine.rules.timing import (
    MisfirePolicy,
    TimeSpec,
    decide_dispatch,
    decide_misfire,
    fire_times,
    late_threshold,
    parse_misfire_policy,
)
from schemas.dispatch_lateness import LateDelivery, judge_late, stored_policy

UTC = UTC
US = timedelta(microseconds=1)
MINUTE = timedelta(minutes=1)
ON_TIME_LIMIT = timedelta(seconds=60)
EVERY_SECOND = build_time_spec("rate", "1s")
MINUTELY = build_time_spec("cron", "* * * * *", "UTC")


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2026, 12, 1, hour, minute, second, tzinfo=UTC)


def allowed(policy: MisfirePolicy) -> int:
    return {"skip": 0, "fire_once": 1}.get(policy.kind, policy.catch_up_limit)


def test_three_day_outage_of_an_every_second_skip_schedule_with_huge_lateness_is_bounded() -> None:
    """The issue's case: max_lateness 3660 days made 259,000 instants "on time" in one pass."""
    start = datetime(2026, 12, 1, tzinfo=UTC)
    now = start + timedelta(days=3)
    began = time.perf_counter()
    decision = decide_misfire(
        EVERY_SECOND,
        start,
        now,
        parse_misfire_policy("skip", "3660d"),
        timedelta(seconds=30),
        1000,
        on_time_limit=ON_TIME_LIMIT,
    )
    elapsed = time.perf_counter() - began
    assert decision.enqueue == [now + timedelta(seconds=s) for s in range(-60, 31)]  # 60 s back, 30 s ahead
    assert decision.catch_up == []
    assert decision.missed == [start + timedelta(seconds=s) for s in range(1000)]
    late = 3 * 86_400 - 60  # start .. now - 61 s
    assert decision.missed_unlisted == late - 1000
    assert decision.missed_range is not None
    assert (decision.missed_range.first, decision.missed_range.last, decision.missed_range.count) == (
        start + timedelta(seconds=1000),
        now - timedelta(seconds=61),
        late - 1000,
    )
    assert decision.next_run_at == now + timedelta(seconds=31)
    assert elapsed < 0.5, f"{elapsed:.3f} s: must not enumerate what it only counts"


def test_catch_up_three_after_two_hours_with_a_day_of_lateness_enqueues_three_late() -> None:
    """The issue's case: catch_up:3 with one day of lateness produced ~7,200 occurrences."""
    start = at(8)
    now = at(10)
    decision = decide_misfire(
        EVERY_SECOND, start, now, parse_misfire_policy("catch_up:3", "1d"), on_time_limit=ON_TIME_LIMIT
    )
    assert decision.catch_up == [now - timedelta(seconds=s) for s in (63, 62, 61)]
    assert decision.on_time == [now + timedelta(seconds=s) for s in range(-60, 1)]
    assert len(decision.enqueue) == 3 + 61
    assert decision.missed_unlisted is not None
    assert len(decision.missed) + decision.missed_unlisted == 2 * 3600 - 60 - 3  # the rest, recorded
    # Without the engine's limit a day of lateness makes all 7,201 instants on time:
    assert len(decide_misfire(EVERY_SECOND, start, now, parse_misfire_policy("catch_up:3", "1d")).enqueue) == 7201


# A ten-minute engine outage of a minutely schedule (10:00 .. 10:09 due while down), decided at 10:10:30.
OUTAGE_NOW = at(10, 10, 30)


@pytest.mark.parametrize(
    ("text", "lateness", "catch_up", "on_time", "missed"),
    [
        ("skip", "5m", [], [at(10, 10)], [at(10, m) for m in range(10)]),
        ("skip", "1d", [], [at(10, 10)], [at(10, m) for m in range(10)]),  # the limit caps max_lateness
        ("fire_once", "5m", [], [at(10, 10)], [at(10, m) for m in range(10)]),  # 10:10 already runs on time
        ("catch_up:3", "5m", [at(10, 7), at(10, 8), at(10, 9)], [at(10, 10)], [at(10, m) for m in range(7)]),
        ("catch_up:3", "1d", [at(10, 7), at(10, 8), at(10, 9)], [at(10, 10)], [at(10, m) for m in range(7)]),
        ("catch_up:20", "1d", [at(10, m) for m in range(10)], [at(10, 10)], []),
        ("skip", "0s", [], [], [at(10, m) for m in range(11)]),  # 10:10 is 30 s late: late
    ],
)
def test_ten_minute_outage_per_policy(text: str, lateness: str, catch_up: list, on_time: list, missed: list) -> None:
    decision = decide_misfire(
        MINUTELY, at(10), OUTAGE_NOW, parse_misfire_policy(text, lateness), on_time_limit=ON_TIME_LIMIT
    )
    assert (decision.catch_up, decision.on_time, decision.missed) == (catch_up, on_time, missed)
    assert decision.missed_unlisted == 0 and decision.missed_range is None
    assert decision.next_run_at == at(10, 11)


def test_fire_once_runs_the_latest_missed_instant_when_nothing_runs_on_time() -> None:
    # Decided at 10:10:59 with a 30 s limit: 10:10 is 59 s late too, so nothing is on time.
    decision = decide_misfire(
        MINUTELY, at(10), at(10, 10, 59), parse_misfire_policy("fire_once", "1d"), on_time_limit=timedelta(seconds=30)
    )
    assert decision.catch_up == [at(10, 10)] and decision.on_time == []
    assert decision.missed == [at(10, m) for m in range(10)]


def test_record_limit_zero_summarises_everything_missed_as_one_range() -> None:
    decision = decide_misfire(
        MINUTELY, at(10), OUTAGE_NOW, parse_misfire_policy("skip"), record_limit=0, on_time_limit=ON_TIME_LIMIT
    )
    assert decision.missed == [] and decision.missed_unlisted == 10
    assert decision.missed_range is not None
    assert (decision.missed_range.first, decision.missed_range.last) == (at(10), at(10, 9))


def test_the_on_time_limit_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="on_time_limit"):
        decide_misfire(MINUTELY, at(10), OUTAGE_NOW, parse_misfire_policy("skip"), on_time_limit=-US)
    assert late_threshold(parse_misfire_policy("skip", "5m"), None) == timedelta(minutes=5)
    assert late_threshold(parse_misfire_policy("skip", "5m"), ON_TIME_LIMIT) == ON_TIME_LIMIT


SPECS = [
    build_time_spec("cron", "*/7 * * * *", "America/New_York", dst_repeat="both"),
    build_time_spec("cron", "30 1,2 * * *", "America/New_York", dst_gap="shift"),
    build_time_spec("rate", "13m", anchor="2026-03-07T00:00:05Z"),
    build_time_spec("rate", "45s", anchor="2026-03-07T00:00:00Z"),
    build_time_spec("once", "2026-03-08T07:00:00Z"),
]


@settings(max_examples=200, deadline=None, database=None)
@given(
    spec=st.sampled_from(SPECS),
    cursor_minutes=st.integers(0, 3 * 1440),
    outage_minutes=st.integers(0, 1440),
    text=st.sampled_from(["skip", "fire_once", "catch_up:1", "catch_up:4"]),
    lateness=st.integers(0, 3000),
    limit=st.one_of(st.none(), st.integers(0, 120)),
    horizon=st.integers(0, 60),
    record_limit=st.integers(0, 6),
)
def test_bounded_and_nothing_silently_dropped(
    spec: TimeSpec,
    cursor_minutes: int,
    outage_minutes: int,
    text: str,
    lateness: int,
    limit: int | None,
    horizon: int,
    record_limit: int,
) -> None:
    cursor = datetime(2026, 3, 6, tzinfo=UTC) + timedelta(minutes=cursor_minutes)
    now = cursor + timedelta(minutes=outage_minutes, seconds=17)
    policy = parse_misfire_policy(text, f"{lateness}m")
    on_time_limit = timedelta(minutes=limit) if limit is not None else None
    horizon_td = timedelta(minutes=horizon)
    decision = decide_misfire(spec, cursor, now, policy, horizon_td, record_limit, on_time_limit=on_time_limit)
    threshold = late_threshold(policy, on_time_limit)
    everything = fire_times(spec, cursor - US, 100_000, now + horizon_td)
    late = [t for t in everything if now - t > threshold]
    # Every instant: enqueued (on time or catch-up), listed missed, or inside the summary range; none twice.
    assert set(decision.catch_up) <= set(decision.enqueue)
    assert set(decision.enqueue).isdisjoint(decision.missed)
    assert decision.missed_unlisted is not None
    assert len(decision.enqueue) + len(decision.missed) + decision.missed_unlisted == len(everything)
    # Catch-up is exactly the late instants enqueued, never more than the policy's bound.
    assert decision.catch_up == [t for t in decision.enqueue if t in late]
    assert len(decision.catch_up) <= allowed(policy)
    assert all(now - t <= threshold for t in decision.on_time)
    # On-time work is bounded by the limit and the horizon, whatever max_lateness is.
    assert len(decision.on_time) == len([t for t in everything if now - t <= threshold])
    # The summary range covers exactly the unlisted missed instants.
    unlisted = [t for t in late if t not in decision.missed and t not in decision.catch_up]
    if decision.missed_range is None:
        assert unlisted == []
    else:
        assert decision.missed_range.count == len(unlisted)
        assert (decision.missed_range.first, decision.missed_range.last) == (unlisted[0], unlisted[-1])
        assert all(m < decision.missed_range.first for m in decision.missed)


# -------------------------------------------------------------------- dispatch


def test_a_relay_outage_publishes_on_time_work_and_applies_the_policy_to_the_late() -> None:
    # A minutely schedule's occurrences 10:00 .. 10:06 waited while the relay was down; it is back at 10:06:10.
    due = [at(10, m) for m in range(7)]
    now = at(10, 6, 10)
    skip = decide_dispatch(due, now, parse_misfire_policy("skip", "1d"), on_time_limit=ON_TIME_LIMIT)
    assert (skip.publish, skip.missed) == ([at(10, 6)], due[:6])
    once = decide_dispatch(due, now, parse_misfire_policy("fire_once"), on_time_limit=ON_TIME_LIMIT)
    assert (once.publish, once.missed) == ([at(10, 6)], due[:6])  # 10:06 runs on time: no extra run
    two = decide_dispatch(due, now, parse_misfire_policy("catch_up:2"), on_time_limit=ON_TIME_LIMIT)
    assert (two.publish, two.missed) == ([at(10, 4), at(10, 5), at(10, 6)], due[:4])
    # Back only at 10:08: nothing is on time any more; fire_once runs the latest once.
    late_once = decide_dispatch(due, at(10, 8), parse_misfire_policy("fire_once"), on_time_limit=ON_TIME_LIMIT)
    assert (late_once.publish, late_once.missed) == ([at(10, 6)], due[:6])
    # Within max_lateness and the limit: everything is still on time.
    fine = decide_dispatch(due, at(10, 6, 10), parse_misfire_policy("skip", "10m"))
    assert (fine.publish, fine.missed) == (due, [])


@settings(max_examples=300, deadline=None, database=None)
@given(
    offsets=st.lists(st.integers(-600, 600), max_size=30),
    text=st.sampled_from(["skip", "fire_once", "catch_up:1", "catch_up:3"]),
    lateness=st.integers(0, 400),
    limit=st.one_of(st.none(), st.integers(0, 400)),
)
def test_dispatch_publishes_on_time_work_and_bounds_the_late(
    offsets: list[int], text: str, lateness: int, limit: int | None
) -> None:
    now = at(12)
    due = [now + timedelta(seconds=o) for o in offsets]
    policy = parse_misfire_policy(text, f"{lateness}s")
    on_time_limit = timedelta(seconds=limit) if limit is not None else None
    decision = decide_dispatch(due, now, policy, on_time_limit=on_time_limit)
    threshold = late_threshold(policy, on_time_limit)
    assert set(decision.publish) | set(decision.missed) == set(due)
    assert set(decision.publish).isdisjoint(decision.missed)
    on_time = {t for t in due if now - t <= threshold}
    assert on_time <= set(decision.publish)
    late_published = sorted(set(decision.publish) - on_time)
    assert len(late_published) <= allowed(policy)
    late = sorted(set(due) - on_time)
    assert late_published == late[len(late) - len(late_published) :]  # always the most recent late ones
    assert all(m < p for m in decision.missed for p in late_published)


def test_a_stored_policy_reads_back_what_the_schedule_says() -> None:
    threshold = timedelta(seconds=42)
    for text in ("skip", "fire_once", "catch_up:7"):
        assert stored_policy(text, threshold) == parse_misfire_policy(text, threshold)
    with pytest.raises(ValueError, match="misfire_policy"):
        stored_policy("catch_up", threshold)


@settings(max_examples=200, deadline=None, database=None)
@given(
    schedules=st.lists(
        st.tuples(
            st.sampled_from(["skip", "fire_once", "catch_up:1", "catch_up:3"]),
            st.integers(0, 120),
            st.lists(st.integers(-600, 0), max_size=12, unique=True),
        ),
        max_size=4,
    )
)
def test_judging_late_deliveries_applies_the_policy_per_schedule(schedules: list[tuple[str, int, list[int]]]) -> None:
    """The relays' verdict is decide_dispatch per schedule, whatever the rows of other schedules around it."""
    now = at(12)
    deliveries = []
    for number, (text, lateness, offsets) in enumerate(schedules):
        for offset in offsets:
            due = now + timedelta(seconds=offset)
            deliveries.append(LateDelivery((number, offset), number, due, due + timedelta(seconds=lateness), text))
    verdict = judge_late(deliveries[::-1], now)  # order does not matter
    missed_handles = [cast(tuple[int, int], h) for h in verdict.missed]
    kept_handles = [cast(tuple[int, int], h) for h in verdict.published_late]
    for number, (text, lateness, offsets) in enumerate(schedules):
        instants = [now + timedelta(seconds=o) for o in offsets]
        decision = decide_dispatch(instants, now, parse_misfire_policy(text, f"{lateness}s"))
        missed = sorted(h[1] for h in missed_handles if h[0] == number)
        assert missed == sorted(int((t - now).total_seconds()) for t in decision.missed)
        kept = sorted(h[1] for h in kept_handles if h[0] == number)
        late_published = [t for t in decision.publish if now - t > timedelta(seconds=lateness)]
        assert kept == sorted(int((t - now).total_seconds()) for t in late_published)

"""Misfire decisions after an outage: per policy, at the lateness threshold, bounded work."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.control.schedule_requests import build_time_spec
from engine.rules.timing import (
    MisfirePolicy,
    TimeSpec,
    decide_misfire,
    fire_times,
    parse_misfire_policy,
)

UTC = UTC
US = timedelta(microseconds=1)
HOURLY = build_time_spec("cron", "0 * * * *", "UTC")


def at(hour: int, minute: int = 0, second: int = 0, micro: int = 0) -> datetime:
    return datetime(2026, 5, 4, hour, minute, second, micro, tzinfo=UTC)


def policy(text: str, lateness: str = "5m") -> MisfirePolicy:
    return parse_misfire_policy(text, lateness)


# One fire at 10:00, max_lateness 5 minutes; "now" just under / exactly at / just over the threshold.
UNDER = at(10, 4, 59, 999_999)
EXACT = at(10, 5)
OVER = at(10, 5, 0, 1)


@pytest.mark.parametrize(
    ("text", "now", "enqueue", "missed"),
    [
        ("skip", UNDER, [at(10)], []),
        ("skip", EXACT, [at(10)], []),  # exactly at the threshold is on time
        ("skip", OVER, [], [at(10)]),
        ("fire_once", UNDER, [at(10)], []),
        ("fire_once", EXACT, [at(10)], []),
        ("fire_once", OVER, [at(10)], []),  # late, but the one catch-up run
        ("catch_up:2", UNDER, [at(10)], []),
        ("catch_up:2", EXACT, [at(10)], []),
        ("catch_up:2", OVER, [at(10)], []),
    ],
)
def test_threshold(text: str, now: datetime, enqueue: list[datetime], missed: list[datetime]) -> None:
    decision = decide_misfire(HOURLY, at(10), now, policy(text))
    assert decision.enqueue == enqueue
    assert decision.missed == missed
    assert decision.missed_unlisted == 0
    assert decision.next_run_at == at(11)


@pytest.mark.parametrize(
    ("text", "now", "enqueue", "missed"),
    [
        # Outage from 06:00; at 10:02 the 10:00 fire is on time, 06:00-09:00 are late.
        ("skip", at(10, 2), [at(10)], [at(6), at(7), at(8), at(9)]),
        # fire_once: an on-time fire at or before now already runs, so no extra catch-up run.
        ("fire_once", at(10, 2), [at(10)], [at(6), at(7), at(8), at(9)]),
        # At 10:30 even 10:00 is late and nothing is on time: run the most recent once.
        ("fire_once", at(10, 30), [at(10)], [at(6), at(7), at(8), at(9)]),
        ("catch_up:2", at(10, 2), [at(8), at(9), at(10)], [at(6), at(7)]),
        ("catch_up:2", at(10, 30), [at(9), at(10)], [at(6), at(7), at(8)]),
        ("catch_up:10", at(10, 30), [at(6), at(7), at(8), at(9), at(10)], []),
        ("skip", at(10, 30), [], [at(6), at(7), at(8), at(9), at(10)]),
    ],
)
def test_outage_per_policy(text: str, now: datetime, enqueue: list[datetime], missed: list[datetime]) -> None:
    decision = decide_misfire(HOURLY, at(6), now, policy(text))
    assert decision.enqueue == enqueue
    assert decision.missed == missed
    assert decision.missed_unlisted == 0
    assert decision.next_run_at == at(11)


def test_fire_once_with_only_future_on_time_fires_still_runs_once() -> None:
    # Horizon 2h: 11:00 and 12:00 are enqueued ahead, but nothing on time has happened yet.
    decision = decide_misfire(HOURLY, at(6), at(10, 30), policy("fire_once"), horizon=timedelta(hours=2))
    assert decision.enqueue == [at(10), at(11), at(12)]
    assert decision.missed == [at(6), at(7), at(8), at(9)]
    assert decision.next_run_at == at(13)


def test_horizon_and_record_limit() -> None:
    decision = decide_misfire(
        HOURLY, at(6), at(10, 2), policy("catch_up:2"), horizon=timedelta(hours=1), record_limit=1
    )
    assert decision.enqueue == [at(8), at(9), at(10), at(11)]
    assert decision.missed == [at(6)]
    assert decision.missed_unlisted == 1
    assert decision.next_run_at == at(12)


def test_not_due_keeps_the_durable_cursor() -> None:
    decision = decide_misfire(HOURLY, at(11), at(10, 2), policy("skip"))
    assert (decision.enqueue, decision.missed, decision.missed_unlisted) == ([], [], 0)
    assert decision.next_run_at == at(11)  # never moved backwards to "the next fire after now"


def test_cursor_between_fires_and_exactly_on_now() -> None:
    decision = decide_misfire(HOURLY, at(9, 30), at(10), policy("skip"))
    assert decision.enqueue == [at(10)]
    assert decision.next_run_at == at(11)  # strictly after: a start exactly on a fire time yields the next one


def test_once() -> None:
    spec = build_time_spec("once", "2026-05-04T10:00:00Z")
    late = decide_misfire(spec, at(10), at(12), policy("skip"))
    assert (late.enqueue, late.missed, late.next_run_at) == ([], [at(10)], None)
    caught_up = decide_misfire(spec, at(10), at(12), policy("fire_once"))
    assert (caught_up.enqueue, caught_up.missed, caught_up.next_run_at) == ([at(10)], [], None)
    on_time = decide_misfire(spec, at(10), at(10, 1), policy("skip"))
    assert (on_time.enqueue, on_time.missed, on_time.next_run_at) == ([at(10)], [], None)


def test_bounds_limit_what_is_decided() -> None:
    spec = build_time_spec("cron", "0 * * * *", "UTC", start_at=at(7), end_at=at(9))
    decision = decide_misfire(spec, at(6), at(12), policy("catch_up:1"))
    assert decision.enqueue == [at(9)]
    assert decision.missed == [at(7), at(8)]
    assert decision.next_run_at is None


def test_thirty_day_outage_every_second_is_bounded_and_exact() -> None:
    spec = build_time_spec("rate", "1s")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    now = start + timedelta(days=30)
    began = time.perf_counter()
    decision = decide_misfire(spec, start, now, policy("catch_up:5", "1m"), record_limit=1000)
    elapsed = time.perf_counter() - began
    total = 30 * 86_400 + 1  # every second in [start, now]
    on_time = 61  # now - 60 s ... now
    assert len(decision.enqueue) == on_time + 5
    assert len(decision.missed) == 1000
    assert decision.missed[0] == start
    assert decision.missed_unlisted == total - on_time - 5 - 1000
    assert decision.next_run_at == now + timedelta(seconds=1)
    assert elapsed < 0.5, f"took {elapsed:.3f}s; must not enumerate 2.6 million instants"


def test_thirty_day_outage_every_minute_cron_counts_exactly() -> None:
    spec = build_time_spec("cron", "* * * * *", "Europe/London")
    start = datetime(2026, 10, 1, tzinfo=UTC)
    # Spans the 2026-10-25 fall-back: the repeated local hour fires once, so 60 UTC minutes have no fire.
    now = start + timedelta(days=30)
    began = time.perf_counter()
    decision = decide_misfire(spec, start, now, policy("skip", "1m"), record_limit=100)
    elapsed = time.perf_counter() - began
    on_time = 2  # now - 1 min, now
    assert len(decision.enqueue) == on_time
    assert decision.missed_unlisted == 30 * 1440 + 1 - 60 - on_time - 100
    assert elapsed < 0.5


def test_ten_year_cron_outage_is_still_bounded() -> None:
    spec = build_time_spec("cron", "* * * * *", "America/New_York")
    start = datetime(2016, 1, 1, tzinfo=UTC)
    began = time.perf_counter()
    decision = decide_misfire(spec, start, start + timedelta(days=3700), policy("catch_up:3", "1m"), record_limit=10)
    assert time.perf_counter() - began < 1.0
    assert decision.missed_unlisted is None  # more than ten years: counted as "more, unknown"
    assert len(decision.missed) == 10 and len(decision.enqueue) == 3 + 2


def test_argument_checks() -> None:
    with pytest.raises(ValueError):
        decide_misfire(HOURLY, at(6), at(7), policy("skip"), horizon=timedelta(seconds=-1))
    with pytest.raises(ValueError):
        decide_misfire(HOURLY, at(6), at(7), policy("skip"), record_limit=-1)
    with pytest.raises(ValueError, match="aware"):
        decide_misfire(HOURLY, datetime(2026, 1, 1), at(7), policy("skip"))


SPECS = [
    build_time_spec("cron", "*/7 * * * *", "America/New_York", dst_repeat="both"),
    build_time_spec("cron", "30 1,2 * * *", "America/New_York", dst_gap="shift"),
    build_time_spec("cron", "0 0 * * *", "America/Santiago"),
    build_time_spec("rate", "13m", anchor="2026-03-07T00:00:05Z"),
    build_time_spec("once", "2026-03-08T07:00:00Z"),
]


@settings(max_examples=150, deadline=None, database=None)
@given(
    spec=st.sampled_from(SPECS),
    cursor_minutes=st.integers(0, 3 * 1440),
    outage_minutes=st.integers(0, 2 * 1440),
    text=st.sampled_from(["skip", "fire_once", "catch_up:1", "catch_up:4"]),
    lateness=st.integers(0, 240),
    horizon=st.integers(0, 120),
    record_limit=st.integers(0, 6),
)
def test_nothing_is_silently_dropped(
    spec: TimeSpec, cursor_minutes: int, outage_minutes: int, text: str, lateness: int, horizon: int, record_limit: int
) -> None:
    base = datetime(2026, 3, 6, tzinfo=UTC)
    cursor = base + timedelta(minutes=cursor_minutes)
    now = cursor + timedelta(minutes=outage_minutes, seconds=17)
    chosen = policy(text, f"{lateness}m")
    decision = decide_misfire(spec, cursor, now, chosen, timedelta(minutes=horizon), record_limit)
    until = now + timedelta(minutes=horizon)
    everything = fire_times(spec, cursor - US, 100_000, until)
    # Every instant is enqueued, listed missed, or counted; none twice.
    assert decision.missed_unlisted is not None
    assert len(decision.enqueue) + len(decision.missed) + decision.missed_unlisted == len(everything)
    assert set(decision.enqueue).isdisjoint(decision.missed)
    assert set(decision.enqueue) | set(decision.missed) <= set(everything)
    assert decision.enqueue == sorted(decision.enqueue) and decision.missed == sorted(decision.missed)
    assert len(decision.missed) <= record_limit
    late = [t for t in everything if now - t > chosen.max_lateness]
    on_time = [t for t in everything if now - t <= chosen.max_lateness]
    assert set(on_time) <= set(decision.enqueue)  # on time is always enqueued
    late_enqueued = [t for t in decision.enqueue if t in late]
    if chosen.kind == "skip":
        assert late_enqueued == []
    elif chosen.kind == "catch_up":
        assert late_enqueued == late[-chosen.catch_up_limit :] if late else late_enqueued == []
    elif any(t <= now for t in on_time) or not late:
        assert late_enqueued == []
    else:
        assert late_enqueued == late[-1:]
    assert decision.missed == [t for t in late if t not in late_enqueued][:record_limit]
    following = fire_times(spec, max(until, cursor - US), 1)
    assert decision.next_run_at == (following[0] if following else None)

"""The catch-up token bucket: fixed cases and properties over random request sequences."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.rules.token_bucket import TokenBucket, full_bucket, ready_at, refill, reserve, take

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
US = timedelta(microseconds=1)


def test_a_full_bucket_grants_its_burst_then_the_rate() -> None:
    bucket = full_bucket(60, T0)  # 60 per minute: one per second, a burst of 60
    granted, bucket = take(bucket, T0, 100)
    assert granted == 60
    granted, bucket = take(bucket, T0, 1)
    assert granted == 0  # empty until time passes
    granted, bucket = take(bucket, T0 + timedelta(milliseconds=999), 1)
    assert granted == 0
    granted, bucket = take(bucket, T0 + timedelta(seconds=1), 5)
    assert granted == 1
    granted, bucket = take(bucket, T0 + timedelta(minutes=10), 1000)
    assert granted == 60  # capped at capacity, however long the bucket was idle


def test_fractions_are_kept_not_rounded_away() -> None:
    bucket = TokenBucket(1, 1, Fraction(0), T0)  # one per minute
    granted = 0
    for second in range(1, 121):  # asks every second for two minutes
        got, bucket = take(bucket, T0 + timedelta(seconds=second), 1)
        granted += got
    assert granted == 2


def test_a_clock_stepping_back_mints_nothing() -> None:
    bucket = TokenBucket(60, 60, Fraction(0), T0)
    later = refill(bucket, T0 + timedelta(seconds=10))
    assert later.tokens == 10
    assert refill(later, T0) is later  # updated_at never moves back
    granted, after = take(later, T0 - timedelta(hours=1), 100)
    assert granted == 10 and after.updated_at == T0 + timedelta(seconds=10)


def test_rate_zero_never_grants_and_never_becomes_ready() -> None:
    bucket = full_bucket(0, T0)
    assert take(bucket, T0 + timedelta(days=1), 1)[0] == 0
    assert ready_at(bucket, 1) is None
    assert ready_at(bucket, 0) == T0


def test_ready_at_is_exact() -> None:
    bucket = TokenBucket(7, 10, Fraction(1, 3), T0)
    instant = ready_at(bucket, 3)
    assert instant is not None
    assert take(bucket, instant, 3)[0] == 3
    assert take(bucket, instant - US, 3)[0] < 3
    assert ready_at(bucket, 11) is None  # beyond capacity: never in full


@pytest.mark.parametrize(
    "bad",
    [
        dict(rate_per_minute=-1, capacity=1, tokens=Fraction(0), updated_at=T0),
        dict(rate_per_minute=1, capacity=1, tokens=Fraction(2), updated_at=T0),
        dict(rate_per_minute=1, capacity=1, tokens=Fraction(0), updated_at=T0.replace(tzinfo=None)),
    ],
)
def test_invalid_buckets_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        TokenBucket(**bad)


def test_negative_requests_are_refused() -> None:
    with pytest.raises(ValueError):
        take(full_bucket(5, T0), T0, -1)
    with pytest.raises(ValueError):
        ready_at(full_bucket(5, T0), -1)


steps = st.lists(st.tuples(st.integers(0, 90_000_000), st.integers(0, 2_000)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None, database=None)
@given(rate=st.integers(0, 5_000), capacity=st.integers(0, 5_000), start=st.integers(0, 5_000), requests=steps)
def test_never_more_than_asked_nor_than_the_rate_allows(
    rate: int, capacity: int, start: int, requests: list[tuple[int, int]]
) -> None:
    bucket = TokenBucket(rate, capacity, Fraction(min(start, capacity)), T0)
    now, total = T0, 0
    for gap_us, n in requests:
        now += timedelta(microseconds=gap_us)
        granted, bucket = take(bucket, now, n)
        assert 0 <= granted <= n
        assert 0 <= bucket.tokens <= capacity
        total += granted
    elapsed_us = (now - T0) // US
    assert total <= min(start, capacity) + Fraction(rate * elapsed_us, 60_000_000)


@settings(max_examples=300, deadline=None, database=None)
@given(
    rate=st.integers(1, 5_000),
    capacity=st.integers(1, 5_000),
    gaps=st.lists(st.integers(0, 5_000_000), min_size=1, max_size=40),
)
def test_a_bucket_drained_constantly_grants_exactly_what_accrued(rate: int, capacity: int, gaps: list[int]) -> None:
    # Requests always larger than anything available: nothing is capped while the bucket is drained
    # faster than it fills, so the grants add up to the exact accrual (no rounding loss).
    bucket = TokenBucket(rate, capacity, Fraction(0), T0)
    now, total, accrued = T0, 0, Fraction(0)
    for gap in gaps:
        now += timedelta(microseconds=gap)
        added = min(Fraction(capacity) - bucket.tokens, Fraction(rate * gap, 60_000_000))
        accrued += added
        granted, bucket = take(bucket, now, 10**9)
        total += granted
    assert total == math.floor(accrued)  # the exact accrual, less only the fraction still held
    assert bucket.tokens == accrued - total


@settings(max_examples=300, deadline=None, database=None)
@given(
    rate=st.integers(0, 1_000),
    capacity=st.integers(0, 1_000),
    tokens=st.integers(0, 1_000),
    gap=st.integers(0, 10**8),
    first=st.integers(0, 1_500),
    second=st.integers(0, 1_500),
)
def test_two_takes_at_one_instant_grant_what_one_take_would(
    rate: int, capacity: int, tokens: int, gap: int, first: int, second: int
) -> None:
    bucket = TokenBucket(rate, capacity, Fraction(min(tokens, capacity)), T0)
    now = T0 + timedelta(microseconds=gap)
    g1, after_first = take(bucket, now, first)
    g2, after_second = take(after_first, now, second)
    together, after_together = take(bucket, now, first + second)
    assert g1 + g2 == together
    assert after_second.tokens == after_together.tokens


@settings(max_examples=300, deadline=None, database=None)
@given(
    rate=st.integers(1, 5_000), capacity=st.integers(1, 5_000), tokens=st.integers(0, 5_000), n=st.integers(0, 5_000)
)
def test_ready_at_names_the_first_instant_a_take_is_granted_in_full(
    rate: int, capacity: int, tokens: int, n: int
) -> None:
    bucket = TokenBucket(rate, capacity, Fraction(min(tokens, capacity)), T0)
    instant = ready_at(bucket, n)
    if n > capacity:
        assert instant is None
        return
    assert instant is not None
    assert take(bucket, instant, n)[0] == n
    if instant > T0:
        assert take(bucket, instant - US, n)[0] < n


def test_a_reservation_releases_the_burst_now_and_the_rest_at_the_rate() -> None:
    releases, bucket = reserve(full_bucket(60, T0), T0, 63)  # one per second, a burst of 60
    assert releases[:60] == [T0] * 60
    assert releases[60:] == [T0 + timedelta(seconds=s) for s in (1, 2, 3)]
    assert (bucket.tokens, bucket.updated_at) == (Fraction(0), T0 + timedelta(seconds=3))
    # the bucket owes until its last release: a take before then gets nothing, a later reservation queues
    assert take(bucket, T0 + timedelta(seconds=2), 1)[0] == 0
    later, _ = reserve(bucket, T0 + timedelta(seconds=1), 2)
    assert later == [T0 + timedelta(seconds=4), T0 + timedelta(seconds=5)]


def test_a_reservation_on_a_bucket_that_never_refills_is_refused() -> None:
    assert reserve(TokenBucket(0, 5, Fraction(2), T0), T0, 2)[0] == [T0, T0]
    with pytest.raises(ValueError, match="rate 0"):
        reserve(TokenBucket(0, 5, Fraction(2), T0), T0, 3)


@settings(max_examples=300, deadline=None, database=None)
@given(
    rate=st.integers(1, 5_000),
    capacity=st.integers(0, 5_000),
    start=st.integers(0, 5_000),
    requests=st.lists(st.tuples(st.integers(0, 120_000_000), st.integers(0, 300)), max_size=12),
)
def test_reservations_never_release_faster_than_the_rate_allows(
    rate: int, capacity: int, start: int, requests: list[tuple[int, int]]
) -> None:
    bucket = TokenBucket(rate, capacity, Fraction(min(start, capacity)), T0)
    now, released = T0, list[datetime]()
    for gap_us, n in requests:
        now += gap_us * US
        times, bucket = reserve(bucket, now, n)
        assert len(times) == n and times == sorted(times) and all(t >= now for t in times)
        assert not released or not times or times[0] >= released[-1]
        released.extend(times)
        assert 0 <= bucket.tokens <= bucket.capacity
    for i, instant in enumerate(released):  # by each release, at most start + rate * elapsed were released
        elapsed_us = (instant - T0) // US
        assert i + 1 <= min(start, capacity) + math.floor(Fraction(elapsed_us * rate, 60_000_000))

"""Retry decisions: table cases for every rule and properties of the full-jitter backoff."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.rules.retry_policy import (
    RetryDecision,
    RetryPolicy,
    backoff_ceiling,
    decide_retry,
    spend_budget,
)

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=5, base=timedelta(seconds=2), cap=timedelta(seconds=30))


def fixed(value: float):
    return lambda: value


@pytest.mark.parametrize("attempt, ceiling", [(1, 2), (2, 4), (3, 8), (4, 16), (5, 30), (50, 30), (10_000, 30)])
def test_the_ceiling_doubles_up_to_the_cap(attempt, ceiling):
    assert backoff_ceiling(POLICY, attempt) == timedelta(seconds=ceiling)


@pytest.mark.parametrize(
    "attempt, permanent, deadline, rnd, expected",
    [
        (1, False, None, 0.5, RetryDecision(True, timedelta(seconds=1))),
        (3, False, None, 0.25, RetryDecision(True, timedelta(seconds=2))),
        (1, False, None, 0.0, RetryDecision(True, timedelta(0))),  # full jitter reaches zero
        (1, True, None, 0.5, RetryDecision.dead("permanent_error")),  # permanent wins over everything
        (5, False, None, 0.5, RetryDecision.dead("max_attempts")),  # 5 of 5 used
        (6, False, None, 0.5, RetryDecision.dead("max_attempts")),
        (4, False, NOW + timedelta(seconds=7), 0.5, RetryDecision.dead("deadline")),  # 8 s > 7 s left
        (4, False, NOW + timedelta(seconds=8), 0.5, RetryDecision(True, timedelta(seconds=8))),  # exactly at it
        (1, False, NOW - timedelta(seconds=1), 0.0, RetryDecision.dead("deadline")),
    ],
)
def test_decisions(attempt, permanent, deadline, rnd, expected):
    assert decide_retry(POLICY, attempt, permanent, NOW, deadline, fixed(rnd)) == expected


def test_a_single_attempt_policy_never_retries():
    assert decide_retry(RetryPolicy(1), 1, False, NOW, None, fixed(0.1)) == RetryDecision.dead("max_attempts")


def test_the_tenant_budget_turns_a_retry_into_a_dead_letter():
    retry = RetryDecision(True, timedelta(seconds=3))
    assert spend_budget(retry, granted=True) == retry
    assert spend_budget(retry, granted=False) == RetryDecision.dead("retry_budget")
    dead = RetryDecision.dead("max_attempts")
    assert spend_budget(dead, granted=False) == dead  # a dead letter keeps its own reason


@given(
    attempt=st.integers(1, 200),
    rnd=st.floats(0, 1, exclude_max=True),
    base=st.floats(0.001, 100),
    extra=st.floats(0, 10_000),
    max_attempts=st.integers(1, 100),
)
def test_delays_are_within_zero_and_the_capped_exponential(attempt, rnd, base, extra, max_attempts):
    policy = RetryPolicy(max_attempts, timedelta(seconds=base), timedelta(seconds=base + extra))
    decision = decide_retry(policy, attempt, False, NOW, None, fixed(rnd))
    if attempt >= max_attempts:
        assert decision == RetryDecision.dead("max_attempts")
        return
    assert decision.retry
    assert timedelta(0) <= decision.delay <= backoff_ceiling(policy, attempt) <= policy.cap


@given(attempt=st.integers(1, 20), rnd=st.floats(0, 1, exclude_max=True), left=st.floats(0, 100))
def test_a_retry_never_starts_after_the_deadline(attempt, rnd, left):
    deadline = NOW + timedelta(seconds=left)
    decision = decide_retry(RetryPolicy(100), attempt, False, NOW, deadline, fixed(rnd))
    if decision.retry:
        assert NOW + decision.delay <= deadline
    else:
        assert decision.dead_reason == "deadline"


def test_policy_validation():
    with pytest.raises(ValueError):
        RetryPolicy(0)
    with pytest.raises(ValueError):
        RetryPolicy(3, timedelta(seconds=10), timedelta(seconds=5))

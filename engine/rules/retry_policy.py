"""Retry decisions, as values: ``decide_retry(...) -> RetryDecision``.

Pure: no I/O and no clock of its own (``now`` and the random source are
arguments). The attempt processor and the reaper ask it what to do after a
failed or timed-out attempt, then spend the tenant's retry budget (the one
decision that needs the database) with :func:`spend_budget`.

Order of the rules:

1. a permanent error → DEAD (``permanent_error``);
2. the attempts counted since the last replay reached ``max_attempts`` →
   DEAD (``max_attempts``);
3. the retry would start after the occurrence's deadline → DEAD
   (``deadline``);
4. otherwise retry after ``delay``: exponential backoff with **full jitter**,
   ``uniform(0, min(cap, base × 2^(n−1)))`` for the n-th counted attempt
   (AWS Architecture Blog, "Exponential Backoff and Jitter");
5. then, if the tenant's retry budget for this hour is spent → DEAD
   (``retry_budget``): a budget that is exhausted fails fast instead of
   piling retries up (replay them from the dead-letter list later).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

#: 2^62 × any positive base already exceeds every cap a schedule may have.
_MAX_EXPONENT = 62


@dataclass(frozen=True)
class RetryPolicy:
    """A schedule's retry policy (schedules.retry_max_attempts, retry_base_s, retry_cap_s)."""

    max_attempts: int = 3
    base: timedelta = timedelta(seconds=1)
    cap: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base <= timedelta(0) or self.cap < self.base:
            raise ValueError("retry base must be positive and cap at least base")


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay: timedelta = timedelta(0)
    dead_reason: str | None = None  # permanent_error | max_attempts | deadline | retry_budget

    @classmethod
    def dead(cls, reason: str) -> RetryDecision:
        return cls(False, timedelta(0), reason)


def backoff_ceiling(policy: RetryPolicy, attempt: int) -> timedelta:
    """The largest delay after the ``attempt``-th counted attempt: min(cap, base × 2^(attempt−1))."""
    exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
    seconds = min(policy.cap.total_seconds(), policy.base.total_seconds() * (2.0**exponent))
    return timedelta(seconds=seconds)


def decide_retry(
    policy: RetryPolicy,
    attempt: int,
    permanent: bool,
    now: datetime,
    deadline: datetime | None,
    random: Callable[[], float],
) -> RetryDecision:
    """What to do after the ``attempt``-th counted attempt failed (or timed out) at ``now``.

    ``attempt`` counts attempts since the last replay (1 for the first).
    ``random`` returns a float in [0, 1) (``random.Random().random``).
    """
    if permanent:
        return RetryDecision.dead("permanent_error")
    if attempt >= policy.max_attempts:
        return RetryDecision.dead("max_attempts")
    delay = backoff_ceiling(policy, attempt) * random()
    if deadline is not None and now + delay > deadline:
        return RetryDecision.dead("deadline")
    return RetryDecision(True, delay)


def spend_budget(decision: RetryDecision, granted: bool) -> RetryDecision:
    """Apply the tenant's retry budget: a retry that was not granted becomes DEAD (retry_budget)."""
    if decision.retry and not granted:
        return RetryDecision.dead("retry_budget")
    return decision

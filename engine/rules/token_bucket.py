"""A token bucket as a value: how fast a tenant's misfire catch-up may enqueue.

The tenant quota ``catch_up_per_minute`` is a rate with a burst of one
minute's worth: the bucket holds at most ``capacity`` tokens (by default the
rate itself), refills continuously at ``rate_per_minute``, and each catch-up
occurrence enqueued takes one token. Pure: every function takes the instant as
an argument and returns a new bucket; the caller stores it (one row per
tenant in ``tenant_catch_up_buckets``, read ``FOR UPDATE`` and written back in
the transaction that enqueues, so engine nodes share one budget).

Guarantees (property-tested in tests/unit/test_token_bucket.py):

* never more than asked: ``0 <= granted <= n``;
* never more than the rate allows: over any sequence of takes from ``t0`` to
  ``t1``, the total granted is at most ``capacity + rate * (t1 - t0)``;
* nothing is lost to rounding: tokens are exact fractions, so a bucket drained
  in many small takes grants exactly what one large take would;
* a clock that steps backwards mints nothing (``updated_at`` never moves back);
* never starves: :func:`ready_at` names the instant from which a take of
  ``n <= capacity`` is granted in full;
* :func:`reserve` hands out release instants instead of refusing: the bucket
  it returns owes the tokens it promised (its ``updated_at`` is the last
  release, possibly in the future, so nothing more is granted before then),
  and the releases obey the same rate bound as takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction

__all__ = ["TokenBucket", "full_bucket", "refill", "take", "ready_at", "reserve"]

_US_PER_MINUTE = 60_000_000


@dataclass(frozen=True)
class TokenBucket:
    """rate_per_minute: tokens added per minute (0: nothing is ever granted).
    capacity: the most tokens the bucket holds (the burst).
    tokens: tokens available at ``updated_at`` (exact, 0 <= tokens <= capacity).
    updated_at: the instant ``tokens`` was computed for (aware).
    """

    rate_per_minute: int
    capacity: int
    tokens: Fraction
    updated_at: datetime

    def __post_init__(self) -> None:
        if self.rate_per_minute < 0:
            raise ValueError(f"rate_per_minute must not be negative, got {self.rate_per_minute}")
        if self.capacity < 0:
            raise ValueError(f"capacity must not be negative, got {self.capacity}")
        if not 0 <= self.tokens <= self.capacity:
            raise ValueError(f"tokens must lie in [0, capacity={self.capacity}], got {self.tokens}")
        if self.updated_at.tzinfo is None:
            raise ValueError("updated_at must be an aware datetime")


def full_bucket(rate_per_minute: int, now: datetime, capacity: int | None = None) -> TokenBucket:
    """A bucket that has been idle long enough to be full (a tenant that has not caught up lately)."""
    size = rate_per_minute if capacity is None else capacity
    return TokenBucket(rate_per_minute, size, Fraction(size), now)


def refill(bucket: TokenBucket, now: datetime) -> TokenBucket:
    """The bucket at ``now``: tokens added for the time elapsed since ``updated_at``, capped at capacity."""
    if now <= bucket.updated_at:
        return bucket
    elapsed_us = (now - bucket.updated_at) // timedelta(microseconds=1)
    tokens = min(
        Fraction(bucket.capacity), bucket.tokens + Fraction(elapsed_us * bucket.rate_per_minute, _US_PER_MINUTE)
    )
    return TokenBucket(bucket.rate_per_minute, bucket.capacity, tokens, now)


def take(bucket: TokenBucket, now: datetime, n: int) -> tuple[int, TokenBucket]:
    """Take up to ``n`` whole tokens at ``now``; return how many were granted and the new bucket."""
    if n < 0:
        raise ValueError(f"n must not be negative, got {n}")
    current = refill(bucket, now)
    granted = min(n, math.floor(current.tokens))
    if granted == 0:
        return 0, current
    return granted, TokenBucket(current.rate_per_minute, current.capacity, current.tokens - granted, current.updated_at)


def ready_at(bucket: TokenBucket, n: int) -> datetime | None:
    """The earliest instant at which ``take(bucket, instant, n)`` grants all ``n``.

    None when it never will: ``n`` exceeds the capacity, or the rate is 0 and
    the tokens are not there already.
    """
    if n < 0:
        raise ValueError(f"n must not be negative, got {n}")
    if bucket.tokens >= n:
        return bucket.updated_at
    if n > bucket.capacity or bucket.rate_per_minute == 0:
        return None
    missing_us = (n - bucket.tokens) * _US_PER_MINUTE / bucket.rate_per_minute
    return bucket.updated_at + timedelta(microseconds=math.ceil(missing_us))


def reserve(bucket: TokenBucket, now: datetime, n: int) -> tuple[list[datetime], TokenBucket]:
    """Release instants for ``n`` single-token takes, in order, and the bucket after all of them.

    As many as the bucket holds are released at ``now`` (or at ``updated_at``
    when an earlier reservation owes tokens until then); each further one at
    the instant its token has refilled (rounded up to the microsecond, never
    early). The bucket returned holds what is left at the last release, so a
    later take or reservation queues behind these: over any window from
    ``t0``, the releases up to ``t1`` never exceed ``capacity + rate * (t1 - t0)``.
    Raises ValueError when a token is needed and the rate is 0 (they would never be released).
    """
    if n < 0:
        raise ValueError(f"n must not be negative, got {n}")
    current = refill(bucket, now)
    base, tokens = current.updated_at, current.tokens
    whole = min(n, math.floor(tokens))
    releases = [base] * whole
    if whole == n:
        return releases, TokenBucket(current.rate_per_minute, current.capacity, tokens - n, base)
    if current.rate_per_minute == 0:
        raise ValueError("a bucket with rate 0 never refills: the tokens cannot be reserved")
    for j in range(whole + 1, n + 1):
        wait_us = (j - tokens) * _US_PER_MINUTE / current.rate_per_minute
        releases.append(base + timedelta(microseconds=math.ceil(wait_us)))
    last = releases[-1]
    elapsed_us = (last - base) // timedelta(microseconds=1)
    left = tokens + Fraction(elapsed_us * current.rate_per_minute, _US_PER_MINUTE) - n
    return releases, TokenBucket(current.rate_per_minute, current.capacity, min(left, Fraction(current.capacity)), last)

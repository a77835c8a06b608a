"""The relay's estimate of the database clock never goes back: each statement's instant lags the database
by that statement's latency, and a slow one observed after a fast one must not pull the estimate back
(a row released at its available_at would then be stamped as acknowledged before it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from relay.clock_estimate import ClockEstimate
from schemas.clock import ManualClock

T0 = datetime(2026, 12, 2, 12, tzinfo=UTC)


class NoClock(ManualClock):
    """An injected clock that gives no instant: the estimate runs on the database's."""

    def now(self):
        return None


def test_a_slow_statements_instant_does_not_move_the_estimate_back():
    estimate = ClockEstimate(NoClock(T0))
    estimate.observe(T0)
    first = estimate.now()
    assert first is not None and first >= T0
    estimate.observe(T0 - timedelta(milliseconds=140))  # a seal that took 140 ms longer to answer
    assert estimate.now() >= first  # type: ignore[operator]


@given(st.lists(st.integers(-500, 500), min_size=1, max_size=30))
def test_the_estimate_is_monotone_and_never_behind_the_latest_instant_observed(offsets_ms):
    estimate = ClockEstimate(NoClock(T0))
    seen: datetime | None = None
    for ms in offsets_ms:
        instant = T0 + timedelta(milliseconds=ms)
        estimate.observe(instant)
        now = estimate.now()
        assert now is not None and now >= instant
        assert seen is None or now >= seen
        seen = now

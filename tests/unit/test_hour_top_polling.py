"""hour_top's materialization watch (load_tests.hour_top.next_poll): fewer counts far from the end, the end
still seen within 0.25 s at a steady rate."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from load_tests.hour_top import next_poll


def test_before_a_rate_is_known_it_polls_every_quarter_second() -> None:
    assert next_poll(0, 500_000, 0.0) == 0.25
    assert next_poll(10, 500_000, 0.0) == 0.25


@given(st.integers(1, 10_000_000), st.integers(1, 10_000_000), st.floats(0.001, 10_000))
def test_the_wait_stays_between_a_quarter_second_and_two(count: int, expected: int, elapsed: float) -> None:
    assert 0.25 <= next_poll(count, expected, elapsed) <= 2.0


@given(st.integers(1_000, 2_000_000), st.floats(500, 200_000), st.floats(0.0, 5.0))
def test_at_a_steady_rate_the_end_is_seen_within_a_quarter_second(expected: int, rate: float, start: float) -> None:
    """Rows appear at ``rate`` per second from ``start``; the watch polls as next_poll says: the first poll
    that sees them all comes at most 0.25 s after the last one was written, in fewer polls than every 0.25 s."""
    end = start + expected / rate
    now, polls, first_seen = 0.0, 0, None
    while True:
        polls += 1
        count = min(expected, max(0, int((now - start) * rate)))
        first_seen = first_seen if first_seen is not None else (now if count else None)
        if count >= expected:
            break
        now += next_poll(count, expected, now - first_seen if first_seen is not None else 0.0)
    assert now - end <= 0.25 + 1 / rate
    assert polls <= (end / 0.25) + 2

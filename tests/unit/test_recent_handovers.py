"""RecentHandovers counts the rows handed over within a window, against a brute-force count."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from relay.recent_handovers import RecentHandovers


@given(
    st.lists(st.tuples(st.floats(0, 5), st.integers(0, 5000)), max_size=60),
    st.floats(0, 12),
    st.floats(0, 5),
)
def test_the_count_within_a_window_matches_a_brute_force_count(steps, window, later):
    recent, now, events = RecentHandovers(keep=10.0), 0.0, []
    for gap, rows in steps:
        now += gap
        recent.add(rows, now)
        events.append((now, rows))
    now += later
    expected = sum(rows for at, rows in events if at > now - min(window, 10.0))
    assert recent.since(window, now) == expected


def test_a_burst_is_seen_from_its_first_hand_over_and_forgotten_after_the_window():
    recent = RecentHandovers(keep=10.0)
    assert recent.since(1.0, 100.0) == 0
    for i in range(10):
        recent.add(2000, 100.0 + i * 0.05)
    assert recent.since(1.0, 100.5) == 20_000
    assert recent.since(1.0, 101.6) == 0
    assert recent.since(10.0, 111.0) == 0  # past keep: gone

"""engine.rules.consumers_behind: late events within a sliding window, and when to announce them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.rules.consumers_behind import ConsumersBehind

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)

# (seconds after T0 the events were applied, how late each one's attempt started)
rounds = st.lists(
    st.tuples(st.floats(0, 30, allow_nan=False), st.lists(st.floats(0, 20, allow_nan=False), max_size=5)),
    max_size=30,
)


@given(rounds, st.integers(0, 8), st.floats(0, 40, allow_nan=False))
def test_behind_exactly_when_the_window_holds_enough_late_events(recorded, events, probe_s):
    rule = ConsumersBehind(after=5.0, events=events, window=2.0)
    for at_s, lateness in sorted(recorded):
        rule.record(T0 + timedelta(seconds=at_s), lateness)
    now = T0 + timedelta(seconds=max([probe_s] + [at for at, _ in recorded]))
    in_window = sum(
        sum(1 for late in lateness if late >= 5.0)
        for at_s, lateness in recorded
        if now - timedelta(seconds=2.0) < T0 + timedelta(seconds=at_s) <= now
    )
    assert rule.behind(now) is (events > 0 and in_window >= events)


def test_events_on_time_never_count_however_many():
    rule = ConsumersBehind(after=5.0, events=10, window=2.0)
    assert rule.record(T0, [4.9] * 10_000) == 0
    assert not rule.behind(T0)
    assert rule.record(T0, [5.0] * 10) == 10
    assert rule.behind(T0)


def test_an_announcement_is_due_at_most_once_per_half_window_while_behind():
    rule = ConsumersBehind(after=5.0, events=1, window=2.0)
    assert not rule.announcement_due(T0), "nothing recorded"
    rule.record(T0, [30.0])
    assert rule.announcement_due(T0)
    rule.announced(T0)
    assert not rule.announcement_due(T0 + timedelta(seconds=0.5))
    rule.record(T0 + timedelta(seconds=1), [30.0])
    assert rule.announcement_due(T0 + timedelta(seconds=1)), "half a window since the last one"
    rule.announced(T0 + timedelta(seconds=1))
    assert not rule.announcement_due(T0 + timedelta(seconds=3.5)), "nothing late within the window: not behind"
    assert rule.lasts_s == 6.0


def test_a_clock_that_steps_back_neither_drops_nor_keeps_too_much():
    rule = ConsumersBehind(after=5.0, events=2, window=2.0)
    rule.record(T0 + timedelta(seconds=10), [30.0])
    rule.record(T0, [30.0])  # the clock stepped back 10 s
    rule.record(T0 + timedelta(seconds=0.5), [30.0])
    assert rule.behind(T0 + timedelta(seconds=1)), "both events of the last window count"
    assert not rule.behind(T0 + timedelta(seconds=5)), "left the window, though recorded after a later entry"


@pytest.mark.parametrize(("after", "events", "window"), [(-1, 1, 1), (1, -1, 1), (1, 1, 0)])
def test_bad_settings_are_refused(after, events, window):
    with pytest.raises(ValueError, match="must be"):
        ConsumersBehind(after, events, window)

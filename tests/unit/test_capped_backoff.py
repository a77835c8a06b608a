"""The delays between in-place retries: doubling from the first, capped, never shorter than before."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from schemas.capped_backoff import capped_doubling

SECONDS = st.floats(min_value=0.001, max_value=1000, allow_nan=False, allow_infinity=False)


@given(first=SECONDS, cap=SECONDS)
def test_each_delay_is_the_previous_doubled_and_capped(first, cap):
    delays = list(itertools.islice(capped_doubling(first, cap), 40))
    assert delays[0] == first
    for previous, delay in itertools.pairwise(delays):
        assert delay == min(previous * 2, cap)
        assert delay <= max(first, cap)
    # 40 doublings pass any cap from 1 ms: the delays end at the cap.
    assert delays[-1] == cap


@given(first=SECONDS, cap=SECONDS)
def test_below_the_cap_the_delays_never_shrink(first, cap):
    delays = list(itertools.islice(capped_doubling(first, cap), 20))
    if first <= cap:
        assert delays == sorted(delays)


def test_the_consumer_default_backs_off_from_a_fifth_of_a_second_to_ten():
    assert list(itertools.islice(capped_doubling(0.2, 10.0), 8)) == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]

"""Weighted round-robin rounds: each round holds at most `weight` rows of a tenant; small tenants finish early."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.rules.fair_rounds import RoundCounter, assign_rounds

tenants = st.sampled_from(["big", "t1", "t2", "t3", "t4"])
rows_strategy = st.lists(st.tuples(st.integers(0, 2), tenants), max_size=300)
weights_strategy = st.fixed_dictionaries({t: st.integers(1, 4) for t in ["big", "t1", "t2", "t3", "t4"]})


@given(rows_strategy, weights_strategy)
def test_each_round_holds_at_most_weight_rows_of_a_tenant_and_rounds_do_not_skip(rows, weights):
    rounds = assign_rounds(rows, weights)
    per = Counter((key, tenant, r) for (key, tenant), r in zip(rows, rounds, strict=True))
    for (key, tenant, r), n in per.items():
        assert n <= weights[tenant]
        if r > 0:
            assert per[(key, tenant, r - 1)] == weights[tenant]  # earlier rounds are full


@given(rows_strategy, weights_strategy)
def test_a_tenant_with_k_rows_is_done_by_round_ceil_k_over_w_whatever_the_others_have(rows, weights):
    rounds = assign_rounds(rows, weights)
    count: dict[tuple[int, str], int] = Counter(rows)
    last: dict[tuple[int, str], int] = defaultdict(int)
    for row, r in zip(rows, rounds, strict=True):
        last[row] = max(last[row], r)
    for (key, tenant), k in count.items():
        assert last[(key, tenant)] == -(-k // weights[tenant]) - 1


@given(rows_strategy, weights_strategy)
def test_every_prefix_of_the_dispatch_order_that_ends_a_round_is_weighted_fair(rows, weights):
    """Sorted by (bucket, round), after round r of a bucket each tenant has had min(total, (r+1)*w) rows."""
    rounds = assign_rounds(rows, weights)
    totals = Counter(rows)
    for key in {k for k, _ in rows}:
        top = max((r for (k, _t), r in zip(rows, rounds, strict=True) if k == key), default=-1)
        for r in range(top + 1):
            served = Counter(t for (k, t), rr in zip(rows, rounds, strict=True) if k == key and rr <= r)
            for tenant in {t for k, t in rows if k == key}:
                assert served[tenant] == min(totals[(key, tenant)], (r + 1) * weights[tenant])


def test_the_counter_continues_across_calls_and_forgets_the_oldest_keys():
    counter = RoundCounter(capacity=2)
    assert assign_rounds([(0, "a"), (0, "a")], {}, counter) == [0, 1]
    assert assign_rounds([(0, "a")], {}, counter) == [2]
    assign_rounds([(1, "a"), (2, "a")], {}, counter)  # (0, "a") is now the oldest and forgotten
    assert assign_rounds([(0, "a")], {}, counter) == [0]


@pytest.mark.parametrize("bad", [0, -1])
def test_weight_must_be_positive(bad):
    with pytest.raises(ValueError):
        RoundCounter().take(0, "a", bad)

"""Overlap decisions for one schedule's due deliveries (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.rules.overlap_policy import OverlapDecision, decide_overlap


@pytest.mark.parametrize(
    "policy, in_flight, due, expected",
    [
        ("allow", True, [1, 2], OverlapDecision(dispatch=(1, 2))),
        ("skip_if_running", False, [], OverlapDecision()),
        ("skip_if_running", False, [1], OverlapDecision(dispatch=(1,))),
        ("skip_if_running", True, [1], OverlapDecision(skip=(1,))),
        ("skip_if_running", False, [1, 2, 3], OverlapDecision(dispatch=(1,), skip=(2, 3))),  # catch-up burst
        ("queue_one", True, [1], OverlapDecision(hold=(1,))),  # waits its turn
        ("queue_one", True, [1, 2, 3], OverlapDecision(hold=(1,), skip=(2, 3))),  # the waiting one keeps its place
        ("queue_one", False, [1, 2, 3], OverlapDecision(dispatch=(1,), hold=(2,), skip=(3,))),
    ],
)
def test_decisions(policy, in_flight, due, expected):
    assert decide_overlap(policy, in_flight, due) == expected


def test_unknown_policy():
    with pytest.raises(ValueError):
        decide_overlap("replace", False, [1])


@given(
    policy=st.sampled_from(["skip_if_running", "queue_one"]),
    in_flight=st.booleans(),
    due=st.lists(st.integers(), unique=True, max_size=10),
)
def test_restricted_policies_never_run_two_at_once(policy, in_flight, due):
    decision = decide_overlap(policy, in_flight, due)
    # Every due delivery is decided exactly once, in its original order within each group.
    assert sorted(decision.dispatch + decision.hold + decision.skip) == sorted(due)
    assert len(decision.dispatch) <= (0 if in_flight else 1)
    assert len(decision.hold) <= (1 if policy == "queue_one" else 0)
    if decision.dispatch:
        assert decision.dispatch[0] == due[0]  # the oldest goes first

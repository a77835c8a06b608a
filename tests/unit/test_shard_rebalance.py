"""The rebalance planner: shares add up, plans touch only what they may, nodes converge without a coordinator."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.rules.shard_rebalance import Lease, plan_rebalance, targets
from schemas.shard_placement import home_range

node_names = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=6, unique=True)


@given(node_names, st.integers(1, 600))
def test_targets_sum_to_the_shard_count_and_differ_by_at_most_one(nodes, shards):
    share = targets(nodes, shards)
    assert sum(share.values()) == shards
    assert max(share.values()) - min(share.values()) <= 1
    assert set(share) == set(nodes)


@st.composite
def pictures(draw):
    live = draw(node_names)
    dead = draw(st.lists(st.text("xyz", min_size=1, max_size=2), max_size=3, unique=True))
    shards = draw(st.integers(1, 80))
    owners = [None, *live, *dead]
    leases = {s: Lease(draw(st.sampled_from(owners)), draw(st.booleans())) for s in range(shards)}
    for s, lease in leases.items():  # a dead node's leases have expired by the time it is not live
        if lease.owner in dead:
            leases[s] = Lease(lease.owner, True)
    return live, dead, shards, leases


@given(pictures(), st.integers(1, 100), st.data())
def test_a_plan_acquires_only_free_shards_and_releases_only_its_own(picture, max_moves, data):
    live, _dead, shards, leases = picture
    me = data.draw(st.sampled_from(live))
    plan = plan_rebalance(me, live, leases, shards, max_moves)
    mine = {s for s, lease in leases.items() if lease.owner == me and not lease.expired}
    assert all(leases[s].free for s in plan.acquire)
    assert set(plan.release) <= mine
    assert not (plan.acquire and plan.release)
    assert len(plan.acquire) <= max_moves and len(plan.release) <= max_moves
    assert len(mine) + len(plan.acquire) - len(plan.release) >= min(len(mine), plan.target)
    if plan.acquire:
        assert len(mine) + len(plan.acquire) <= plan.target
    if plan.release:
        assert len(mine) - len(plan.release) >= plan.target


def test_a_node_that_is_not_live_releases_everything():
    leases = {0: Lease("a", False), 1: Lease("b", False), 2: Lease("a", False)}
    plan = plan_rebalance("a", ["b"], leases, 3)
    assert set(plan.release) == {0, 2} and plan.acquire == () and plan.target == 0


def _round(live, leases, shards, max_moves, rng):
    """Every live node plans on the current picture and applies its plan, in a random order."""
    for node in rng.sample(sorted(live), len(live)):
        plan = plan_rebalance(node, live, leases, shards, max_moves)
        for s in plan.release:
            leases[s] = Lease(None, True)
        for s in plan.acquire:
            if leases[s].free:  # another node may have taken it first (SKIP LOCKED / epoch bump)
                leases[s] = Lease(node, False)


@settings(max_examples=200, deadline=None)  # a pure simulation; a loaded CI core is slow, not wrong
@given(pictures(), st.integers(0, 2**32))
def test_nodes_converge_to_their_targets_with_every_shard_owned(picture, seed):
    live, _dead, shards, leases = picture
    leases = {s: (Lease(x.owner, False) if x.owner in live else x) for s, x in leases.items()}
    rng = random.Random(seed)
    max_moves = rng.randint(1, 16)
    for _ in range(shards // max_moves + 3):
        _round(live, leases, shards, max_moves, rng)
    share = targets(live, shards)
    owned = {node: sum(1 for lease in leases.values() if lease.owner == node and not lease.expired) for node in live}
    assert owned == share
    assert all(not lease.free for lease in leases.values())


@settings(max_examples=200, deadline=None)
@given(pictures(), st.integers(0, 2**32))
def test_with_unbounded_moves_no_shard_stays_free_for_more_than_two_rounds(picture, seed):
    """A round is one lease-loop tick of every node (shorter than half a lease TTL)."""
    live, _dead, shards, leases = picture
    leases = {s: (Lease(x.owner, False) if x.owner in live else x) for s, x in leases.items()}
    rng = random.Random(seed)
    for _ in range(2):
        _round(live, leases, shards, shards, rng)
    assert all(not lease.free for lease in leases.values())


def test_a_node_joining_takes_shards_released_by_the_others():
    leases = {s: Lease("a" if s % 2 else "b", False) for s in range(8)}
    assert plan_rebalance("c", ["a", "b", "c"], leases, 8).acquire == ()
    plan_a = plan_rebalance("a", ["a", "b", "c"], leases, 8)
    assert plan_a.target == 3 and len(plan_a.release) == 1
    for s in plan_a.release:
        leases[s] = Lease(None, True)
    assert len(plan_rebalance("c", ["a", "b", "c"], leases, 8).acquire) == 1


@pytest.mark.parametrize("bad", [dict(shard_count=0), dict(max_moves=0)])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        plan_rebalance("a", ["a"], {}, **{"shard_count": 4, "max_moves": 1, **bad})


@settings(max_examples=200, deadline=None)
@given(node_names, st.integers(1, 300), st.integers(0, 2**32))
def test_nodes_starting_together_end_up_owning_exactly_their_home_ranges(live, shards, seed):
    """From no leases at all (a fresh cluster), whatever order the nodes plan in, each ends with its
    contiguous home range: the layout that makes each node produce to few partitions."""
    leases = {s: Lease(None, True) for s in range(shards)}
    rng = random.Random(seed)
    for _ in range(shards // 8 + 3):
        _round(live, leases, shards, 8, rng)
    ranks = sorted(live)
    for rank, node in enumerate(ranks):
        owned = {s for s, lease in leases.items() if lease.owner == node}
        assert owned == set(home_range(rank, len(ranks), shards))


def test_a_node_above_its_target_gives_up_shards_outside_its_home_range_first():
    # "a" holds everything; "b" joins: a's home is 0..3, so it releases 4..7, never one of its own range.
    leases = {s: Lease("a", False) for s in range(8)}
    plan = plan_rebalance("a", ["a", "b"], leases, 8)
    assert set(plan.release) == {4, 5, 6, 7}
    # "a" holds a scattered set above its target: the off-range ones go first, highest first.
    leases = {s: Lease("a" if s in (0, 1, 5, 6, 7) else "b", False) for s in range(8)}
    assert plan_rebalance("a", ["a", "b"], leases, 8, max_moves=1).release == (7,)


def test_a_node_below_its_target_takes_free_shards_of_its_home_range_first():
    leases = {s: Lease(None, True) for s in range(8)}
    assert plan_rebalance("b", ["a", "b"], leases, 8, max_moves=2).acquire == (4, 5)
    # Its home range taken by someone else: it takes other free shards rather than stay below target.
    leases = {s: Lease("a" if s >= 4 else None, s < 4) for s in range(8)}
    assert plan_rebalance("b", ["a", "b"], leases, 8, max_moves=2).acquire == (0, 1)

"""Shard placement: home ranges tile the shards, partitions take contiguous shard ranges, and a record's
shard is read back from its key exactly as the engine computed it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.rules.shard_rebalance import targets
from schemas.shard_placement import (
    SHARD_COUNT,
    home_range,
    partition_of_shard,
    placement,
    shard_of,
    shard_of_key,
)
from schemas.topics import occurrence_topic, placed_by_shard, schedule_key


@given(st.integers(1, 50), st.integers(1, 600))
def test_home_ranges_tile_the_shards_in_rank_order_and_match_the_planners_targets(nodes, shards):
    ranges = [home_range(rank, nodes, shards) for rank in range(nodes)]
    assert [s for r in ranges for s in r] == list(range(shards))  # contiguous, disjoint, in order, complete
    names = [f"node-{rank:03d}" for rank in range(nodes)]
    assert [len(r) for r in ranges] == [targets(names, shards)[name] for name in names]


@given(st.integers(1, 600), st.data())
def test_every_partition_takes_one_contiguous_range_of_shards(shards, data):
    partitions = data.draw(st.integers(1, shards))
    placed_on = [partition_of_shard(s, partitions, shards) for s in range(shards)]
    assert placed_on == sorted(placed_on)  # non-decreasing: each partition's shards are contiguous
    assert set(placed_on) == set(range(partitions))  # every partition gets some


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([8, 16, 32, 64]))
def test_a_node_owning_its_home_range_produces_to_its_share_of_the_partitions(nodes, partitions):
    covered = [{partition_of_shard(s, partitions) for s in home_range(rank, nodes)} for rank in range(nodes)]
    assert all(len(c) == partitions // nodes for c in covered)
    assert set().union(*covered) == set(range(partitions))


@given(st.uuids(), st.integers(1, 2 * SHARD_COUNT))
def test_the_shard_read_from_a_record_key_is_the_schedules_shard(schedule_id, partitions):
    assert shard_of_key(schedule_key(schedule_id)) == shard_of(schedule_id)
    # the per-count table the publishers place with gives partition_of_shard's answer for every count
    assert placement(schedule_key(schedule_id), partitions) == partition_of_shard(shard_of(schedule_id), partitions)


@given(st.one_of(st.none(), st.binary(max_size=64), st.text(max_size=40).map(str.encode)))
def test_any_key_gets_a_shard_in_range_or_none_and_never_an_error(key):
    shard = shard_of_key(key)
    assert shard is None or 0 <= shard < SHARD_COUNT
    if key is None or len(key) != 36 or key[8:9] != b"-":
        assert shard is None and placement(key, 8) is None  # hashed by the partitioner instead


@pytest.mark.parametrize("key", [b"acme", b"", b"zzzzzzzz-0000-0000-0000-000000000000", b"tenant-0"])
def test_keys_that_name_no_schedule_are_left_to_the_partitioner(key):
    assert placement(key, 8) is None


def test_only_occurrence_topics_are_placed_by_shard():
    assert placed_by_shard(occurrence_topic("billing.invoice"))
    assert not placed_by_shard("chronoq.schedule-states")
    assert not placed_by_shard("chronoq.attempts")


@pytest.mark.parametrize(
    "call",
    [
        lambda: home_range(2, 2),
        lambda: home_range(0, 0),
        lambda: partition_of_shard(0, 0),
        lambda: partition_of_shard(256, 8),
        lambda: placement(schedule_key("00000000-0000-0000-0000-000000000000"), 0),
    ],
)
def test_bad_arguments_are_refused(call):
    with pytest.raises(ValueError):
        call()

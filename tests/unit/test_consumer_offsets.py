"""Which offset a partition may commit when messages finish out of order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumers.offsets import PartitionOffsets


def test_nothing_fetched_nothing_to_commit():
    assert PartitionOffsets().committable() is None


def test_the_commit_stops_at_the_lowest_unfinished_message():
    offsets = PartitionOffsets()
    for offset in (10, 11, 12, 13):
        offsets.add(offset)
    assert offsets.committable() == 10
    offsets.finish(12)
    offsets.finish(13)
    assert offsets.committable() == 10  # 10 and 11 still run: never past them
    offsets.finish(10)
    assert offsets.committable() == 11
    offsets.finish(11)
    assert offsets.committable() == 14  # everything finished: one past the highest
    assert offsets.in_flight == 0


def test_finishing_twice_or_an_unknown_offset_changes_nothing():
    offsets = PartitionOffsets()
    offsets.add(5)
    offsets.finish(7)
    offsets.finish(5)
    offsets.finish(5)
    assert offsets.committable() == 6


@given(st.integers(0, 10_000), st.integers(1, 60), st.data())
def test_the_committable_offset_never_passes_an_unfinished_message(start, count, data):
    fetched = list(range(start, start + count))
    offsets = PartitionOffsets()
    for offset in fetched:
        offsets.add(offset)
    order = data.draw(st.permutations(fetched))
    done: set[int] = set()
    previous = offsets.committable()
    for offset in order[: data.draw(st.integers(0, count))]:
        offsets.finish(offset)
        done.add(offset)
        position = offsets.committable()
        assert position is not None and previous is not None
        assert all(o in done for o in range(start, position))  # everything below it finished
        assert position == start + count or position not in done  # and it points at unfinished work
        assert position >= previous  # it only moves forward
        previous = position

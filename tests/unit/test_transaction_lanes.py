"""The attempt processor's layout of a unit's events into transactions (engine.loops.attempt_processor).

Lanes run side by side, so the layout is what keeps each occurrence's events in order: a partition (every
event of an occurrence is on its key's partition) must sit whole in one lane, in order, and no transaction may
exceed its bound."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from engine.loops.attempt_authentication import ReceivedEvent
from engine.loops.attempt_processor import starts_first, transaction_lanes
from schemas.attempt_events import STARTED, AttemptEvent


def received(partitions: list[int]) -> list[ReceivedEvent]:
    """One event per entry, on that partition, in poll order (offsets count per partition)."""
    offsets: dict[int, int] = {}
    items = []
    for partition in partitions:
        event = AttemptEvent.heartbeat(uuid.uuid4(), 1, uuid.uuid4(), 30.0)
        offset = offsets[partition] = offsets.get(partition, -1) + 1
        items.append(ReceivedEvent(event, None, event.key, b"", partition, offset, True))
    return items


def poll(sizes: list[int]) -> list[ReceivedEvent]:
    """Partitions 0, 1, ... with that many events each, a partition's events together (as a poll hands them)."""
    return received([partition for partition, size in enumerate(sizes) for _ in range(size)])


@given(
    sizes=st.lists(st.integers(0, 40), max_size=10),
    merge=st.integers(0, 30),
    most=st.integers(1, 25),
)
def test_every_event_once_each_partition_whole_in_one_lane_in_order_within_both_bounds(
    sizes: list[int], merge: int, most: int
) -> None:
    events = poll(sizes)
    lanes = transaction_lanes(events, merge, most)

    laid_out = [item for lane in lanes for transaction in lane for item in transaction]
    assert sorted(map(id, laid_out)) == sorted(map(id, events))
    lane_of: dict[int | None, int] = {}
    for number, lane in enumerate(lanes):
        assert lane and all(lane), "no empty lane or transaction"
        order = [item for transaction in lane for item in transaction]
        for partition in {item.partition for item in order}:
            assert lane_of.setdefault(partition, number) == number, "a partition split across lanes"
            assert partition is not None
            mine = [item.offset or 0 for item in order if item.partition == partition]
            assert mine == sorted(mine) and len(mine) == sizes[partition]
        for transaction in lane:
            assert len(transaction) <= most
            if len({item.partition for item in transaction}) > 1:
                # Only light partitions share, and only up to the merge bound.
                assert len(transaction) <= min(merge, most)
        if len(lane) > 1:
            assert len({item.partition for item in order}) == 1, "a lane of several transactions is one partition's"


def test_heavy_partitions_get_lanes_of_their_own_and_light_ones_share_one() -> None:
    lanes = transaction_lanes(poll([500, 3, 700, 2, 1]), merge=256, most=300)
    shapes = [[sorted({item.partition or 0 for item in t}) for t in lane] for lane in lanes]
    assert shapes == [[[0], [0]], [[2], [2], [2]], [[1, 3, 4]]]
    assert [[len(t) for t in lane] for lane in lanes] == [[300, 200], [300, 300, 100], [6]]


def test_merge_zero_gives_every_partition_its_own_lane() -> None:
    lanes = transaction_lanes(poll([1, 1, 2]), merge=0, most=10)
    assert [[len(t) for t in lane] for lane in lanes] == [[1], [1], [2]]


def test_nothing_received_is_no_lane() -> None:
    assert transaction_lanes([], 256, 4000) == []


KINDS = ("started", "heartbeat", "succeeded")


def history(steps: list[tuple[int, str]]) -> list[ReceivedEvent]:
    """Events on partition 0, in order: (occurrence number, kind)."""
    ids = {n: uuid.UUID(int=n + 1) for n, _ in steps}
    items = []
    for offset, (n, kind) in enumerate(steps):
        token = uuid.UUID(int=1000 + n)
        event = {
            "started": lambda: AttemptEvent.started(ids[n], 1, token, 30.0, "g", "w"),  # noqa: B023 - called at once
            "heartbeat": lambda: AttemptEvent.heartbeat(ids[n], 1, token, 30.0),  # noqa: B023
            "succeeded": lambda: AttemptEvent.succeeded(ids[n], 1, token),  # noqa: B023
        }[kind]()
        items.append(ReceivedEvent(event, None, event.key, b"", 0, offset, True))
    return items


@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from(KINDS)), max_size=40))
def test_starts_first_keeps_every_occurrences_order_and_puts_first_starts_ahead(steps: list[tuple[int, str]]) -> None:
    events = history(steps)
    reordered = starts_first(events)

    assert sorted(item.offset or 0 for item in reordered) == list(range(len(events)))
    for occurrence in {item.event.occurrence_id for item in events}:
        offsets = [item.offset or 0 for item in reordered if item.event.occurrence_id == occurrence]
        assert offsets == sorted(offsets), "an occurrence's events out of order"
    first_of: dict[uuid.UUID, ReceivedEvent] = {}
    for item in events:
        first_of.setdefault(item.event.occurrence_id, item)
    moved = [item for item in events if item.event.event == STARTED and first_of[item.event.occurrence_id] is item]
    assert reordered[: len(moved)] == moved


def test_a_heavy_partitions_first_transaction_holds_the_starts_its_runtimes_wait_for() -> None:
    # Occurrences 0 and 1 started in an earlier poll; 2 and 3 start in this one, behind 0's and 1's outcomes.
    events = history([(0, "succeeded"), (1, "heartbeat"), (2, "started"), (1, "succeeded"), (3, "started")])
    lanes = transaction_lanes(events, merge=0, most=2)
    assert [[(item.offset, item.event.event) for item in t] for t in lanes[0]] == [
        [(2, "started"), (4, "started")],
        [(0, "succeeded"), (1, "heartbeat")],
        [(3, "succeeded")],
    ]
    # A partition that fits one transaction is left as it came (one commit answers it all anyway).
    assert transaction_lanes(events, merge=0, most=5) == [[events]]

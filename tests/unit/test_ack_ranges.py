"""AckRanges: an acknowledged page's rows of one shard become consecutive logged ranges that cover every
row once, and each row's logged instant is at or after its own acknowledgement and at most the resolution
after it (its occurrence's enqueued_at is never early and never more than that late)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from relay.ack_ranges import AckRanges
from relay.ahead_lane import key_of
from schemas.dispatch_lanes import START_KEY, CursorKey, micros_of

TOP = datetime(2026, 12, 1, 12, tzinfo=UTC)
RESOLUTION = timedelta(milliseconds=50)


def rows_of(spec: list[tuple[int, int, int | None]]) -> tuple[list[dict], list[datetime | None]]:
    """Rows in key order from (bucket second, wrr_round, ack millisecond or None: passed unpublished)."""
    ordered = sorted(spec, key=lambda s: (s[0], s[1]))
    rows = [
        {"bucket_us": micros_of(TOP + timedelta(seconds=b)), "wrr_round": r, "occurrence_id": uuid.UUID(int=i + 1)}
        for i, (b, r, _) in enumerate(ordered)
    ]
    acks = [None if ms is None else TOP + timedelta(milliseconds=ms) for _, _, ms in ordered]
    return rows, acks


def split(rows: list[dict], acks: list[datetime | None], start: CursorKey = START_KEY):
    ranges = AckRanges(start, RESOLUTION)
    for row, ack in zip(rows, acks, strict=True):
        ranges.add(row, ack)
    return ranges.ranges()


def test_a_burst_acknowledged_within_the_resolution_is_one_range_at_its_last_acknowledgement():
    rows, acks = rows_of([(0, r, 10 + r) for r in range(40)])
    [only] = split(rows, acks)
    assert (only.start, only.end, only.rows) == (START_KEY, key_of(rows[-1]), 40)
    assert only.acked_at == TOP + timedelta(milliseconds=49)


def test_rows_of_one_second_acknowledged_far_apart_are_logged_apart():
    # key order is not release order within a second: an early, a late, then an early row again
    rows, acks = rows_of([(0, 0, 5), (0, 1, 900), (0, 2, 20), (1, 0, 1010), (1, 1, None)])
    ranges = split(rows, acks)
    assert [(r.rows, r.acked_at) for r in ranges] == [
        (1, TOP + timedelta(milliseconds=5)),
        (1, TOP + timedelta(milliseconds=900)),
        (1, TOP + timedelta(milliseconds=20)),
        (2, TOP + timedelta(milliseconds=1010)),  # an unpublished row goes with its neighbour
    ]


def test_a_page_of_rows_none_acknowledged_is_one_range_per_second_at_no_instant():
    rows, acks = rows_of([(0, 0, None), (0, 1, None), (2, 0, None)])
    assert [(r.rows, r.acked_at) for r in split(rows, acks)] == [(2, None), (1, None)]


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 5), st.one_of(st.none(), st.integers(0, 4000))),
        min_size=1,
        max_size=60,
    )
)
def test_ranges_cover_every_row_once_and_bound_each_rows_error(spec):
    rows, acks = rows_of(spec)
    start = CursorKey(TOP - timedelta(seconds=5), 0, uuid.UUID(int=0))
    ranges = split(rows, acks, start)
    # consecutive from the cursor to the last row, covering every row exactly once
    assert ranges[0].start == start and ranges[-1].end == key_of(rows[-1])
    assert all(a.end == b.start for a, b in zip(ranges, ranges[1:], strict=False))
    assert sum(r.rows for r in ranges) == len(rows)
    index = 0
    for logged in ranges:
        members = list(range(index, index + logged.rows))
        index += logged.rows
        assert key_of(rows[members[-1]]) == logged.end
        assert len({rows[i]["bucket_us"] for i in members}) == 1, "a range spans one second"
        instants = [ack for ack in (acks[i] for i in members) if ack is not None]
        assert logged.acked_at == (max(instants) if instants else None)
        for ack in instants:  # each row's enqueued_at: never before its acknowledgement, at most RESOLUTION after
            assert logged.acked_at is not None and ack <= logged.acked_at <= ack + RESOLUTION

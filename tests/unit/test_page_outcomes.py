"""What a completed page moves (relay/page_outcomes.py): per shard, the cursor passes exactly the prefix of
rows that need no more publishing (acknowledged, discarded, missed at dispatch, poison after its tries), and
never a row that must go again; the other shards move on; a permanent refusal becomes poison only on its
last try, and a row that went through forgets its earlier refusals."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from relay.ahead_lane import key_of
from relay.page_outcomes import PoisonTries, acknowledged_prefix
from relay.page_release import MISSED_AT_DISPATCH
from schemas.dispatch_lanes import START_KEY, micros_of

TOP = datetime(2026, 12, 1, 12, tzinfo=UTC)
RESOLUTION = timedelta(milliseconds=50)
KINDS = ("acked", "discarded", "missed", "unknown", "transient", "permanent")


class Refused(Exception):
    def __init__(self, permanent: bool) -> None:
        super().__init__("refused")
        self.permanent = permanent


def page_of(spec: list[tuple[int, str]]) -> tuple[list[dict], list[BaseException | None], list[datetime | None]]:
    """A page in key order (by shard, then key) from (shard, outcome kind) pairs."""
    rows: list[dict] = []
    outcomes: list[BaseException | None] = []
    acked: list[datetime | None] = []
    for i, (shard, kind) in enumerate(sorted(spec, key=lambda s: s[0])):
        rows.append(
            {
                "shard": shard,
                "bucket_us": micros_of(TOP),
                "wrr_round": i,
                "occurrence_id": uuid.UUID(int=i + 1),
                "discarded": kind == "discarded",
                "tenant_id": "acme",
                "topic": "chronoq.occurrences.t",
            }
        )
        error = {
            "unknown": TimeoutError("no answer"),
            "transient": Refused(False),
            "permanent": Refused(True),
            "missed": MISSED_AT_DISPATCH,
        }.get(kind)
        outcomes.append(error)
        acked.append(TOP + timedelta(milliseconds=i) if kind == "acked" else None)
    return rows, outcomes, acked


def blocks(outcome: BaseException | None, row: dict, poison_now: bool) -> bool:
    if row["discarded"] or outcome is None or outcome is MISSED_AT_DISPATCH:
        return False
    return not (getattr(outcome, "permanent", False) and poison_now)


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(KINDS)), max_size=30), st.integers(1, 3))
def test_each_shard_moves_over_exactly_its_prefix_that_needs_no_more_publishing(
    spec: list[tuple[int, str]], poison_tries: int
) -> None:
    rows, outcomes, acked = page_of(spec)
    shards = sorted({r["shard"] for r in rows})
    outcome = acknowledged_prefix(
        rows, outcomes, acked, {s: START_KEY for s in shards}, {s: 7 for s in shards}, "strict",
        PoisonTries(poison_tries), RESOLUTION,
    )  # fmt: skip
    moves = {m.shard: m for m in outcome.moves}
    failed = 0
    poison = []
    for shard in shards:
        mine = [(r, o) for r, o in zip(rows, outcomes, strict=True) if r["shard"] == shard]
        prefix = []
        for row, error in mine:
            if blocks(error, row, poison_tries == 1):
                failed += 1
                break
            prefix.append(row)
            if error is not None and getattr(error, "permanent", False) and not row["discarded"]:
                poison.append(row["occurrence_id"])
        if not prefix:
            assert shard not in moves, "a cursor moved over nothing"
            continue
        move = moves[shard]
        assert move.epoch == 7
        assert move.end == key_of(prefix[-1]), "the cursor stops exactly before the first row to publish again"
        assert move.ranges[0].start == START_KEY and sum(r.rows for r in move.ranges) == len(prefix)
        assert all(a.end == b.start for a, b in pairwise(move.ranges)), "ranges are contiguous"
    assert outcome.failed == failed
    assert [q.occurrence_id for q in outcome.poison] == poison


def test_a_permanent_refusal_is_poison_on_its_last_try_and_a_row_that_went_through_starts_over() -> None:
    tries = PoisonTries(3)
    assert [tries.refused("a"), tries.refused("a")] == [None, None]
    tries.passed("a")  # published meanwhile: its refusals no longer count
    assert [tries.refused("a"), tries.refused("a"), tries.refused("a")] == [None, None, 3]
    assert tries.refused("a") is None, "poison once is forgotten: a later refusal counts from one again"

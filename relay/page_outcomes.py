"""What a completed page of the ahead relay moves, sets aside and leaves for the next pass: pure, no I/O.

A page is ordered by shard, then key. Per shard, the cursor may move only over a contiguous prefix of
rows that need no further publishing: acknowledged by the broker, discarded (canceled before their turn),
judged too late at dispatch (:data:`~relay.page_release.MISSED_AT_DISPATCH`), or refused for good
``poison_tries`` times (set aside as poison, quarantined by the caller). The first row of a shard that
failed otherwise (unknown outcome, a transient refusal, a permanent one not yet tried enough) blocks the
rest of that shard's rows in the page: they are read and published again from the cursor (at least once,
never a loss). Other shards of the page move on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from relay.ack_ranges import AckRanges
from relay.ahead_lane import AheadRow, CursorMove, Quarantined
from relay.page_release import MISSED_AT_DISPATCH
from schemas.dispatch_lanes import CursorKey


@dataclass(frozen=True)
class PageOutcome:
    """``moves``: per shard, the cursor move over its prefix (logged ranges); ``poison``: rows to set aside;
    ``failed``: shards blocked by a row that must be published again."""

    moves: list[CursorMove]
    poison: list[Quarantined]
    failed: int


class PoisonTries:
    """Permanent refusals per occurrence, across pages and passes, until ``limit`` of them make it poison."""

    __slots__ = ("_tries", "limit")

    def __init__(self, limit: int) -> None:
        self._tries: dict[object, int] = {}
        self.limit = limit

    def refused(self, occurrence_id: object) -> int | None:
        """Count one more permanent refusal: the number of tries once it is poison (forgotten here), else None."""
        tries = self._tries.get(occurrence_id, 0) + 1
        if tries < self.limit:
            self._tries[occurrence_id] = tries
            return None
        self._tries.pop(occurrence_id, None)
        return tries

    def passed(self, occurrence_id: object) -> None:
        """The row went through: its earlier refusals no longer count."""
        if self._tries:
            self._tries.pop(occurrence_id, None)


def acknowledged_prefix(
    rows: list[AheadRow],
    outcomes: list[BaseException | None],
    acked_each: list[datetime | None],
    starts: Mapping[int, CursorKey],
    epochs: Mapping[int, int],
    lane: str,
    tries: PoisonTries,
    resolution: timedelta,
) -> PageOutcome:
    """Per shard, the rows up to the first that is neither acknowledged, discarded, missed nor poison,
    logged in ranges of acknowledgement instants within ``resolution`` (:class:`relay.ack_ranges.AckRanges`)
    from the shard's ``starts`` key; see the module docstring."""
    moves: list[CursorMove] = []
    poison: list[Quarantined] = []
    failed = 0
    shard: int | None = None
    blocked = False
    ranges: AckRanges | None = None

    def close() -> None:
        if shard is not None and ranges is not None and (logged := ranges.ranges()):
            moves.append(CursorMove(shard, epochs[shard], logged))

    for index, (row, error) in enumerate(zip(rows, outcomes, strict=True)):  # by shard, then key
        if row["shard"] != shard:
            close()
            shard, blocked = row["shard"], False
            ranges = AckRanges(starts[shard], resolution)
        if blocked:
            continue
        if error is not None and error is not MISSED_AT_DISPATCH and not row["discarded"]:
            times = tries.refused(row["occurrence_id"]) if getattr(error, "permanent", False) else None
            if times is None:
                failed, blocked = failed + 1, True
                continue
            poison.append(
                Quarantined(
                    row["occurrence_id"], row["shard"], lane, row["tenant_id"], row["topic"], repr(error), times
                )
            )
        else:
            tries.passed(row["occurrence_id"])
        assert ranges is not None
        ranges.add(row, acked_each[index])
    close()
    return PageOutcome(moves, poison, failed)

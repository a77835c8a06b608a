"""Which rows of a page the ahead relay hands over, and when: pure, no I/O (relay/ahead_relay.py calls it).

A page is ordered by shard, then key; its rows' available_at are not in page order. :class:`Releases` hands
out, in page order, the rows that became due, never one before its own available_at; :func:`to_release`
leaves out discarded rows and rows judged too late at their read; the outcomes a row can have without
reaching the broker are named here (:data:`MISSED_AT_DISPATCH`, :data:`NOT_HANDED_OVER`).
"""

from __future__ import annotations

import bisect

from relay.ahead_lane import AheadRow


class MissedAtDispatch(Exception):
    """The outcome of a row judged too late at dispatch: not published, recorded MISSED; the cursor passes it."""


MISSED_AT_DISPATCH = MissedAtDispatch()

#: The outcome of every row of a page whose turn came after an earlier page's hand-over failed: nothing of
#: it went to the broker; the pass abandons it and its rows are read again from the cursor.
NOT_HANDED_OVER = TimeoutError("not handed over: an earlier page's hand-over failed in this pass")


def first_late_after(rows: list[AheadRow]) -> int | None:
    """The earliest late_after of a page in epoch microseconds (None if no row can be late): rows are
    judged one by one only when the page has a late one."""
    return min((late for late in (r["late_after_us"] for r in rows) if late is not None), default=None)


def to_release(rows: list[AheadRow], skip: frozenset[object], outcomes: list[BaseException | None]) -> list[int]:
    """Indexes of the rows to publish, in page order: not discarded, not in ``skip`` (those are marked
    :data:`MISSED_AT_DISPATCH` in ``outcomes``)."""
    if not skip:  # hash every row's id only when some row was judged at its read
        return [i for i, r in enumerate(rows) if not r["discarded"]]
    for i, r in enumerate(rows):
        if r["occurrence_id"] in skip:
            outcomes[i] = MISSED_AT_DISPATCH
    return [i for i, r in enumerate(rows) if not r["discarded"] and r["occurrence_id"] not in skip]


class Releases:
    """Which rows of a page are due at an instant. A page is ordered by shard, then key: its rows'
    available_at are not in page order (a shard's rows of a later bucket come before the next shard's rows
    of an earlier one; a flexible bucket's rows carry their own jitter), so nothing can be inferred from the
    order. The rows are sorted by available_at once; each call returns, in page order, those that became
    due since the last call, and never one whose available_at is still ahead of ``now_us``."""

    __slots__ = ("_order", "_instants", "_next")

    def __init__(self, rows: list[AheadRow], indexes: list[int]) -> None:
        instants = [rows[i]["available_us"] for i in indexes]
        self._order, self._instants, self._next = indexes, instants, 0
        if instants and min(instants) != max(instants):  # a burst's page is due at one instant: no sort
            pairs = sorted(zip(instants, indexes, strict=True))
            self._instants = [at for at, _ in pairs]
            self._order = [i for _, i in pairs]

    @property
    def done(self) -> bool:
        """Every row was handed out."""
        return self._next >= len(self._order)

    def left(self) -> list[int]:
        """The rows not handed out yet, in page order."""
        return sorted(self._order[self._next :])

    def due(self, now_us: int | None) -> list[int]:
        if now_us is None or self.done:
            return []
        end = bisect.bisect_right(self._instants, now_us, self._next)
        if end == self._next:
            return []
        due = self._order[self._next : end]
        self._next = end
        return sorted(due)

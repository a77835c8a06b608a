"""Which Kafka offset a partition may commit when messages finish out of order.

With several handlers in flight per partition, message 7 can finish before
message 5. The committed offset is the position the next owner of the
partition resumes from, so it must never pass an unfinished message: it is the
lowest unfinished offset, or one past the highest finished when nothing is
unfinished. Pure bookkeeping, no I/O.
"""

from __future__ import annotations

import heapq


class PartitionOffsets:
    """Offsets of one partition that were fetched and not yet finished."""

    def __init__(self) -> None:
        self._unfinished: list[int] = []  # min-heap
        self._finished_early: set[int] = set()  # finished while a lower offset was still unfinished
        self._open: set[int] = set()
        self._highest_seen: int | None = None

    def add(self, offset: int) -> None:
        """A fetched message that is not finished yet (fetch order is offset order)."""
        if offset in self._open:
            return
        self._open.add(offset)
        heapq.heappush(self._unfinished, offset)
        if self._highest_seen is None or offset > self._highest_seen:
            self._highest_seen = offset

    def finish(self, offset: int) -> None:
        """The message at ``offset`` needs no further work (applied, reported, dead-lettered...)."""
        if offset not in self._open:
            return
        self._open.discard(offset)
        self._finished_early.add(offset)
        while self._unfinished and self._unfinished[0] in self._finished_early:
            self._finished_early.discard(heapq.heappop(self._unfinished))

    def committable(self) -> int | None:
        """The offset to commit (the next one to read), or None before anything was fetched."""
        if self._unfinished:
            return self._unfinished[0]
        if self._highest_seen is None:
            return None
        return self._highest_seen + 1

    @property
    def in_flight(self) -> int:
        return len(self._open)

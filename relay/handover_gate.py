"""How many pages the ahead relay has handing rows to the broker at once, in the order the pages were read.

The relay reads pages ahead of their instant (``AheadRelayConfig.read_ahead_rows``); each waits in its own
task for its rows' ``available_at``. Released all at once, a burst's pages would reach the broker together:
the weighted round-robin order between them (small tenants' first rounds are in the first pages) would be
lost, and every page's delivery reports would queue behind the hand-over of all the others. So a page
reserves a slot when it is read, in read order, and holds it from its turn until every row it handed over
is answered; at most ``slots`` pages hold one. That is the relay's pipeline of ``pages_in_flight`` pages as
before reading ahead, strict before flexible as pages are read (strict first), now with more pages read and
waiting behind it.

A page's rows are never due before those of a page read before it in the same lane (each page takes every
shard's next rows in key order), so taking turns in read order never makes a due page wait for one that is
not due yet in its lane.
"""

from __future__ import annotations

import asyncio
from collections import deque


class HandoverGate:
    """At most ``slots`` holders at once; reservations are granted first come, first served."""

    __slots__ = ("_free", "_queue")

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a hand-over gate needs at least one slot")
        self._free = slots
        self._queue: deque[asyncio.Future[None]] = deque()

    @property
    def free(self) -> int:
        """Slots nobody holds."""
        return self._free

    def reserve(self) -> asyncio.Future[None]:
        """A place in line, taken now (not when awaited): the future is done once the slot is the caller's."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._free > 0 and not self._queue:
            self._free -= 1
            turn.set_result(None)
        else:
            self._queue.append(turn)
        return turn

    def give_back(self, turn: asyncio.Future[None]) -> None:
        """End a reservation: the slot goes to the next in line if ``turn`` held it; a place still in line
        is withdrawn. Call once per reservation, whatever happened to its holder."""
        if turn.done() and not turn.cancelled():
            while self._queue:
                waiting = self._queue.popleft()
                if not waiting.done():
                    waiting.set_result(None)
                    return
            self._free += 1
        else:
            turn.cancel()
            try:
                self._queue.remove(turn)
            except ValueError:
                pass

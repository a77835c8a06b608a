"""Which page of the ahead relay hands rows to the broker next, and how many hand-overs are unanswered at once.

The relay reads pages ahead of their instant (``AheadRelayConfig.read_ahead_rows``); each waits in its own
task for its rows' ``available_at``. Released all at once, a burst's pages would reach the broker together:
the weighted round-robin order between them (small tenants' first rounds are in the first pages) would be
lost, and every page's delivery reports would queue behind the hand-over of all the others. So a hand-over
takes a slot of this gate when its rows are due and holds it until the broker answered it; at most
``slots`` hand-overs are unanswered at once (the relay's ``pages_in_flight``).

A slot goes to a hand-over whose rows are due, never to a page still waiting for its instant: a page read
ahead (a strict burst 5 s before the top) holds nothing while it waits, so the due rows of another lane are
not held up behind it. Among hand-overs waiting for a slot the lane with the lower rank goes first (strict
before flexible: a flexible backlog waiting for a slow broker does not stand before strict rows read after
it), and within a lane the first to ask. Read order within a lane is kept by the relay itself: a page hands
rows over only once the page read before it in its lane has handed over its last row.
"""

from __future__ import annotations

import asyncio
from collections import deque


class HandoverGate:
    """At most ``slots`` holders at once; a free slot goes to the waiting holder of the lowest rank, first come
    first served within a rank."""

    __slots__ = ("_free", "_waiting")

    def __init__(self, slots: int, ranks: int = 1) -> None:
        if slots < 1:
            raise ValueError("a hand-over gate needs at least one slot")
        if ranks < 1:
            raise ValueError("a hand-over gate needs at least one rank")
        self._free = slots
        self._waiting: tuple[deque[asyncio.Future[None]], ...] = tuple(deque() for _ in range(ranks))

    @property
    def free(self) -> int:
        """Slots nobody holds."""
        return self._free

    @property
    def waiting(self) -> int:
        """Holders waiting for a slot."""
        return sum(1 for queue in self._waiting for turn in queue if not turn.done())

    async def acquire(self, rank: int) -> None:
        """Wait for a slot (then held until :meth:`release`). Cancelled while waiting, the caller holds
        nothing: its place in line is withdrawn, or a slot granted at that moment is passed on."""
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[rank].append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()
            else:
                try:
                    self._waiting[rank].remove(turn)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        """Give a held slot back: it goes to the next waiting holder of the lowest rank, or becomes free."""
        for queue in self._waiting:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1

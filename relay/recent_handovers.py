"""How many rows this relay handed to the broker lately: a burst as the node itself sees it.

The settle pass (``engine.loops.dispatch_settler``) must not run inside a burst: its occurrence UPDATEs cost
the database ~80 µs of CPU per row, taken from the dispatch on a shared machine. The relay's ``quiet`` flag
is not enough for that: once a burst is read ahead, the relay only hands rows over, which counts as quiet
(not reading). Nor is the dispatch log: a relay handing a burst over logs its pages seconds after their
acknowledgements. An Apache Kafka 500,000 run settled 59,392 rows inside its burst that way, and its p99 was
9.1 s against 5.9 s in the run before, which settled none (docs/benchmarks.md, stop 35). Counting the rows
handed over, when they are handed over, sees the burst from its first hand-over on.

Pure: the caller passes the instants (the event loop's monotonic time).
"""

from __future__ import annotations

from collections import deque
from itertools import takewhile


class RecentHandovers:
    """Rows handed over per instant, kept for ``keep`` seconds."""

    def __init__(self, keep: float = 10.0) -> None:
        self.keep = keep
        self._events: deque[tuple[float, int]] = deque()

    def add(self, rows: int, at: float) -> None:
        """Record ``rows`` handed over at ``at`` (instants never go back: one monotonic clock)."""
        self._events.append((at, rows))
        self._forget(at)

    def since(self, seconds: float, now: float) -> int:
        """Rows handed over in the last ``seconds`` (at most ``keep``) before ``now``."""
        self._forget(now)
        cutoff = now - min(seconds, self.keep)
        return sum(rows for _at, rows in takewhile(lambda event: event[0] > cutoff, reversed(self._events)))

    def _forget(self, now: float) -> None:
        cutoff = now - self.keep
        while self._events and self._events[0][0] <= cutoff:
            self._events.popleft()

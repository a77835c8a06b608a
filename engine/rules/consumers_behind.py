"""Whether consumers are working through a backlog, judged by the attempt events the processor applies.

An event of an attempt that started ``after`` seconds or more past its occurrence's ``available_at`` is
*late*: the consumer took the occurrence from a backlog, not as it came due. The caller says how late each
event is (the attempt processor: for a ``started``, from now; for an outcome, from the start the row
records, which is the processor's own instant until the settle pass writes the broker's acknowledgement).
``events`` late events within the last ``window`` seconds mean consumers are behind, and the processor says
so in the database (``consumers_behind``, migration 0031), where the settle pass reads it and waits: its
updates of the occurrence rows would compete with the consumers' own path for the database
(docs/benchmarks.md, stop 55). A consumer keeping up starts its occurrences within a second of their
``available_at`` and is never behind, however many there are or however long their handlers run: steady
traffic never holds the settle pass back.

Pure: every method takes the instant as an argument. Guarantees (property-tested in
tests/unit/test_consumers_behind.py):

* behind exactly when the late events recorded within ``(now - window, now]`` number ``events`` or more;
  events on time never count, nor do late ones recorded ``window`` seconds or more before ``now``;
* ``events`` 0 turns it off: never behind;
* an announcement is due while behind, at most once per half ``window`` (the announcement itself lasts
  three windows, :data:`ANNOUNCEMENT_WINDOWS`, so one rewrite can come late without a gap);
* a clock that steps backwards neither drops what it should still count nor counts what left the window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta

#: How many ``window``s one announcement lasts.
ANNOUNCEMENT_WINDOWS = 3


class ConsumersBehind:
    """Late events within a sliding window, and when to say so."""

    def __init__(self, after: float, events: int, window: float) -> None:
        if after < 0 or events < 0 or window <= 0:
            raise ValueError("after and events must be 0 or more, window more than 0")
        self.after = after
        self.events = events
        self.window = timedelta(seconds=window)
        self._late: deque[tuple[datetime, int]] = deque()  # (when recorded, late events), oldest first
        self._announced: datetime | None = None

    def record(self, now: datetime, lateness_s: Iterable[float]) -> int:
        """Count events applied at ``now`` whose attempts started ``lateness_s`` seconds past their occurrences'
        available_at; returns how many of them were late."""
        late = sum(1 for seconds in lateness_s if seconds >= self.after)
        if late and self.events:
            self._late.append((now, late))
        return late

    def behind(self, now: datetime) -> bool:
        """``events`` late events or more were recorded within the last ``window`` before ``now``."""
        if not self.events:
            return False
        while self._late and self._late[0][0] <= now - self.window:
            self._late.popleft()
        start = now - self.window
        # Both bounds: after a clock that stepped back an old entry can sit behind a newer one.
        return sum(n for at, n in self._late if start < at <= now) >= self.events

    def announcement_due(self, now: datetime) -> bool:
        """Behind, and not announced within the last half ``window``."""
        if not self.behind(now):
            return False
        return self._announced is None or not (now - self.window / 2 < self._announced <= now)

    def announced(self, now: datetime) -> None:
        """An announcement lasting until ``now`` plus :data:`ANNOUNCEMENT_WINDOWS` windows was written."""
        self._announced = now

    @property
    def lasts_s(self) -> float:
        """Seconds one announcement lasts."""
        return ANNOUNCEMENT_WINDOWS * self.window.total_seconds()

"""The ahead relay's clock: the injected one, or the database's estimated between statements (no I/O)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from schemas.clock import Clock


class ClockEstimate:
    """The injected clock if it gives an instant, else the database's, estimated from the last seal.

    The estimate is the database instant a statement returned plus the local monotonic time elapsed
    since its reply arrived: never ahead of the real database clock, so rows are never released early.
    Each statement's instant is a lower bound lagging by its own latency, so a slow seal would move the
    estimate back: the later of the two is kept, and the estimate never goes back (a row released at its
    available_at and acknowledged after a slow seal was stamped up to 0.14 s before it).
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._db: datetime | None = None
        self._at = 0.0

    def observe(self, db_now: datetime) -> None:
        at = time.monotonic()
        if self._db is None or db_now > self._db + timedelta(seconds=at - self._at):
            self._db, self._at = db_now, at

    def now(self) -> datetime | None:
        injected = self.clock.now()
        if injected is not None:
            return injected
        if self._db is None:
            return None
        return self._db + timedelta(seconds=time.monotonic() - self._at)

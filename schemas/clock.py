"""The one clock of chronoq.

Production code never reads a host's wall clock to decide whether something is
due. Services receive a :class:`Clock`; SQL takes ``coalesce($now, now())`` so
that in production the database's clock rules and in tests a
:class:`ManualClock` supplies the instant.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime | None:
        """The current instant, or None meaning "use the database's clock"."""


class DatabaseClock:
    """Production clock: defers to PostgreSQL's ``now()`` in every query."""

    def now(self) -> datetime | None:
        return None


class ManualClock:
    """A clock a test sets and advances explicitly; never moves on its own."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime (UTC)")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        if not isinstance(delta, timedelta):
            delta = timedelta(seconds=delta)
        self._now += delta
        return self._now

    def set(self, instant: datetime) -> None:
        if instant.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime (UTC)")
        self._now = instant.astimezone(UTC)


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds`` of real time or until ``stop`` is set, whichever is first.

    Service loops idle with this (never with a bare ``asyncio.sleep``) so that
    shutdown is immediate.
    """
    try:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that arrives as ``stop``
        # is set, and the cancelled loop would carry on.
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass

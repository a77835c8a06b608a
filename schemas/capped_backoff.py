"""Capped doubling backoff: the delays between in-place retries of one step (pure: no clock, no sleep).

Every loop that retries a step where it stands — a report the broker did not acknowledge, a database that
is restarting, a dead-letter send — waits ``first`` seconds, then twice as long each time, never longer than
``cap``. One definition, so the loops cannot drift apart in how they back off.
"""

from __future__ import annotations

from collections.abc import Iterator


def capped_doubling(first: float, cap: float) -> Iterator[float]:
    """Endless delays: ``first``, then each the previous one doubled, at most ``cap``.

    The first delay is ``first`` as given, even above ``cap``; every later one is ``min(previous * 2, cap)``.
    Start a new iterator to start again from ``first`` (after a success).
    """
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, cap)

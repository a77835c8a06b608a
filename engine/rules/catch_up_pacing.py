"""Catch-up pacing: when the slots of a backfill may be released, within the tenant's catch-up quota.

Pure. The tenant's quota ``per_minute`` is a rate; its state is one instant,
``free_at`` — a virtual clock that every released slot advances by one
interval (60 s / per_minute), the generic cell rate algorithm. A tenant that
has been idle may release one minute's quota at once (the clock never lags
more than a minute behind now); after that, slots follow one interval apart.
Several backfills of one tenant share the clock, so together they never
exceed the quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

BURST = timedelta(minutes=1)


@dataclass(frozen=True)
class Pacing:
    release_at: list[datetime]  # one per slot, ascending, none before now
    free_at: datetime  # the tenant's clock afterwards


def pace(count: int, per_minute: int, now: datetime, free_at: datetime | None) -> Pacing:
    """Release instants of ``count`` slots at ``per_minute`` (at least 1) from the tenant's clock."""
    if per_minute < 1:
        raise ValueError("per_minute must be at least 1")
    if count < 0:
        raise ValueError("count must not be negative")
    interval = timedelta(minutes=1) / per_minute
    start = now - BURST if free_at is None else max(free_at, now - BURST)
    release = [max(now, start + interval * (i + 1)) for i in range(count)]
    return Pacing(release, start + interval * count)

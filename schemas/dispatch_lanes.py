"""The dispatch lanes: which lane an occurrence travels in, its time bucket, and the seal rule.

Pure; shared by the engine (the materializer writes the ahead lane) and the
relay (which reads it), so both agree on keys without importing each other.

- Lanes: ``strict`` and ``flexible`` occurrences are dispatched separately
  and strict is served first when both are backlogged.
- Buckets: an ahead-lane row's key starts with its ``available_at``
  truncated to the second (:func:`bucket_of`); within a bucket rows are in
  weighted round-robin order, so fairness never reorders across time.
- Seals: a relay seals a lane of a shard up to a bucket boundary
  (:func:`seal_boundary`, ``read_ahead`` past now); rows before the seal are
  all committed, rows at or after it may still be written.
- Cursor keys: ``(bucket, wrr_round, occurrence_id)``; :data:`START_KEY`
  precedes every row.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

#: In priority order: the relay reads strict first, and its hand-over gate ranks a lane by its index here.
LANES = ("strict", "flexible")
BUCKET = timedelta(seconds=1)
BUCKET_US = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NIL = uuid.UUID(int=0)


def lane_of(priority: str) -> str:
    """The lane of an occurrence of a schedule with this priority."""
    if priority not in LANES:
        raise ValueError(f"unknown priority {priority!r}; expected one of {LANES}")
    return priority


def bucket_of(available_at: datetime) -> datetime:
    """The start of the one-second bucket holding ``available_at`` (UTC)."""
    if available_at.tzinfo is None:
        raise ValueError("available_at must be timezone-aware")
    instant = available_at.astimezone(UTC)
    return _EPOCH + (instant - _EPOCH) // BUCKET * BUCKET


def bucket_of_micros(micros: int) -> int:
    """:func:`bucket_of` in :func:`micros_of` terms: the start of the second holding ``micros`` (how the
    materializer stages instants: asyncpg encodes an int8 in a tenth of a timestamptz's time)."""
    return micros - micros % BUCKET_US


def seal_boundary(now: datetime, read_ahead: timedelta) -> datetime:
    """The seal a relay asks for at ``now``: the bucket boundary at or before ``now + read_ahead``.

    Every bucket that starts before it is complete once the seal commits; the
    relay may read those rows ahead of time but releases each at its available_at.
    """
    if read_ahead < timedelta(0):
        raise ValueError("read_ahead must not be negative")
    return bucket_of(now + read_ahead)


def goes_ahead(available_at: datetime, sealed_until: datetime) -> bool:
    """True if a row due at ``available_at`` may still be written to the ahead lane of a shard sealed
    until ``sealed_until``; False means the late lane (the outbox)."""
    return bucket_of(available_at) >= sealed_until


NEGATIVE_INFINITY = datetime.min.replace(tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros_of(instant: datetime) -> int:
    """``instant`` as integer microseconds since the Unix epoch (exact; the page read's ``*_us`` columns)."""
    return (instant - _EPOCH) // _MICROSECOND


def instant_of_micros(micros: int) -> datetime:
    """The UTC instant ``micros`` microseconds after the Unix epoch; inverse of :func:`micros_of`."""
    return _EPOCH + timedelta(microseconds=micros)


def aware(instant: datetime) -> datetime:
    """asyncpg reads timestamptz '-infinity' as a naive datetime.min: make it the aware one."""
    return NEGATIVE_INFINITY if instant.tzinfo is None and instant == datetime.min else instant


@dataclass(frozen=True, order=True)
class CursorKey:
    """A position in one (shard, lane) of the ahead lane: rows at or before it are published."""

    bucket: datetime
    wrr_round: int
    occurrence_id: uuid.UUID


START_KEY = CursorKey(NEGATIVE_INFINITY, 0, NIL)

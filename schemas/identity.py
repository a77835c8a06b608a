"""Deterministic identities.

An occurrence's id is a pure function of (schedule_id, schedule_version,
scheduled_for), so a materializer replay, a relay retry, a failover or a DLQ
replay always carries the same id and consumers can dedupe on it.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import UTC, datetime, timedelta

from asyncpg.pgproto.pgproto import UUID as FastUUID

__all__ = [
    "OCCURRENCE_NAMESPACE",
    "OCCURRENCE_NAMESPACE_BYTES",
    "FastUUID",
    "is_slot_occurrence",
    "micros_text",
    "occurrence_id",
    "random_uuid",
    "uuid5_int",
]

# Fixed namespace for uuid5; changing it would change every occurrence id.
OCCURRENCE_NAMESPACE = uuid.UUID("6f1c2a0e-4d0b-5c8e-9a51-63686f6e6f71")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def occurrence_id(schedule_id: uuid.UUID, schedule_version: int, scheduled_for: datetime) -> uuid.UUID:
    """uuid5 of ``<schedule_id>/<version>/<scheduled_for as UTC microseconds>``.

    ``scheduled_for`` must be timezone-aware; the same instant written in any
    zone yields the same id.
    """
    if scheduled_for.tzinfo is None:
        raise ValueError("scheduled_for must be timezone-aware")
    instant = scheduled_for.astimezone(UTC)
    micros = (instant - _EPOCH) // _MICROSECOND
    return uuid.uuid5(OCCURRENCE_NAMESPACE, f"{schedule_id}/{schedule_version}/{micros}")


#: The namespace's bytes, which every uuid5 name is hashed after (a property that converts on each read).
OCCURRENCE_NAMESPACE_BYTES = OCCURRENCE_NAMESPACE.bytes
# RFC 4122: the version nibble and the variant bits, cleared in 128 bits (a digest's or random ones) and set
# for uuid5 (occurrence ids) or uuid4 (random ids).
_VERSION_VARIANT_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID5_BITS = (0x5000 << 64) | (0x8000 << 48)
_UUID4_BITS = (0x4000 << 64) | (0x8000 << 48)

# FastUUID is asyncpg's UUID (the type of every uuid column it reads): a uuid.UUID subclass, equal to and
# hashing like the uuid.UUID of the same value, implemented in C, so parsing a string, hashing, comparing and
# str() cost a tenth to a half of uuid.UUID's Python code (docs/benchmarks.md, stop 52). orjson writes only
# uuid.UUID itself, so ids handed to user code stay uuid.UUID; chronoq's own encoders pass default=str.


def random_uuid() -> uuid.UUID:
    """A random (version 4) UUID, as ``uuid.uuid4()`` from the same source (``os.urandom``), built as a
    :data:`FastUUID` at half its cost: for ids that stay inside chronoq (an attempt's id)."""
    return FastUUID(((int.from_bytes(os.urandom(16)) & _VERSION_VARIANT_CLEAR) | _UUID4_BITS).to_bytes(16))


def micros_text(instant: datetime) -> bytes:
    """An aware instant as UTC microseconds since the epoch, the last part of an occurrence id's name."""
    return str((instant - _EPOCH) // _MICROSECOND).encode()


def uuid5_int(namespaced_name: bytes) -> int:
    """The 128-bit value of ``uuid.uuid5(namespace, name)`` from the namespace's bytes followed by the name's:
    the digest with the version and variant set, without building a ``uuid.UUID`` (a third of its time).
    The materializer and the consumer's slot test run it per occurrence; tests hold both to
    :func:`occurrence_id`."""
    return (int.from_bytes(hashlib.sha1(namespaced_name).digest()[:16]) & _VERSION_VARIANT_CLEAR) | _UUID5_BITS


def is_slot_occurrence(
    occurrence: uuid.UUID, schedule_id: uuid.UUID, schedule_version: int, scheduled_for: datetime
) -> bool:
    """Whether ``occurrence`` is the slot's own occurrence: its id is the one :func:`occurrence_id` gives the
    slot (the schedule's firing, a catch-up, a backfill). A manual trigger has an id of its own and is not,
    even on a slot's instant. Every delivery a consumer applies asks it."""
    if scheduled_for.tzinfo is None:
        raise ValueError("scheduled_for must be timezone-aware")
    name = f"{schedule_id}/{schedule_version}/".encode() + micros_text(scheduled_for)
    return occurrence.int == uuid5_int(OCCURRENCE_NAMESPACE_BYTES + name)

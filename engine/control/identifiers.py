"""Ids and versions as callers write them (URL path segments, CLI arguments, bodies)."""

from __future__ import annotations

import uuid

from schemas.errors import InvalidInput, NotFound


def as_uuid(value: uuid.UUID | str, kind: str) -> uuid.UUID:
    """A path or CLI id as a UUID; anything else is simply not found (never a 500 or a leak)."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError as err:
        raise NotFound(kind, value) from err


def expected_version(value: object) -> int:
    """A change's ``expected_version``: the version the caller read (a positive integer), or InvalidInput
    naming the field. A schedule or calendar change with it applies only while the record is at that version."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInput("expected_version", "must be a positive integer (the version you read)", "3")
    return value

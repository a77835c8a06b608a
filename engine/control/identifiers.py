"""Ids as callers write them (URL path segments, CLI arguments)."""

from __future__ import annotations

import uuid

from schemas.errors import NotFound


def as_uuid(value: uuid.UUID | str, kind: str) -> uuid.UUID:
    """A path or CLI id as a UUID; anything else is simply not found (never a 500 or a leak)."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError as err:
        raise NotFound(kind, value) from err

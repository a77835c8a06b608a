"""Keyset pagination shared by every listing of the API and CLI.

A cursor is the opaque, URL-safe encoding of the sort key of the last item of
a page (an instant and an id); the next page is "rows after that key", so
pages stay stable while rows are inserted. Listings fetch ``limit + 1`` rows
to know whether another page exists.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import orjson

from schemas.errors import InvalidInput, MalformedMessage
from schemas.messages import format_instant
from schemas.record_fields import parse_instant

MAX_PAGE = 500
Row = TypeVar("Row")


def page_size(limit: object, maximum: int = MAX_PAGE) -> int:
    """A valid page size, or InvalidInput('limit')."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= maximum:
        raise InvalidInput("limit", f"must be an integer from 1 to {maximum}", "50")
    return limit


def text_filter(name: str, value: str | None) -> str | None:
    """A listing's text filter as given, or InvalidInput when the database could not compare it (NUL)."""
    if value is not None and "\x00" in value:
        raise InvalidInput(name, "must not contain a NUL character")
    return value


def encode_cursor(at: datetime, ident: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([format_instant(at), str(ident)])).decode().rstrip("=")


MAX_CURSOR = 200


def decode_cursor(cursor: str | None) -> tuple[datetime | None, uuid.UUID | None]:
    """The sort key a cursor encodes, (None, None) for the first page, or InvalidInput('cursor').

    Validated, not trusted: a cursor is client input, so anything but the
    ``[instant, uuid]`` pair this module encodes — whatever base64 it comes
    wrapped in — is refused naming the field, and never reaches a query.
    """
    if cursor is None:
        return None, None
    refused = InvalidInput("cursor", "is not a cursor returned by this listing; start without one")
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR:
        raise refused
    try:
        data = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(data, list) or len(data) != 2 or not isinstance(data[1], str) or len(data[1]) != 36:
            raise refused
        return parse_instant(data[0], "cursor"), uuid.UUID(data[1])
    except (ValueError, TypeError, orjson.JSONDecodeError, MalformedMessage) as err:
        raise refused from err


def split_page(
    rows: Sequence[Row], limit: int, key: Callable[[Row], tuple[datetime, uuid.UUID]]
) -> tuple[Sequence[Row], str | None]:
    """The rows of this page and the cursor of the next (None on the last page), from limit + 1 rows."""
    if len(rows) <= limit:
        return rows, None
    return rows[:limit], encode_cursor(*key(rows[limit - 1]))


def key_of(at_field: str, id_field: str) -> Callable[[Any], tuple[datetime, uuid.UUID]]:
    """The sort key of a listing's records: (instant, id) attributes."""
    return lambda record: (getattr(record, at_field), getattr(record, id_field))

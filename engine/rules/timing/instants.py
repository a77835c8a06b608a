"""Instants of the time contract: the range fires are computed in, and ISO-8601 input.

Instants are aware UTC datetimes at the API; inside, fire computation works on
naive UTC datetimes (cheaper to compare and hash). Fire times are computed for
instants between 1800 and 9000 (beyond, a schedule counts as exhausted); user
input is accepted for the years 1900 to 8999.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schemas.errors import InvalidInput

UTC = UTC
EPOCH = datetime(1970, 1, 1)
MICROSECOND = timedelta(microseconds=1)
DAY = timedelta(days=1)
FLOOR = datetime(1800, 1, 1)  # instants considered: [FLOOR, CEILING]
CEILING = datetime(9000, 1, 1)
_INPUT_YEARS = (1900, 8999)  # accepted years of user-given instants


def parse_instant(value: object, field: str) -> datetime:
    """An aware instant from a datetime or ISO-8601 text, normalized to UTC."""
    example = "2027-03-01T09:00:00Z"
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidInput(field, f"{text[:40]!r} is not an ISO-8601 instant", example) from None
    elif isinstance(value, datetime):
        parsed = value
    else:
        raise InvalidInput(field, f"must be an ISO-8601 instant, got {type(value).__name__}", example)
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidInput(field, f"{parsed.isoformat()!r} has no UTC offset; add an offset or Z", example)
    try:
        instant = parsed.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(field, "is out of range", example) from None
    if not _INPUT_YEARS[0] <= instant.year <= _INPUT_YEARS[1]:
        raise InvalidInput(field, f"year {instant.year} is outside {_INPUT_YEARS[0]}-{_INPUT_YEARS[1]}", example)
    return instant


def iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def naive_utc(instant: datetime, name: str) -> datetime:
    if instant.tzinfo is None:
        raise ValueError(f"{name} must be an aware datetime (UTC), got naive {instant!r}")
    if instant.tzinfo is not UTC:
        instant = instant.astimezone(UTC)
    return instant.replace(tzinfo=None)


def aware_utc(instant: datetime, name: str) -> datetime:
    if instant.tzinfo is UTC:
        return instant
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime (UTC), got naive {instant!r}")
    return instant.astimezone(UTC)

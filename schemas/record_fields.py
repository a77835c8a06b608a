"""Strict readers of untrusted Kafka records: the value's JSON object, its fields, its headers.

Every chronoq decoder (occurrences, schedule states, commands, attempt
events, dead letters, target bindings) is built from these readers, so each
decoder is **total**: whatever bytes and headers arrive — a tombstone, a
non-UTF-8 value, a null header value, NaN, a number with four hundred digits,
a NUL character, ``0001-01-01T00:00:00+01:00`` — it returns a typed message or
raises :class:`MalformedMessage` naming the field, and never any other
exception. Processors rely on that: a rejected record is answered,
dead-lettered or counted, and its offset moves on.

The ranges here are the wire contract (documented in ``docs/security.md``):

* text fields: a ``str``, without NUL (PostgreSQL text and jsonb cannot hold
  one), at most the field's length limit;
* integers: JSON integers (never booleans or floats), within the field's range
  — by default a PostgreSQL ``integer`` (at most 2,147,483,647);
* instants: ISO-8601 with an offset or ``Z``, from
  :data:`INSTANT_MIN` to :data:`INSTANT_MAX` once converted to UTC. The
  engine's own instants lie well inside (user-given instants are limited to
  the years 1900-8999; computed ones add at most the longest duration);
* UUIDs: the canonical text form.
"""

from __future__ import annotations

import functools
import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson

from schemas.errors import MalformedMessage
from schemas.identity import FastUUID

#: Wire instants, once converted to UTC, lie in [INSTANT_MIN, INSTANT_MAX].
INSTANT_MIN = datetime(1800, 1, 1, tzinfo=UTC)
INSTANT_MAX = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
#: The largest value of a PostgreSQL ``integer`` column (versions, attempt numbers).
MAX_INT32 = 2**31 - 1
#: Default length limit of a text field (ids, names, classes).
MAX_NAME = 200
_MAX_INSTANT_TEXT = 64
_MAX_UUID_TEXT = 45
Headers = Iterable[tuple[Any, Any]] | None
T = TypeVar("T")


def json_object(value: object, kind: str = "message", formats: frozenset[int] = frozenset({1})) -> dict[str, Any]:
    """The JSON object of a record value with a known ``format``, or MalformedMessage."""
    if value is None:
        raise MalformedMessage(f"{kind} has no value (tombstone)", "value")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise MalformedMessage(f"{kind} value is not bytes", "value")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as err:
        raise MalformedMessage(f"{kind} is not JSON: {err}", "value") from err
    if not isinstance(data, dict):
        raise MalformedMessage(f"{kind} is not a JSON object", "value")
    fmt = data.get("format")
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt not in formats:
        raise MalformedMessage(f"unknown {kind} format {_shown(fmt)}; this reader knows {sorted(formats)}", "format")
    return data


def entries(data: Mapping[str, Any], name: str, maximum: int, read: Callable[[dict[str, Any]], T]) -> list[T]:
    """List field ``name`` of 1 to ``maximum`` JSON objects, each read by ``read`` (a group record's
    entries), in order; MalformedMessage naming the entry at fault (``events[3]: field 'attempt' ...``)."""
    listed = data.get(name)
    if not isinstance(listed, list) or not 0 < len(listed) <= maximum:
        raise MalformedMessage(f"field {name!r} must be a list of 1 to {maximum} objects", name)
    found = []
    for position, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise MalformedMessage(f"{name}[{position}] is not a JSON object", name)
        try:
            found.append(read(entry))
        except MalformedMessage as err:
            raise MalformedMessage(f"{name}[{position}]: {err.problem}", err.field) from err
    return found


def text(data: Mapping[str, Any], name: str, max_length: int = MAX_NAME) -> str:
    """A required, non-empty text field without NUL, at most ``max_length`` characters."""
    value = optional_text(data, name, max_length)
    if not value:
        raise MalformedMessage(f"field {name!r} must be a non-empty string", name)
    return value


def optional_text(data: Mapping[str, Any], name: str, max_length: int = MAX_NAME) -> str | None:
    """A text field that may be absent or null; present, it has no NUL and fits ``max_length``."""
    raw = data.get(name)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise MalformedMessage(f"field {name!r} must be a string, got {_type(raw)}", name)
    if "\x00" in raw:
        raise MalformedMessage(f"field {name!r} contains a NUL character", name)
    if len(raw) > max_length:
        raise MalformedMessage(f"field {name!r} is {len(raw)} characters long; the limit is {max_length}", name)
    return raw


def choice(data: Mapping[str, Any], name: str, choices: Iterable[str], default: str | None = None) -> str:
    """One of ``choices`` (``default`` when absent or null, if given)."""
    options = tuple(choices)
    raw = data.get(name)
    if raw is None and default is not None:
        return default
    if not isinstance(raw, str) or raw not in options:
        raise MalformedMessage(f"field {name!r} must be one of {', '.join(options)}; got {_shown(raw)}", name)
    return raw


def uuid_field(data: Mapping[str, Any], name: str, *, internal: bool = False) -> uuid.UUID:
    """A required UUID (``internal``: see :func:`optional_uuid`)."""
    value = optional_uuid(data, name, internal=internal)
    if value is None:
        raise MalformedMessage(f"field {name!r} is required (a UUID)", name)
    return value


def optional_uuid(data: Mapping[str, Any], name: str, *, internal: bool = False) -> uuid.UUID | None:
    """A UUID or None. ``internal``: for ids that stay inside chronoq (attempt events in the engine, answers in
    the runtime), a :data:`schemas.identity.FastUUID` (equal and hashing alike, a tenth of the cost to parse);
    text it refuses is read by ``uuid.UUID``, so both modes accept exactly the same strings as the same value.
    Records handed to user code keep ``uuid.UUID`` itself."""
    raw = data.get(name)
    if raw is None:
        return None
    if not isinstance(raw, str) or len(raw) > _MAX_UUID_TEXT:
        raise MalformedMessage(f"field {name!r} must be a UUID string, got {_shown(raw)}", name)
    if internal:
        try:
            return FastUUID(raw)
        except ValueError:
            pass  # stricter than uuid.UUID (which takes "_" and "+" inside): let uuid.UUID judge
    try:
        return uuid.UUID(raw)
    except ValueError as err:
        raise MalformedMessage(f"field {name!r} is not a UUID: {_shown(raw)}", name) from err


def integer(
    data: Mapping[str, Any], name: str, minimum: int = 1, maximum: int = MAX_INT32, default: int | None = None
) -> int:
    """A JSON integer in [minimum, maximum] (``default`` when absent or null, if given)."""
    raw = data.get(name)
    if raw is None and default is not None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not minimum <= raw <= maximum:
        raise MalformedMessage(
            f"field {name!r} must be an integer from {minimum} to {maximum}, got {_shown(raw)}", name
        )
    return raw


def number(data: Mapping[str, Any], name: str, low: float, high: float, *, low_open: bool = False) -> float | None:
    """A finite JSON number in [low, high] ((low, high] with ``low_open``), or None when absent."""
    raw = data.get(name)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise MalformedMessage(f"field {name!r} must be a number, got {_type(raw)}", name)
    value = float(raw)
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise MalformedMessage(
            f"field {name!r} must be a number in {bracket}{low:g}, {high:g}], got {_shown(raw)}", name
        )
    return value


def boolean(data: Mapping[str, Any], name: str, default: bool = False) -> bool:
    raw = data.get(name, default)
    if raw is None:
        return default
    if not isinstance(raw, bool):
        raise MalformedMessage(f"field {name!r} must be true or false, got {_shown(raw)}", name)
    return raw


def instant(data: Mapping[str, Any], name: str) -> datetime:
    """A required instant (aware, UTC) within [INSTANT_MIN, INSTANT_MAX]."""
    value = optional_instant(data, name)
    if value is None:
        raise MalformedMessage(f"field {name!r} is required (an ISO-8601 instant)", name)
    return value


def optional_instant(data: Mapping[str, Any], name: str) -> datetime | None:
    raw = data.get(name)
    if raw is None:
        return None
    return parse_instant(raw, name)


def parse_instant(raw: object, name: str) -> datetime:
    """ISO-8601 text with an offset (or Z) → an aware UTC datetime in range, or MalformedMessage."""
    if not isinstance(raw, str) or len(raw) > _MAX_INSTANT_TEXT:
        raise MalformedMessage(f"field {name!r} must be an ISO-8601 string, got {_shown(raw)}", name)
    value = _utc_instant(raw)
    if isinstance(value, datetime):
        return value
    raise MalformedMessage(value.format(name=repr(name), raw=_shown(raw)), name)


@functools.lru_cache(maxsize=4096)
def _utc_instant(raw: str) -> datetime | str:
    """The aware UTC instant ``raw`` names, or why it names none (a message to format with the field's name
    and the text). Memoized: a burst's messages and attempt events repeat a few instants (every occurrence of
    an hour-top has the same scheduled_for), and the parse is ~1 µs; datetimes are immutable, so sharing one
    is safe, and hostile text only churns the bounded cache."""
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return "field {name} is not an ISO-8601 instant: {raw}"
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        return "field {name} has no UTC offset: {raw}"
    try:
        value = parsed.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is before the year 1 in UTC
        return "field {name} is outside the supported range: {raw}"
    if not INSTANT_MIN <= value <= INSTANT_MAX:
        return f"field {{name}} must lie from {INSTANT_MIN.year} to {INSTANT_MAX.year} (UTC), got {{raw}}"
    return value


def json_value(data: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """Any JSON value (absent → ``default``) without NUL in its strings and keys, nested at most MAX_JSON_DEPTH."""
    raw = data.get(name, default)
    problem = json_problem(raw)
    if problem is not None:
        raise MalformedMessage(f"field {name!r} {problem}", name)
    return raw


#: JSON nesting accepted in payloads (orjson encodes at most 254 levels; nobody needs 64).
MAX_JSON_DEPTH = 64


def json_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """What makes a JSON value unstorable — a NUL in a string or key (PostgreSQL refuses it), or nesting
    deeper than ``max_depth`` — with where it is (``["a"][2]``); None if nothing."""
    if _storable(value, max_depth):
        return None  # the common case, decided without a path string per value (every payload passes here)
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return f"contains a NUL character at {path or '(the value)'}"
        elif isinstance(item, (dict, list)):
            if depth >= max_depth:
                return f"nests deeper than {max_depth} levels at {path or '(the value)'}"
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str) and "\x00" in key:
                        return f"contains a NUL character in the key {path}[{key[:30]!r}]"
                    stack.append((child, f"{path}[{str(key)[:30]!r}]", depth + 1))
            else:
                stack.extend((child, f"{path}[{index}]", depth + 1) for index, child in enumerate(item))
    return None


def _storable(value: Any, max_depth: int) -> bool:
    """Whether :func:`json_problem` finds nothing: the same walk, without the paths."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return False
        elif isinstance(item, dict):
            if depth >= max_depth:
                return False
            for key, child in item.items():
                if isinstance(key, str) and "\x00" in key:
                    return False
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            if depth >= max_depth:
                return False
            stack.extend((child, depth + 1) for child in item)
    return True


def header(headers: Headers, name: str) -> bytes | None:
    """The last value of header ``name`` as bytes, or None when absent or null (Kafka allows both)."""
    found: bytes | None = None
    try:
        for item in headers or ():
            key, value = item
            if key == name:
                found = bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else None
    except (TypeError, ValueError):
        raise MalformedMessage("the record headers are not (key, value) pairs", "headers") from None
    return found


def header_text(headers: Headers, name: str, max_length: int = MAX_NAME) -> str | None:
    """Header ``name`` as ASCII text (None when absent or null), or MalformedMessage if it is not."""
    raw = header(headers, name)
    if raw is None:
        return None
    if len(raw) > max_length:
        raise MalformedMessage(f"header {name!r} is {len(raw)} bytes long; the limit is {max_length}", name)
    try:
        value = raw.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedMessage(f"header {name!r} is not ASCII text", name) from None
    if "\x00" in value:
        raise MalformedMessage(f"header {name!r} contains a NUL character", name)
    return value


def _type(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _shown(value: object) -> str:
    """A short, safe rendering of a rejected value for an error message."""
    if isinstance(value, str):
        return repr(value[:60])
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int) and not isinstance(value, bool):
        # repr() of an int beyond 4,300 digits raises ValueError: never render a huge one.
        return repr(value) if abs(value) < 10**30 else "an integer of more than 30 digits"
    return _type(value)

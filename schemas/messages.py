"""Messages on Kafka: the occurrence message and the schedule state message.

The occurrence message, version 1.

Encoded with orjson as a JSON object::

    {"format": 1,
     "occurrence_id": "uuid", "schedule_id": "uuid", "schedule_version": 1,
     "tenant_id": "acme", "target": "billing.invoice",
     "scheduled_for": "2026-11-29T10:00:00Z", "available_at": "2026-11-29T10:00:00Z",
     "attempt": 1, "priority": "strict", "deadline": null, "payload": {...}}

Instants are UTC ISO-8601 with a ``Z``. ``attempt`` is the delivery the engine
intends (1 for the first, n for the n-th retry); duplicates of one delivery
carry the same occurrence_id and attempt. Readers accept any message whose
``format`` they know and ignore unknown fields, so a producer may add fields
without a format bump; removing or changing one needs ``format`` 2.

The relay adds headers a router can act on without decoding the body
(``chronoq-occurrence-id``, ``chronoq-tenant``) and the W3C trace context
(``traceparent``) of its publish span.

The schedule state message (topic ``chronoq.schedule-states``, keyed by
schedule_id, compacted in production) announces each schedule version::

    {"format": 1, "schedule_id": "uuid", "tenant_id": "acme", "version": 2,
     "state": "active|paused|canceled|completed", "changed_at": "...Z"}

Consumers keep the latest per schedule and skip occurrences of older versions
or of canceled schedules.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from schemas.errors import ChronoqError

FORMAT_VERSION = 1
SUPPORTED_FORMATS = frozenset({1})

HEADER_FORMAT = "chronoq-format"
HEADER_OCCURRENCE_ID = "chronoq-occurrence-id"
HEADER_TENANT = "chronoq-tenant"


class MalformedMessage(ChronoqError):
    """A Kafka message that is not a decodable chronoq message (a poison message)."""


@dataclass(frozen=True)
class OccurrenceMessage:
    occurrence_id: uuid.UUID
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: str
    target: str
    scheduled_for: datetime
    available_at: datetime
    attempt: int = 1
    priority: str = "strict"
    deadline: datetime | None = None
    payload: Any = field(default_factory=dict)

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "format": FORMAT_VERSION,
                "occurrence_id": str(self.occurrence_id),
                "schedule_id": str(self.schedule_id),
                "schedule_version": self.schedule_version,
                "tenant_id": self.tenant_id,
                "target": self.target,
                "scheduled_for": format_instant(self.scheduled_for),
                "available_at": format_instant(self.available_at),
                "attempt": self.attempt,
                "priority": self.priority,
                "deadline": format_instant(self.deadline) if self.deadline else None,
                "payload": self.payload,
            }
        )


def format_instant(instant: datetime) -> str:
    """UTC ISO-8601 with a trailing Z (microseconds only when present)."""
    if instant.tzinfo is None:
        raise ValueError("instants on the wire must be timezone-aware")
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _instant(data: dict[str, Any], name: str, *, optional: bool = False) -> datetime | None:
    raw = data.get(name)
    if raw is None and optional:
        return None
    if not isinstance(raw, str):
        raise MalformedMessage(f"field {name!r} must be an ISO-8601 string, got {type(raw).__name__}")
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as err:
        raise MalformedMessage(f"field {name!r} is not an ISO-8601 instant: {raw[:60]!r}") from err
    if value.tzinfo is None:
        raise MalformedMessage(f"field {name!r} has no UTC offset: {raw[:60]!r}")
    return value.astimezone(UTC)


def _uuid(data: dict[str, Any], name: str) -> uuid.UUID:
    raw = data.get(name)
    try:
        return uuid.UUID(str(raw))
    except ValueError as err:
        raise MalformedMessage(f"field {name!r} is not a UUID: {str(raw)[:60]!r}") from err


def _text(data: dict[str, Any], name: str) -> str:
    raw = data.get(name)
    if not isinstance(raw, str) or not raw:
        raise MalformedMessage(f"field {name!r} must be a non-empty string")
    return raw


def _positive_int(data: dict[str, Any], name: str) -> int:
    raw = data.get(name)
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        raise MalformedMessage(f"field {name!r} must be a positive integer")
    return raw


def decode_json_object(value: bytes | None, kind: str = "message") -> dict[str, Any]:
    """The JSON object of a chronoq record (message, command, event) of a known format, or MalformedMessage."""
    if value is None:
        raise MalformedMessage(f"{kind} has no value (tombstone)")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as err:
        raise MalformedMessage(f"{kind} is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise MalformedMessage(f"{kind} is not a JSON object")
    fmt = data.get("format")
    if fmt not in SUPPORTED_FORMATS:
        raise MalformedMessage(f"unknown {kind} format {fmt!r}; this reader knows {sorted(SUPPORTED_FORMATS)}")
    return data


def decode_occurrence(value: bytes | None) -> OccurrenceMessage:
    """Decode an occurrence message or raise MalformedMessage saying what is wrong."""
    data = decode_json_object(value)
    return OccurrenceMessage(
        occurrence_id=_uuid(data, "occurrence_id"),
        schedule_id=_uuid(data, "schedule_id"),
        schedule_version=_positive_int(data, "schedule_version"),
        tenant_id=_text(data, "tenant_id"),
        target=_text(data, "target"),
        scheduled_for=_instant(data, "scheduled_for"),  # type: ignore[arg-type]
        available_at=_instant(data, "available_at"),  # type: ignore[arg-type]
        attempt=_positive_int(data, "attempt"),
        priority=_text(data, "priority"),
        deadline=_instant(data, "deadline", optional=True),
        payload=data.get("payload", {}),
    )


@dataclass(frozen=True)
class ScheduleStateMessage:
    schedule_id: uuid.UUID
    tenant_id: str
    version: int
    state: str
    changed_at: datetime

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "format": FORMAT_VERSION,
                "schedule_id": str(self.schedule_id),
                "tenant_id": self.tenant_id,
                "version": self.version,
                "state": self.state,
                "changed_at": format_instant(self.changed_at),
            }
        )

    @property
    def key(self) -> bytes:
        """Keyed by schedule so compaction keeps the latest state of each schedule."""
        return str(self.schedule_id).encode()


def decode_schedule_state(value: bytes | None) -> ScheduleStateMessage:
    """Decode a schedule state message or raise MalformedMessage."""
    data = decode_json_object(value)
    return ScheduleStateMessage(
        schedule_id=_uuid(data, "schedule_id"),
        tenant_id=_text(data, "tenant_id"),
        version=_positive_int(data, "version"),
        state=_text(data, "state"),
        changed_at=_instant(data, "changed_at"),  # type: ignore[arg-type]
    )

"""Messages on Kafka: the occurrence message and the schedule state message.

The occurrence message, version 1.

Encoded with orjson as a JSON object::

    {"format": 1,
     "occurrence_id": "uuid", "schedule_id": "uuid", "schedule_version": 1,
     "tenant_id": "acme", "target": "billing.invoice",
     "scheduled_for": "2026-11-29T10:00:00Z", "available_at": "2026-11-29T10:00:00Z",
     "attempt": 1, "priority": "strict", "deadline": null, "payload": {...},
     "binding_version": 3}

Instants are UTC ISO-8601 with a ``Z``. ``attempt`` is the delivery the engine
intends (1 for the first, n for the n-th retry); duplicates of one delivery
carry the same occurrence_id and attempt. Readers accept any message whose
``format`` they know and ignore unknown fields, so a producer may add fields
without a format bump; removing or changing one needs ``format`` 2.

``binding_version`` (added without a format bump; absent from older engines'
messages, and then the consumer checks as it did before) is the version of the
target's binding (``schemas/target_bindings.py``) the engine read in the
transaction that wrote the message: a version at which the tenant was bound,
whose binding message was committed no later than this one. A consumer app
whose view of the bindings is older than it is *behind*, not refusing
(``consumers/target_bindings.py``).

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

import functools
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from schemas import record_fields as fields
from schemas.errors import MalformedMessage
from schemas.frozen_records import quick_init

FORMAT_VERSION = 1
SUPPORTED_FORMATS = frozenset({1})

HEADER_FORMAT = "chronoq-format"
HEADER_OCCURRENCE_ID = "chronoq-occurrence-id"
HEADER_TENANT = "chronoq-tenant"

#: One Kafka record as the codecs encode it and the producers send it: key, value, headers.
Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


@quick_init
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
    binding_version: int | None = None

    def encode(self) -> bytes:
        # Written only when known, so a message without it reads (and re-encodes) as older engines wrote it.
        extra = {} if self.binding_version is None else {"binding_version": self.binding_version}
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
                **extra,
            }
        )


def format_instant(instant: datetime) -> str:
    """UTC ISO-8601 with a trailing Z (microseconds only when present)."""
    if instant.tzinfo is None:
        raise ValueError("instants on the wire must be timezone-aware")
    return _utc_text(instant)


@functools.lru_cache(maxsize=4096)
def _utc_text(instant: datetime) -> str:
    # Memoized: a burst's events and messages repeat a few instants (its scheduled_for); equal instants in
    # any zone are one key and one text, since the text is of the UTC instant.
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def decode_json_object(value: bytes | None, kind: str = "message") -> dict[str, Any]:
    """The JSON object of a chronoq record (message, command, event) of a known format, or MalformedMessage."""
    return fields.json_object(value, kind, SUPPORTED_FORMATS)


#: Occurrence message fields are limited like the engine's columns (see schemas/topics.py for targets).
MAX_TENANT_ID = 63
MAX_TARGET = 100
PRIORITIES = ("strict", "flexible")


def decode_occurrence(value: bytes | None, headers: fields.Headers = None) -> OccurrenceMessage:
    """Decode an occurrence record or raise MalformedMessage saying what is wrong (and nothing else).

    When the record carries the ``chronoq-tenant`` or ``chronoq-occurrence-id``
    header, it must agree with the body: a router acting on headers and a
    handler acting on the body must never disagree about whose record it is.
    """
    message = occurrence_from_object(decode_json_object(value))
    tenant = fields.header_text(headers, HEADER_TENANT, MAX_TENANT_ID)
    if tenant is not None and tenant != message.tenant_id:
        raise MalformedMessage(
            f"header {HEADER_TENANT!r} says {tenant!r} but the body's tenant_id is {message.tenant_id!r}", HEADER_TENANT
        )
    occurrence = fields.header_text(headers, HEADER_OCCURRENCE_ID, 45)
    if occurrence is not None and occurrence != str(message.occurrence_id):
        raise MalformedMessage(
            f"header {HEADER_OCCURRENCE_ID!r} does not match the body's occurrence_id", HEADER_OCCURRENCE_ID
        )
    return message


def occurrence_from_object(data: dict[str, Any]) -> OccurrenceMessage:
    """An occurrence message from its decoded JSON object, or MalformedMessage."""
    return OccurrenceMessage(
        occurrence_id=fields.uuid_field(data, "occurrence_id"),
        schedule_id=fields.uuid_field(data, "schedule_id"),
        schedule_version=fields.integer(data, "schedule_version"),
        tenant_id=fields.text(data, "tenant_id", MAX_TENANT_ID),
        target=fields.text(data, "target", MAX_TARGET),
        scheduled_for=fields.instant(data, "scheduled_for"),
        available_at=fields.instant(data, "available_at"),
        attempt=fields.integer(data, "attempt"),
        priority=fields.choice(data, "priority", PRIORITIES, default="strict"),
        deadline=fields.optional_instant(data, "deadline"),
        payload=fields.json_value(data, "payload", {}),
        binding_version=optional_binding_version(data),
    )


def optional_binding_version(data: dict[str, Any]) -> int | None:
    """The message's ``binding_version``: None when absent or null (an older engine), else a version as
    targets.version holds it (1 up to PostgreSQL's integer), or MalformedMessage naming the field."""
    if data.get("binding_version") is None:
        return None
    return fields.integer(data, "binding_version")


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


SCHEDULE_STATES = ("active", "paused", "canceled", "completed")


def decode_schedule_state(value: bytes | None) -> ScheduleStateMessage:
    """Decode a schedule state message or raise MalformedMessage (and nothing else)."""
    data = decode_json_object(value, "schedule state")
    return ScheduleStateMessage(
        schedule_id=fields.uuid_field(data, "schedule_id"),
        tenant_id=fields.text(data, "tenant_id", MAX_TENANT_ID),
        version=fields.integer(data, "version"),
        state=fields.choice(data, "state", SCHEDULE_STATES),
        changed_at=fields.instant(data, "changed_at"),
    )

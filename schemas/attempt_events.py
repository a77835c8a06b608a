"""Attempt events: what a consumer runtime tells the engine about each delivery.

Topic ``chronoq.attempts``, keyed by occurrence_id so every event of one
occurrence lands on one partition and the engine reads them in the order they
were produced. Encoded with orjson as a JSON object, format 1::

    {"format": 1, "event": "started", "occurrence_id": "uuid", "attempt": 2,
     "lease_token": "uuid", "lease_ttl": 30.0, "consumer_group": "billing",
     "worker": "host:4242"}

Fields by event (unknown fields are ignored, as for every chronoq message):

========================  ==========================================================
``started``               lease_token (fresh, made by the consumer), lease_ttl (s)
                          claim_order (optional): the consumer database's id of the
                          transaction that inserted the dedupe row; a takeover of a
                          running lease needs a greater one than the current lease's
``heartbeat``             lease_token, lease_ttl: extend the lease to engine-now + ttl
``succeeded``             lease_token: the effect and the dedupe row are committed
``failed``                lease_token, error_class, error_message, permanent (bool)
``canceled``              reason (``stale_version``, ``schedule_canceled`` or
                          ``cooperative``); lease_token when an attempt had started
``already_applied``       applied_by: the lease token recorded with the consumer's
                          dedupe row (null if the row predates tokens)
========================  ==========================================================

Every event may carry ``scheduled_for``, the occurrence's scheduled instant from its message (optional;
added with the day-partitioned history, migration 0016): the engine then finds the occurrence in that day's
partition. Without it, or with a wrong one, the engine looks the occurrence up by id alone.

``attempt`` is the delivery number carried by the occurrence message
(``OccurrenceMessage.attempt``). Nothing here carries a worker's wall-clock
time: the engine judges leases by its own clock.

**Event groups (format 2).** A batch handler reports its ``started`` and outcome events (and the runtime
every heartbeat round) as groups: one record per partition holding up to :data:`MAX_GROUP_EVENTS` events,
each the object above without its ``format``::

    {"format": 2, "events": [{"event": "started", "occurrence_id": "uuid", ...}, ...]}

Every event of a group is one whose own key (its occurrence id) hashes to the partition the group is
produced to, so every event of one occurrence still lands on one partition in the order it was produced,
whether it went alone or in a group; the group's key is its first event's key. A group is signed as one
record and is undecodable as a whole if any of its events is (one poison record, nothing applied). Per
occurrence a group costs the engine and the runtime a list entry instead of a Kafka record, its headers,
its signature and its JSON document (docs/benchmarks.md, stop 50). An engine older than groups counts a
group record as poison: upgrade the engines before the consumer runtimes (docs/consumer-runtime.md).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from schemas import record_fields as fields
from schemas.errors import MalformedMessage
from schemas.frozen_records import quick_init
from schemas.messages import HEADER_FORMAT, HEADER_OCCURRENCE_ID, Record, decode_json_object, format_instant
from schemas.record_fields import MAX_NAME

FORMAT_VERSION = 1
_FORMAT_HEADER = str(FORMAT_VERSION).encode()
#: A record holding a list of events (see the module docstring).
GROUP_FORMAT = 2
_GROUP_FORMAT_HEADER = str(GROUP_FORMAT).encode()
_FORMATS = frozenset({FORMAT_VERSION, GROUP_FORMAT})
#: Events in one group record at most (a started event is ~300 bytes of JSON).
MAX_GROUP_EVENTS = 500
#: A group's value at most, in bytes: a quarter of the brokers' default largest record (1 MiB), whatever the
#: events carry (a failed event's error text alone may be 2,000 characters: 500 of them would not fit).
MAX_GROUP_BYTES = 256 * 1024

STARTED = "started"
HEARTBEAT = "heartbeat"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELED = "canceled"
ALREADY_APPLIED = "already_applied"
EVENT_KINDS = (STARTED, HEARTBEAT, SUCCEEDED, FAILED, CANCELED, ALREADY_APPLIED)

#: Why a delivery was skipped or abandoned as canceled.
CANCEL_REASONS = ("stale_version", "schedule_canceled", "cooperative")

#: Events that must name the attempt's lease token.
_NEEDS_TOKEN = frozenset({STARTED, HEARTBEAT, SUCCEEDED, FAILED})
MAX_ERROR_MESSAGE = 2000
MAX_ERROR_CLASS = 200


@quick_init
@dataclass(frozen=True)
class AttemptEvent:
    event: str
    occurrence_id: uuid.UUID
    attempt: int
    lease_token: uuid.UUID | None = None
    lease_ttl: float | None = None
    consumer_group: str | None = None
    worker: str | None = None
    error_class: str | None = None
    error_message: str | None = None
    permanent: bool = False
    reason: str | None = None
    applied_by: uuid.UUID | None = None
    #: ``started`` only: the consumer database's id of the transaction that inserted the dedupe row
    #: (``pg_current_xact_id()``, increasing): a takeover needs a later claim than the current lease's.
    claim_order: int | None = None
    #: The occurrence's scheduled instant (``OccurrenceMessage.scheduled_for``), optional: the engine finds
    #: the occurrence in that day's partition (migration 0016) instead of probing every day's.
    scheduled_for: datetime | None = None

    def __post_init__(self) -> None:
        if self.event not in EVENT_KINDS:
            raise MalformedMessage(f"unknown attempt event {self.event!r}; known: {', '.join(EVENT_KINDS)}")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 1:
            raise MalformedMessage("field 'attempt' must be a positive integer")
        if self.event in _NEEDS_TOKEN and self.lease_token is None:
            raise MalformedMessage(f"a {self.event} event needs a lease_token")
        if self.event in (STARTED, HEARTBEAT):
            if (
                isinstance(self.lease_ttl, bool)
                or not isinstance(self.lease_ttl, (int, float))
                or not 0 < self.lease_ttl <= 86400
            ):
                raise MalformedMessage("field 'lease_ttl' must be a number of seconds in (0, 86400]")
        if self.event == FAILED and not self.error_class:
            raise MalformedMessage("a failed event needs an error_class")
        if self.event == CANCELED and self.reason not in CANCEL_REASONS:
            raise MalformedMessage(f"a canceled event needs a reason: one of {', '.join(CANCEL_REASONS)}")

    # Constructors that read like the protocol.
    @classmethod
    def started(
        cls,
        occurrence_id: uuid.UUID,
        attempt: int,
        lease_token: uuid.UUID,
        lease_ttl: float,
        consumer_group: str | None = None,
        worker: str | None = None,
        claim_order: int | None = None,
        scheduled_for: datetime | None = None,
    ) -> AttemptEvent:
        return cls(
            STARTED,
            occurrence_id,
            attempt,
            lease_token,
            lease_ttl,
            _optional_printable(consumer_group),
            _optional_printable(worker),
            claim_order=claim_order,
            scheduled_for=scheduled_for,
        )

    @classmethod
    def heartbeat(
        cls,
        occurrence_id: uuid.UUID,
        attempt: int,
        lease_token: uuid.UUID,
        lease_ttl: float,
        scheduled_for: datetime | None = None,
    ) -> AttemptEvent:
        return cls(HEARTBEAT, occurrence_id, attempt, lease_token, lease_ttl, scheduled_for=scheduled_for)

    @classmethod
    def succeeded(
        cls, occurrence_id: uuid.UUID, attempt: int, lease_token: uuid.UUID, scheduled_for: datetime | None = None
    ) -> AttemptEvent:
        return cls(SUCCEEDED, occurrence_id, attempt, lease_token, scheduled_for=scheduled_for)

    @classmethod
    def failed(
        cls,
        occurrence_id: uuid.UUID,
        attempt: int,
        lease_token: uuid.UUID,
        error_class: str,
        error_message: str,
        permanent: bool = False,
        scheduled_for: datetime | None = None,
    ) -> AttemptEvent:
        # An exception's text may hold anything, NUL included; the wire (and the engine's
        # text columns) may not, so it is replaced rather than letting the event be rejected.
        return cls(
            FAILED,
            occurrence_id,
            attempt,
            lease_token,
            error_class=_printable(error_class)[:MAX_ERROR_CLASS],
            error_message=_printable(error_message)[:MAX_ERROR_MESSAGE],
            permanent=permanent,
            scheduled_for=scheduled_for,
        )

    @classmethod
    def canceled(
        cls,
        occurrence_id: uuid.UUID,
        attempt: int,
        reason: str,
        lease_token: uuid.UUID | None = None,
        consumer_group: str | None = None,
        scheduled_for: datetime | None = None,
    ) -> AttemptEvent:
        return cls(
            CANCELED,
            occurrence_id,
            attempt,
            lease_token,
            consumer_group=_optional_printable(consumer_group),
            reason=reason,
            scheduled_for=scheduled_for,
        )

    @classmethod
    def already_applied(
        cls,
        occurrence_id: uuid.UUID,
        attempt: int,
        applied_by: uuid.UUID | None,
        consumer_group: str | None = None,
        scheduled_for: datetime | None = None,
    ) -> AttemptEvent:
        return cls(
            ALREADY_APPLIED,
            occurrence_id,
            attempt,
            consumer_group=_optional_printable(consumer_group),
            applied_by=applied_by,
            scheduled_for=scheduled_for,
        )

    @functools.cached_property
    def key(self) -> bytes:
        """Keyed by occurrence: the events of one occurrence stay ordered on one partition."""
        return str(self.occurrence_id).encode()

    def headers(self) -> list[tuple[str, bytes]]:
        return [(HEADER_FORMAT, _FORMAT_HEADER), (HEADER_OCCURRENCE_ID, self.key)]

    def encode(self) -> bytes:
        """The event alone, as a format-1 record value."""
        # orjson writes uuid.UUID as its canonical string itself; other UUID types (asyncpg's) through str().
        return orjson.dumps({"format": FORMAT_VERSION, **self.fields()}, default=str)

    def fields(self) -> dict[str, Any]:
        """The event's JSON object without ``format``: a record of its own, or an entry of a group."""
        data: dict[str, Any] = {
            "event": self.event,
            "occurrence_id": self.occurrence_id,
            "attempt": self.attempt,
        }
        if self.lease_token is not None:
            data["lease_token"] = self.lease_token
        optional = {
            "lease_ttl": self.lease_ttl,
            "consumer_group": self.consumer_group,
            "worker": self.worker,
            "error_class": self.error_class,
            "error_message": self.error_message,
            "reason": self.reason,
        }
        data.update((name, value) for name, value in optional.items() if value is not None)
        if self.event == FAILED:
            data["permanent"] = self.permanent
        if self.applied_by is not None:
            data["applied_by"] = self.applied_by
        if self.claim_order is not None:
            data["claim_order"] = self.claim_order
        if self.scheduled_for is not None:
            data["scheduled_for"] = format_instant(self.scheduled_for)
        return data


def encode_group(events: Sequence[AttemptEvent]) -> Record:
    """One group record (key, value, headers) of 1 to :data:`MAX_GROUP_EVENTS` events, in order.

    The caller keeps the partition rule: every event's own key must hash to the partition the group goes to
    (``consumers.attempt_reports`` groups by that partition)."""
    if not 0 < len(events) <= MAX_GROUP_EVENTS:
        raise ValueError(f"a group holds 1 to {MAX_GROUP_EVENTS} events, not {len(events)}")
    value = orjson.dumps({"format": GROUP_FORMAT, "events": [event.fields() for event in events]}, default=str)
    return events[0].key, value, [(HEADER_FORMAT, _GROUP_FORMAT_HEADER)]


def encode_groups(events: Sequence[AttemptEvent]) -> Iterator[Record]:
    """``events`` as group records, in order: each of at most :data:`MAX_GROUP_EVENTS` events and, unless it
    holds a single event, at most :data:`MAX_GROUP_BYTES` (a group over it is split in halves; one event is
    at most a few kilobytes). Same partition rule as :func:`encode_group`."""
    for start in range(0, len(events), MAX_GROUP_EVENTS):
        yield from _within_bytes(events[start : start + MAX_GROUP_EVENTS])


def _within_bytes(events: Sequence[AttemptEvent]) -> Iterator[Record]:
    record = encode_group(events)
    if len(record[1]) <= MAX_GROUP_BYTES or len(events) == 1:
        yield record
        return
    half = len(events) // 2
    yield from _within_bytes(events[:half])
    yield from _within_bytes(events[half:])


def _printable(text: str) -> str:
    """Text the wire (and the engine's text columns) can carry: NUL replaced, never rejected."""
    return text.replace("\x00", "\ufffd")


def _optional_printable(text: str | None) -> str | None:
    return None if text is None else _printable(text)[:MAX_CONSUMER_GROUP]


MAX_CONSUMER_GROUP = 255
MAX_WORKER = 255
MAX_CLAIM_ORDER = 2**63 - 1  # a bigint column; PostgreSQL's 64-bit transaction ids stay far below it


def decode_attempt_event(value: bytes | None) -> AttemptEvent:
    """Decode a single (format 1) attempt event or raise MalformedMessage saying what is wrong (and nothing else)."""
    return _event_from_object(decode_json_object(value, "attempt event"))


class AttemptRecord(NamedTuple):
    """What one record of the attempts topic holds: its events in order, and whether it was a group."""

    events: list[AttemptEvent]
    grouped: bool


def decode_attempt_record(value: bytes | None) -> AttemptRecord:
    """The events of an attempts-topic record, in order: one for a single event (format 1), the group's for a
    group (format 2). MalformedMessage saying what is wrong if the record, or any event of a group, is not
    well formed: a group is applied whole or not at all."""
    data = fields.json_object(value, "attempt event", _FORMATS)
    if data["format"] == FORMAT_VERSION:
        return AttemptRecord([_event_from_object(data)], grouped=False)
    events = fields.entries(data, "events", MAX_GROUP_EVENTS, _event_from_object)
    return AttemptRecord(events, grouped=True)


def _event_from_object(data: dict[str, Any]) -> AttemptEvent:
    event = data.get("event")
    if not isinstance(event, str) or event not in EVENT_KINDS:
        shown = repr(event[:40]) if isinstance(event, str) else type(event).__name__
        raise MalformedMessage(f"unknown attempt event {shown}; known: {', '.join(EVENT_KINDS)}", "event")
    return AttemptEvent(
        event=event,
        # The engine reads these ids (never user code): quick to parse, hash and sort (record_fields).
        occurrence_id=fields.uuid_field(data, "occurrence_id", internal=True),
        attempt=fields.integer(data, "attempt"),
        lease_token=fields.optional_uuid(data, "lease_token", internal=True),
        lease_ttl=fields.number(data, "lease_ttl", 0, 86400, low_open=True),
        consumer_group=fields.optional_text(data, "consumer_group", MAX_CONSUMER_GROUP),
        worker=fields.optional_text(data, "worker", MAX_WORKER),
        error_class=fields.optional_text(data, "error_class", MAX_ERROR_CLASS),
        error_message=fields.optional_text(data, "error_message", MAX_ERROR_MESSAGE),
        permanent=fields.boolean(data, "permanent"),
        reason=fields.optional_text(data, "reason", MAX_NAME),
        applied_by=fields.optional_uuid(data, "applied_by", internal=True),
        claim_order=(
            fields.integer(data, "claim_order", 1, MAX_CLAIM_ORDER) if data.get("claim_order") is not None else None
        ),
        scheduled_for=fields.optional_instant(data, "scheduled_for"),
    )

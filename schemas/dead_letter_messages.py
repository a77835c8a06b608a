"""The dead-letter message of an occurrence that went DEAD.

Topic ``chronoq.dead-letters`` carries two kinds of record:

* **poison messages** a consumer could not decode: the original key, value and
  headers byte for byte, plus ``chronoq-dlq-*`` headers saying where they came
  from and why (``consumers/dead_letters.py``);
* **dead occurrences**, written by the engine through the outbox when an
  occurrence reaches DEAD, keyed by occurrence_id, encoded with orjson::

    {"format": 1, "kind": "dead_occurrence", "occurrence_id": "uuid",
     "schedule_id": "uuid", "schedule_version": 1, "tenant_id": "acme",
     "target": "billing.invoice", "scheduled_for": "...Z", "attempts": 3,
     "reason": "max_attempts|permanent_error|deadline|retry_budget",
     "error_class": "TimeoutError", "error_message": "...",
     "died_at": "...Z", "occurrence": {... the occurrence message ...}}

A reader tells them apart by ``kind`` (poison records have a
``chronoq-dlq-reason`` header instead). Replaying a dead occurrence (``chronoq
dlq replay``) re-enqueues the same occurrence_id through the engine; this
record stays in the topic as history.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import orjson

from schemas import record_fields as fields
from schemas.errors import MalformedMessage
from schemas.messages import OccurrenceMessage, format_instant, occurrence_from_object

KIND_DEAD_OCCURRENCE = "dead_occurrence"
DEAD_REASONS = ("permanent_error", "max_attempts", "deadline", "retry_budget", "unpublishable")


@dataclass(frozen=True)
class DeadOccurrenceMessage:
    occurrence: OccurrenceMessage
    attempts: int
    reason: str
    error_class: str | None
    error_message: str | None
    died_at: datetime

    @property
    def key(self) -> bytes:
        return str(self.occurrence.occurrence_id).encode()

    def encode(self) -> bytes:
        occ = self.occurrence
        return orjson.dumps(
            {
                "format": 1,
                "kind": KIND_DEAD_OCCURRENCE,
                "occurrence_id": str(occ.occurrence_id),
                "schedule_id": str(occ.schedule_id),
                "schedule_version": occ.schedule_version,
                "tenant_id": occ.tenant_id,
                "target": occ.target,
                "scheduled_for": format_instant(occ.scheduled_for),
                "attempts": self.attempts,
                "reason": self.reason,
                "error_class": self.error_class,
                "error_message": self.error_message,
                "died_at": format_instant(self.died_at),
                "occurrence": orjson.loads(occ.encode()),
            }
        )


def decode_dead_occurrence(value: bytes | None) -> DeadOccurrenceMessage:
    """Decode a dead-occurrence record or raise MalformedMessage (e.g. for a poison record), nothing else."""
    data = fields.json_object(value, "dead-occurrence record")
    if data.get("kind") != KIND_DEAD_OCCURRENCE:
        raise MalformedMessage("not a dead-occurrence record (no kind=dead_occurrence)", "kind")
    occurrence = data.get("occurrence")
    if not isinstance(occurrence, dict):
        raise MalformedMessage("field 'occurrence' must be the occurrence message (an object)", "occurrence")
    return DeadOccurrenceMessage(
        occurrence=occurrence_from_object(occurrence),
        attempts=fields.integer(data, "attempts", minimum=0),
        reason=fields.text(data, "reason"),
        error_class=fields.optional_text(data, "error_class"),
        error_message=fields.optional_text(data, "error_message", 4000),
        died_at=fields.instant(data, "died_at"),
    )


def occurrence_id_of(value: bytes | None) -> uuid.UUID | None:
    """The occurrence a dead-letter record is about, if it is a dead-occurrence record."""
    try:
        return decode_dead_occurrence(value).occurrence.occurrence_id
    except MalformedMessage:
        return None

"""What a handler receives: one occurrence, as delivered."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from schemas.messages import OccurrenceMessage


@dataclass(frozen=True)
class Occurrence:
    """One scheduled time of one schedule, delivered to a handler.

    ``occurrence_id`` is stable across redeliveries, relay retries and DLQ
    replays: use it as the idempotency key of any effect outside the database
    transaction the runtime hands you.
    """

    occurrence_id: uuid.UUID
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: str
    target: str
    scheduled_for: datetime
    available_at: datetime
    attempt: int
    priority: str
    deadline: datetime | None
    payload: Any
    received_at: datetime

    @classmethod
    def from_message(cls, message: OccurrenceMessage, received_at: datetime) -> "Occurrence":
        return cls(
            occurrence_id=message.occurrence_id, schedule_id=message.schedule_id,
            schedule_version=message.schedule_version, tenant_id=message.tenant_id, target=message.target,
            scheduled_for=message.scheduled_for, available_at=message.available_at, attempt=message.attempt,
            priority=message.priority, deadline=message.deadline, payload=message.payload,
            received_at=received_at,
        )

"""What a handler receives: one occurrence, as delivered, with its cancellation signal."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from consumers.errors import OccurrenceCanceled
from schemas.frozen_records import quick_init
from schemas.messages import OccurrenceMessage


class Cancellation:
    """A cooperative cancellation signal for one running handler.

    The runtime sets it when the occurrence's schedule is canceled while the
    handler runs. The handler decides what to do: check ``is_canceled``,
    ``await wait()``, or call ``raise_if_canceled()`` between steps. If the
    handler then raises (anything), its transaction rolls back and the
    occurrence is reported CANCELED instead of failed; if it returns, its
    effect commits as usual.
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self._canceled = False
        # Made only when a handler waits: a batch of thousands of occurrences seldom does, and an
        # asyncio.Event per occurrence was 3 % of a consumer app's CPU in a burst.
        self._event: asyncio.Event | None = None

    def cancel(self, reason: str) -> None:
        if not self._canceled:
            self._canceled = True
            self.reason = reason
            if self._event is not None:
                self._event.set()

    @property
    def is_canceled(self) -> bool:
        return self._canceled

    async def wait(self) -> str | None:
        if not self._canceled:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        return self.reason

    def raise_if_canceled(self) -> None:
        if self._canceled:
            raise OccurrenceCanceled(f"the occurrence's schedule was canceled ({self.reason})")


@quick_init
@dataclass(frozen=True)
class Occurrence:
    """One scheduled time of one schedule, delivered to a handler.

    ``occurrence_id`` is stable across redeliveries, retries, relay retries and
    DLQ replays: use it as the idempotency key of any effect outside the
    database transaction the runtime hands you. ``attempt`` is the delivery
    number (1 for the first, n for the n-th retry); ``lease_token`` identifies
    this attempt (fresh for every attempt).
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
    lease_token: uuid.UUID | None = None
    cancellation: Cancellation = field(default_factory=Cancellation, compare=False, repr=False)

    @classmethod
    def from_message(
        cls,
        message: OccurrenceMessage,
        received_at: datetime,
        lease_token: uuid.UUID | None = None,
        cancellation: Cancellation | None = None,
    ) -> Occurrence:
        return cls(
            occurrence_id=message.occurrence_id,
            schedule_id=message.schedule_id,
            schedule_version=message.schedule_version,
            tenant_id=message.tenant_id,
            target=message.target,
            scheduled_for=message.scheduled_for,
            available_at=message.available_at,
            attempt=message.attempt,
            priority=message.priority,
            deadline=message.deadline,
            payload=message.payload,
            received_at=received_at,
            lease_token=lease_token,
            cancellation=cancellation or Cancellation(),
        )

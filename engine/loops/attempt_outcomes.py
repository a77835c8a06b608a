"""What an attempt's end leads to: the attempt closed, and the occurrence finished, retried or dead.

Shared by the attempt ledger (attempt events from consumers) and the reaper
(expired leases), always inside the caller's transaction with the occurrence
locked (:func:`lock_occurrence`):

* :meth:`AttemptOutcomes.conclude_failure` after a failed or timed-out
  attempt asks ``engine.rules.retry_policy``: a retry becomes RETRY_WAIT plus
  a new outbox row (same occurrence_id, attempt + 1, due at now + backoff),
  spending one of the tenant's retries; no retry left becomes DEAD plus a
  dead-letter outbox row; an occurrence whose schedule changed meanwhile
  becomes CANCELED;
* :meth:`AttemptOutcomes.finish` moves an occurrence to a final state and
  discards its pending deliveries;
* :meth:`AttemptOutcomes.finish_attempt` closes an attempt with its result.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg
from opentelemetry import metrics

from engine.control.quotas import DEFAULT_RETRY_BUDGET
from engine.control.targets import binding_versions
from engine.records import LockedOccurrence
from engine.rules.attempt_decisions import Failure
from engine.rules.occurrence_states import Event, State, transition
from engine.rules.retry_policy import RetryDecision, decide_retry, spend_budget
from schemas import observability as obs
from schemas.clock import Clock
from schemas.dead_letter_messages import DeadOccurrenceMessage
from schemas.messages import MalformedMessage, OccurrenceMessage, decode_occurrence
from schemas.queries import QUERIES
from schemas.topics import DEAD_LETTER_TOPIC, occurrence_topic, schedule_key

if TYPE_CHECKING:
    from engine.rules.attempt_decisions import Verdict

log = logging.getLogger("chronoq.attempts")

LEASE_EXPIRED = "LeaseExpired"


@dataclass
class AttemptStats:
    """Counts since start, by verdict and outcome (tests and ``chronoq`` status read them)."""

    verdicts: dict[str, int] = field(default_factory=dict)
    fenced_tokens: list[uuid.UUID] = field(default_factory=list)  # the last few, for diagnosis
    retries: int = 0
    dead: int = 0
    poison: int = 0

    def count(self, verdict: Verdict, n: int = 1) -> None:
        self.verdicts[verdict.value] = self.verdicts.get(verdict.value, 0) + n

    def __getitem__(self, verdict: Verdict) -> int:
        return self.verdicts.get(verdict.value, 0)


class AttemptMetrics:
    """The instruments the attempt processor and the reaper share."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.attempts = meter.create_counter(obs.ATTEMPTS, unit="1", description="finished attempts by result")
        self.retries = meter.create_counter(obs.RETRIES, unit="1")
        self.dead = meter.create_counter(obs.DEAD_LETTERS, unit="1")
        self.fenced = meter.create_counter(obs.FENCED_EVENTS, unit="1")
        self.foreign_group = meter.create_counter(
            obs.FOREIGN_GROUP_EVENTS, unit="1", description="attempt events of an observing group: ignored"
        )
        self.lease_timeouts = meter.create_counter(obs.LEASE_TIMEOUTS, unit="1")
        self.poison = meter.create_counter(obs.POISON_MESSAGES, unit="1")
        self.rejected = meter.create_counter(
            obs.ATTEMPT_EVENTS_REJECTED, unit="1", description="attempt events not authenticated: not applied"
        )
        self.batch = meter.create_histogram(
            obs.ATTEMPT_EVENT_BATCH, unit="1", description="attempt events applied per transaction"
        )


async def lock_occurrence(conn: asyncpg.Connection, occurrence_id: uuid.UUID) -> LockedOccurrence | None:
    """Lock an occurrence for an attempt decision (None if there is no such occurrence)."""
    row = await conn.fetchrow(
        *QUERIES.lock_occurrence(occurrence_id=occurrence_id, default_retry_budget=DEFAULT_RETRY_BUDGET)
    )
    return LockedOccurrence.from_row(row) if row is not None else None


class AttemptOutcomes:
    """The end of attempts and occurrences, inside a caller's transaction (see the module docstring)."""

    def __init__(self, clock: Clock, rng: random.Random, meters: AttemptMetrics, stats: AttemptStats) -> None:
        self.clock = clock
        self.rng = rng
        self.meters = meters
        self.stats = stats

    async def conclude_failure(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, failure: Failure, now: datetime
    ) -> State:
        """After a failed or timed-out attempt: retry (RETRY_WAIT + outbox row), DEAD, or CANCELED."""
        if occ.obsolete:
            # Its schedule changed meanwhile: consumers would skip the retry anyway.
            await self.finish(conn, occ, Event.CANCEL, now, failure)
            return State.CANCELED
        original = await original_message(conn, occ)
        decision = decide_retry(
            occ.retry_policy, occ.counted_attempts, failure.permanent, now, original.deadline, self.rng.random
        )
        if decision.retry:
            granted = await conn.fetchval(
                *QUERIES.spend_retry_budget(tenant_id=occ.tenant_id, per_hour=occ.retry_budget_per_hour, now=now)
            )
            decision = spend_budget(decision, granted is not None)
        if decision.retry:
            await self._schedule_retry(conn, occ, original, decision, failure, now)
            return State.RETRY_WAIT
        await self._dead_letter(conn, occ, original, decision, failure, now)
        return State.DEAD

    async def _schedule_retry(
        self,
        conn: asyncpg.Connection,
        occ: LockedOccurrence,
        original: OccurrenceMessage,
        decision: RetryDecision,
        failure: Failure,
        now: datetime,
    ) -> None:
        transition(occ.state, Event.RETRY)
        due = now + decision.delay
        message = dataclasses.replace(original, attempt=occ.attempt_count + 1, available_at=due)
        await conn.execute(
            *QUERIES.insert_outbox_row(
                occurrence_id=occ.occurrence_id,
                tenant_id=occ.tenant_id,
                topic=occurrence_topic(occ.target),
                message_key=schedule_key(occ.schedule_id),
                message=message.encode(),
                due=due,
                now=now,
            )
        )
        await conn.execute(
            *QUERIES.wait_for_retry(
                occurrence_id=occ.occurrence_id,
                scheduled_for=occ.scheduled_for,
                error_class=failure.error_class,
                error_message=failure.error_message,
                now=now,
            )
        )
        self.stats.retries += 1
        self.meters.retries.add(1)
        log.info(
            "retry scheduled",
            extra=ids_of(
                occ,
                action="occurrence.retry",
                attempt=message.attempt,
                delay_s=round(decision.delay.total_seconds(), 3),
                error_class=failure.error_class,
            ),
        )

    async def _dead_letter(
        self,
        conn: asyncpg.Connection,
        occ: LockedOccurrence,
        original: OccurrenceMessage,
        decision: RetryDecision,
        failure: Failure,
        now: datetime,
    ) -> None:
        record = DeadOccurrenceMessage(
            original,
            occ.attempt_count,
            decision.dead_reason or "max_attempts",
            failure.error_class,
            failure.error_message,
            now,
        )
        await conn.execute(
            *QUERIES.insert_outbox_row(
                occurrence_id=occ.occurrence_id,
                tenant_id=occ.tenant_id,
                topic=DEAD_LETTER_TOPIC,
                message_key=record.key,
                message=record.encode(),
                due=now,
                now=now,
            )
        )
        await self.finish(conn, occ, Event.DIE, now, failure, decision.dead_reason)
        self.stats.dead += 1
        self.meters.dead.add(1, {"reason": record.reason})
        log.warning(
            "occurrence is dead",
            extra=ids_of(
                occ,
                action="occurrence.dead",
                reason=record.reason,
                attempts=occ.attempt_count,
                error_class=failure.error_class,
            ),
        )

    async def finish(
        self,
        conn: asyncpg.Connection,
        occ: LockedOccurrence,
        event: Event,
        now: datetime,
        failure: Failure | None = None,
        dead_reason: str | None = None,
    ) -> None:
        final = transition(occ.state, event)
        await conn.execute(
            *QUERIES.finish_occurrence(
                occurrence_id=occ.occurrence_id,
                scheduled_for=occ.scheduled_for,
                state=final.value,
                error_class=failure.error_class if failure else None,
                error_message=failure.error_message if failure else None,
                dead_reason=dead_reason,
                now=now,
            )
        )
        await conn.execute(
            *QUERIES.discard_pending_deliveries(
                occurrence_id=occ.occurrence_id, topic=occurrence_topic(occ.target), now=now
            )
        )
        if final is not State.DEAD:  # DEAD is logged with its reason by _dead_letter
            log.info(
                "occurrence finished", extra=ids_of(occ, action=f"occurrence.{final.value.lower()}", event=event.value)
            )

    async def finish_attempt(
        self,
        conn: asyncpg.Connection,
        occ: LockedOccurrence,
        token: uuid.UUID | None,
        result: str,
        now: datetime,
        failure: Failure | None = None,
    ) -> None:
        """Close attempt ``token`` of the locked occurrence ``occ`` (in its day partition) with ``result``."""
        if token is None:
            return
        closed = await conn.fetchrow(
            *QUERIES.finish_attempt(
                lease_token=token,
                scheduled_for=occ.scheduled_for,
                result=result,
                error_class=failure.error_class if failure else None,
                error_message=failure.error_message if failure else None,
                permanent=failure.permanent if failure else None,
                now=now,
            )
        )
        if closed is not None:
            self.meters.attempts.add(1, {"result": result})


async def original_message(conn: asyncpg.Connection, occ: LockedOccurrence) -> OccurrenceMessage:
    """The occurrence message as published (retries and replays resend it).

    The latest copy in the outbox if there is one; otherwise (a first delivery through the ahead lane,
    whose row the settle pass deleted, or an undecodable copy) rebuilt from the occurrence and its
    schedule, which carry every field of the message, and the target's binding version now (the copy keeps
    the one it was first written with: either is a version the tenant is bound under).
    """
    raw = await conn.fetchval(
        *QUERIES.latest_occurrence_message(occurrence_id=occ.occurrence_id, topic=occurrence_topic(occ.target))
    )
    if raw:
        try:
            return decode_occurrence(raw)
        except MalformedMessage:
            log.error(
                "stored occurrence message is undecodable; rebuilding it",
                extra=ids_of(occ, action="attempt.message_rebuilt"),
            )
    deadline = occ.deadline
    bound = (await binding_versions(conn, [occ.target])).get(occ.target)
    return OccurrenceMessage(
        occurrence_id=occ.occurrence_id,
        schedule_id=occ.schedule_id,
        schedule_version=occ.schedule_version,
        tenant_id=occ.tenant_id,
        target=occ.target,
        scheduled_for=occ.scheduled_for,
        available_at=occ.scheduled_for,
        attempt=max(occ.attempt_count, 1),
        priority=occ.priority,
        deadline=occ.scheduled_for + deadline if deadline else None,
        payload=occ.payload,
        binding_version=bound,
    )


def ids_of(occ: LockedOccurrence, **extra: Any) -> dict[str, Any]:
    return {
        "occurrence_id": str(occ.occurrence_id),
        "schedule_id": str(occ.schedule_id),
        "tenant_id": occ.tenant_id,
        **extra,
    }

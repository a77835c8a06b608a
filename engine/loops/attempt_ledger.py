"""The engine side of attempts: consume attempt events, move occurrence and attempt state.

Consumer runtimes report every delivery on ``chronoq.attempts`` (see
``schemas/attempt_events.py``); this processor applies each event to the
occurrence under a row lock, following ``engine.rules.occurrence_states``:

* ``started`` opens an attempt with the consumer's fresh lease token and makes
  it current (ENQUEUED → RUNNING). It is accepted for the next delivery
  (``attempt == attempt_count + 1``) of an occurrence not yet running, or — a
  **takeover** — for the same delivery of a RUNNING occurrence under another
  token: the redelivery reached a new partition owner after the old one
  crashed before committing its offset. Consumers send ``started`` only after
  they inserted the dedupe row, and that row's lock is exclusive, so the
  newest start of a delivery is the only worker that can still apply it; the
  previous attempt is closed as ``fenced``. A ``started`` for an older
  delivery (the reaper or a failure already moved on) is rejected.
* ``heartbeat`` / ``succeeded`` / ``failed`` / ``canceled`` with a token are
  accepted only for the **current** lease token. Any other token is fenced:
  rejected, counted (``chronoq.fenced_attempt_events``) and logged with
  ``action=attempt.fenced``. An exact repeat of an outcome already recorded
  for that token (Kafka redelivered the event) is a harmless duplicate.
* ``failed`` asks ``engine.rules.retry_policy``: a retry becomes RETRY_WAIT plus a
  new outbox row (same occurrence_id, attempt + 1, due at now + backoff); no
  retry left becomes DEAD plus a dead-letter outbox row.
* ``canceled`` without a token (a consumer skipped a delivery of an older
  version or a canceled schedule) is accepted only if the engine agrees the
  version is obsolete; an occurrence that is already CANCELED stays so.
* ``already_applied`` (the consumer found the dedupe row) is a fact: any
  unfinished or DEAD occurrence becomes SUCCEEDED.

Everything an event changes — occurrence, attempt, outbox rows, the tenant's
retry budget — is written in one transaction; the Kafka offset is committed
after it, so a crash in between re-applies events, which are idempotent.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

import asyncpg
from opentelemetry import metrics

from engine.control.quotas import DEFAULT_RETRY_BUDGET
from engine.rules.occurrence_states import Event, State, allowed, transition
from engine.records import Attempt, LockedOccurrence
from engine.rules.retry_policy import RetryDecision, decide_retry, spend_budget
from schemas import attempt_events as events
from schemas import observability as obs
from schemas.attempt_events import AttemptEvent
from schemas.clock import Clock
from schemas.dead_letter_messages import DeadOccurrenceMessage
from schemas.messages import MalformedMessage, OccurrenceMessage, decode_occurrence
from schemas.queries import QUERIES
from schemas.topics import DEAD_LETTER_TOPIC, occurrence_topic, partition_key

log = logging.getLogger("chronoq.attempts")

LEASE_EXPIRED = "LeaseExpired"


class Verdict(str, Enum):
    ACCEPTED = "accepted"  # the event changed state
    DUPLICATE = "duplicate"  # the same outcome was already recorded (Kafka redelivered the event)
    FENCED = "fenced"  # the lease token is not the current one: rejected
    IGNORED = "ignored"  # nothing to do (e.g. the occurrence is already CANCELED)
    UNKNOWN = "unknown"  # no such occurrence


@dataclass
class AttemptStats:
    """Counts since start, by verdict and outcome (tests and ``chronoq`` status read them)."""

    verdicts: dict[str, int] = field(default_factory=dict)
    fenced_tokens: list[uuid.UUID] = field(default_factory=list)  # the last few, for diagnosis
    retries: int = 0
    dead: int = 0
    poison: int = 0

    def count(self, verdict: Verdict) -> None:
        self.verdicts[verdict.value] = self.verdicts.get(verdict.value, 0) + 1

    def __getitem__(self, verdict: Verdict) -> int:
        return self.verdicts.get(verdict.value, 0)


class AttemptMetrics:
    """The instruments the attempt processor and the reaper share."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.attempts = meter.create_counter(obs.ATTEMPTS, unit="1", description="finished attempts by result")
        self.retries = meter.create_counter(obs.RETRIES, unit="1")
        self.dead = meter.create_counter(obs.DEAD_LETTERS, unit="1")
        self.fenced = meter.create_counter(obs.FENCED_EVENTS, unit="1")
        self.lease_timeouts = meter.create_counter(obs.LEASE_TIMEOUTS, unit="1")
        self.poison = meter.create_counter(obs.POISON_MESSAGES, unit="1")


@dataclass(frozen=True)
class Failure:
    error_class: str
    error_message: str
    permanent: bool = False


async def lock_occurrence(conn: asyncpg.Connection, occurrence_id: uuid.UUID) -> LockedOccurrence | None:
    """Lock an occurrence for an attempt decision (None if there is no such occurrence)."""
    row = await conn.fetchrow(
        *QUERIES.lock_occurrence(occurrence_id=occurrence_id, default_retry_budget=DEFAULT_RETRY_BUDGET)
    )
    return LockedOccurrence.from_row(row) if row is not None else None


class AttemptLedger:
    """The decisions about one occurrence's attempts, inside a caller's transaction.

    Shared by the attempt processor (events) and the reaper (expired leases).
    """

    def __init__(self, clock: Clock, rng: random.Random, meters: AttemptMetrics, stats: AttemptStats) -> None:
        self.clock = clock
        self.rng = rng
        self.meters = meters
        self.stats = stats

    # -- events ---------------------------------------------------------------------------------

    async def apply(self, conn: asyncpg.Connection, event: AttemptEvent, now: datetime) -> Verdict:
        occ = await lock_occurrence(conn, event.occurrence_id)
        if occ is None:
            return Verdict.UNKNOWN
        found = (
            await conn.fetchrow(*QUERIES.find_attempt(lease_token=event.lease_token))
            if event.lease_token is not None
            else None
        )
        known = Attempt.from_row(found) if found is not None else None
        if known is not None and known.occurrence_id != occ.occurrence_id:
            return Verdict.FENCED  # a token of another occurrence: never ours
        handler = {
            events.STARTED: self._started,
            events.HEARTBEAT: self._heartbeat,
            events.SUCCEEDED: self._succeeded,
            events.FAILED: self._failed,
            events.CANCELED: self._canceled,
            events.ALREADY_APPLIED: self._already_applied,
        }[event.event]
        return await handler(conn, occ, known, event, now)

    def _current(self, occ: LockedOccurrence, event: AttemptEvent) -> bool:
        return occ.state == State.RUNNING.value and occ.lease_token == event.lease_token

    async def _started(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, known: Attempt | None, event: AttemptEvent, now: datetime
    ) -> Verdict:
        if known is not None:
            return Verdict.DUPLICATE
        state = State(occ.state)
        fresh = state in (State.SCHEDULED, State.ENQUEUED, State.RETRY_WAIT) and event.attempt == occ.attempt_count + 1
        takeover = state is State.RUNNING and event.attempt == occ.attempt_count
        if not (fresh or takeover):
            return Verdict.FENCED
        if takeover:
            await self.finish_attempt(
                conn, occ.lease_token, "fenced", now, Failure("Superseded", f"lease taken over by {event.lease_token}")
            )
        transition(state, Event.STARTED)
        await conn.fetchval(
            *QUERIES.start_attempt(
                occurrence_id=occ.occurrence_id,
                attempt_id=uuid.uuid4(),
                attempt_number=event.attempt,
                lease_token=event.lease_token,
                consumer_group=event.consumer_group,
                worker=event.worker,
                lease_ttl_s=event.lease_ttl,
                now=now,
            )
        )
        log.info(
            "attempt started",
            extra=_ids(
                occ,
                action="attempt.started",
                attempt=event.attempt,
                lease_token=str(event.lease_token),
                takeover=takeover,
            ),
        )
        return Verdict.ACCEPTED

    async def _heartbeat(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, known: Attempt | None, event: AttemptEvent, now: datetime
    ) -> Verdict:
        if not self._current(occ, event):
            return Verdict.FENCED
        await conn.fetchval(
            *QUERIES.renew_lease(
                lease_token=event.lease_token, lease_ttl_s=event.lease_ttl, now=now, occurrence_id=occ.occurrence_id
            )
        )
        return Verdict.ACCEPTED

    async def _succeeded(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, known: Attempt | None, event: AttemptEvent, now: datetime
    ) -> Verdict:
        if not self._current(occ, event):
            return _repeat_or_fenced(known, "succeeded")
        await self.finish_attempt(conn, event.lease_token, "succeeded", now)
        await self._finish(conn, occ, Event.SUCCEEDED, now)
        return Verdict.ACCEPTED

    async def _failed(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, known: Attempt | None, event: AttemptEvent, now: datetime
    ) -> Verdict:
        if not self._current(occ, event):
            return _repeat_or_fenced(known, "failed")
        failure = Failure(event.error_class or "Error", event.error_message or "", event.permanent)
        await self.finish_attempt(conn, event.lease_token, "failed", now, failure)
        await self.conclude_failure(conn, occ, failure, now)
        return Verdict.ACCEPTED

    async def _canceled(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, known: Attempt | None, event: AttemptEvent, now: datetime
    ) -> Verdict:
        state = State(occ.state)
        if event.lease_token is not None:
            if self._current(occ, event):
                await self.finish_attempt(conn, event.lease_token, "canceled", now)
                await self._finish(conn, occ, Event.CANCEL, now)
                return Verdict.ACCEPTED
            if state is State.CANCELED:
                return Verdict.IGNORED
            return _repeat_or_fenced(known, "canceled")
        if state is State.CANCELED:
            return Verdict.IGNORED
        obsolete = occ.obsolete
        if state in (State.SCHEDULED, State.ENQUEUED, State.RETRY_WAIT) and obsolete:
            await self._finish(conn, occ, Event.CANCEL, now)
            return Verdict.ACCEPTED
        if not obsolete:
            log.warning(
                "a consumer skipped an occurrence the engine does not consider obsolete",
                extra=_ids(
                    occ, action="attempt.cancel_unconfirmed", reason=event.reason, consumer_group=event.consumer_group
                ),
            )
        return Verdict.IGNORED

    async def _already_applied(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, known: Attempt | None, event: AttemptEvent, now: datetime
    ) -> Verdict:
        state = State(occ.state)
        if state is State.SUCCEEDED:
            return Verdict.DUPLICATE
        if not allowed(state, Event.ALREADY_APPLIED):
            log.warning(
                "effect applied for an occurrence in a final state",
                extra=_ids(
                    occ, action="occurrence.applied_after_final", state=state.value, applied_by=str(event.applied_by)
                ),
            )
            return Verdict.IGNORED
        if state is State.RUNNING:
            mine = occ.lease_token == event.applied_by
            await self.finish_attempt(
                conn,
                occ.lease_token,
                "succeeded" if mine else "fenced",
                now,
                None if mine else Failure("AppliedElsewhere", f"effect applied by {event.applied_by}"),
            )
        await self._finish(conn, occ, Event.ALREADY_APPLIED, now)
        return Verdict.ACCEPTED

    # -- outcomes -------------------------------------------------------------------------------

    async def conclude_failure(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, failure: Failure, now: datetime
    ) -> State:
        """After a failed or timed-out attempt: retry (RETRY_WAIT + outbox row), DEAD, or CANCELED."""
        if occ.obsolete:
            # Its schedule changed meanwhile: consumers would skip the retry anyway.
            await self._finish(conn, occ, Event.CANCEL, now, failure)
            return State.CANCELED
        original = await self._original_message(conn, occ)
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
                message_key=partition_key(occ.tenant_id),
                message=message.encode(),
                due=due,
                now=now,
            )
        )
        await conn.execute(
            *QUERIES.wait_for_retry(
                occurrence_id=occ.occurrence_id,
                error_class=failure.error_class,
                error_message=failure.error_message,
                now=now,
            )
        )
        self.stats.retries += 1
        self.meters.retries.add(1)
        log.info(
            "retry scheduled",
            extra=_ids(
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
        await self._finish(conn, occ, Event.DIE, now, failure, decision.dead_reason)
        self.stats.dead += 1
        self.meters.dead.add(1, {"reason": record.reason})
        log.warning(
            "occurrence is dead",
            extra=_ids(
                occ,
                action="occurrence.dead",
                reason=record.reason,
                attempts=occ.attempt_count,
                error_class=failure.error_class,
            ),
        )

    async def _finish(
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
                "occurrence finished", extra=_ids(occ, action=f"occurrence.{final.value.lower()}", event=event.value)
            )

    async def finish_attempt(
        self,
        conn: asyncpg.Connection,
        token: uuid.UUID | None,
        result: str,
        now: datetime,
        failure: Failure | None = None,
    ) -> None:
        if token is None:
            return
        closed = await conn.fetchrow(
            *QUERIES.finish_attempt(
                lease_token=token,
                result=result,
                error_class=failure.error_class if failure else None,
                error_message=failure.error_message if failure else None,
                permanent=failure.permanent if failure else None,
                now=now,
            )
        )
        if closed is not None:
            self.meters.attempts.add(1, {"result": result})

    async def _original_message(self, conn: asyncpg.Connection, occ: LockedOccurrence) -> OccurrenceMessage:
        """The occurrence message as published (retries resend it), rebuilt from the rows if none is left."""
        raw = await conn.fetchval(
            *QUERIES.latest_occurrence_message(occurrence_id=occ.occurrence_id, topic=occurrence_topic(occ.target))
        )
        if raw:
            try:
                return decode_occurrence(raw)
            except MalformedMessage:
                log.error(
                    "stored occurrence message is undecodable; rebuilding it",
                    extra=_ids(occ, action="attempt.message_rebuilt"),
                )
        deadline = occ.deadline
        return OccurrenceMessage(
            occurrence_id=occ.occurrence_id,
            schedule_id=occ.schedule_id,
            schedule_version=occ.schedule_version,
            tenant_id=occ.tenant_id,
            target=occ.target,
            scheduled_for=occ.scheduled_for,
            available_at=occ.scheduled_for,
            attempt=occ.attempt_count,
            priority=occ.priority,
            deadline=occ.scheduled_for + deadline if deadline else None,
            payload=occ.payload,
        )

    def fenced(self, event: AttemptEvent, verdict: Verdict) -> None:
        """Count and log a rejected event (called after the transaction, once per event)."""
        if verdict is not Verdict.FENCED:
            return
        self.meters.fenced.add(1, {"event": event.event})
        self.stats.fenced_tokens = (self.stats.fenced_tokens + [event.lease_token])[-100:]  # type: ignore[list-item]
        log.warning(
            "attempt event fenced: its lease token is not the current one",
            extra={
                "action": "attempt.fenced",
                "occurrence_id": str(event.occurrence_id),
                "event": event.event,
                "attempt": event.attempt,
                "lease_token": str(event.lease_token),
                "consumer_group": event.consumer_group,
            },
        )


def _repeat_or_fenced(known: Attempt | None, result: str) -> Verdict:
    if known is not None and known.result == result:
        return Verdict.DUPLICATE
    return Verdict.FENCED


def _ids(occ: LockedOccurrence, **extra: Any) -> dict[str, Any]:
    return {
        "occurrence_id": str(occ.occurrence_id),
        "schedule_id": str(occ.schedule_id),
        "tenant_id": occ.tenant_id,
        **extra,
    }

"""The attempt ledger: what each attempt event does to its occurrence.

Consumer runtimes report every delivery on ``chronoq.attempts`` (see
``schemas/attempt_events.py``); the attempt processor
(:mod:`engine.loops.attempt_processor`) hands each event to
:meth:`AttemptLedger.apply`, which applies it to the occurrence under a row
lock, following ``engine.rules.occurrence_states`` (how an attempt's end
becomes a retry, a dead letter or a final state is
:mod:`engine.loops.attempt_outcomes`, shared with the reaper):

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

import logging
import random
import uuid
from datetime import datetime
from enum import Enum

import asyncpg

from engine.loops.attempt_outcomes import (
    AttemptMetrics,
    AttemptOutcomes,
    AttemptStats,
    Failure,
    ids_of,
    lock_occurrence,
)
from engine.records import Attempt, LockedOccurrence
from engine.rules.occurrence_states import Event, State, allowed, transition
from schemas import attempt_events as events
from schemas.attempt_events import AttemptEvent
from schemas.clock import Clock
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.attempts")


class Verdict(str, Enum):
    ACCEPTED = "accepted"  # the event changed state
    DUPLICATE = "duplicate"  # the same outcome was already recorded (Kafka redelivered the event)
    FENCED = "fenced"  # the lease token is not the current one: rejected
    IGNORED = "ignored"  # nothing to do (e.g. the occurrence is already CANCELED)
    UNKNOWN = "unknown"  # no such occurrence
    REJECTED = "rejected"  # not authenticated as the consumer side of the occurrence's target: not applied


class AttemptLedger:
    """The decisions about one occurrence's attempts, inside a caller's transaction.

    Shared by the attempt processor (events) and the reaper (expired leases).
    """

    def __init__(self, clock: Clock, rng: random.Random, meters: AttemptMetrics, stats: AttemptStats) -> None:
        self.meters = meters
        self.stats = stats
        self.outcomes = AttemptOutcomes(clock, rng, meters, stats)

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
            await self.outcomes.finish_attempt(
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
            extra=ids_of(
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
        await self.outcomes.finish_attempt(conn, event.lease_token, "succeeded", now)
        await self.outcomes.finish(conn, occ, Event.SUCCEEDED, now)
        return Verdict.ACCEPTED

    async def _failed(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, known: Attempt | None, event: AttemptEvent, now: datetime
    ) -> Verdict:
        if not self._current(occ, event):
            return _repeat_or_fenced(known, "failed")
        failure = Failure(event.error_class or "Error", event.error_message or "", event.permanent)
        await self.outcomes.finish_attempt(conn, event.lease_token, "failed", now, failure)
        await self.outcomes.conclude_failure(conn, occ, failure, now)
        return Verdict.ACCEPTED

    async def _canceled(
        self, conn: asyncpg.Connection, occ: LockedOccurrence, known: Attempt | None, event: AttemptEvent, now: datetime
    ) -> Verdict:
        state = State(occ.state)
        if event.lease_token is not None:
            if self._current(occ, event):
                await self.outcomes.finish_attempt(conn, event.lease_token, "canceled", now)
                await self.outcomes.finish(conn, occ, Event.CANCEL, now)
                return Verdict.ACCEPTED
            if state is State.CANCELED:
                return Verdict.IGNORED
            return _repeat_or_fenced(known, "canceled")
        if state is State.CANCELED:
            return Verdict.IGNORED
        obsolete = occ.obsolete
        if state in (State.SCHEDULED, State.ENQUEUED, State.RETRY_WAIT) and obsolete:
            await self.outcomes.finish(conn, occ, Event.CANCEL, now)
            return Verdict.ACCEPTED
        if not obsolete:
            log.warning(
                "a consumer skipped an occurrence the engine does not consider obsolete",
                extra=ids_of(
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
                extra=ids_of(
                    occ, action="occurrence.applied_after_final", state=state.value, applied_by=str(event.applied_by)
                ),
            )
            return Verdict.IGNORED
        if state is State.RUNNING:
            mine = occ.lease_token == event.applied_by
            await self.outcomes.finish_attempt(
                conn,
                occ.lease_token,
                "succeeded" if mine else "fenced",
                now,
                None if mine else Failure("AppliedElsewhere", f"effect applied by {event.applied_by}"),
            )
        await self.outcomes.finish(conn, occ, Event.ALREADY_APPLIED, now)
        return Verdict.ACCEPTED

    # -- outcomes -------------------------------------------------------------------------------

    def fenced(self, event: AttemptEvent, verdict: Verdict) -> None:
        """Count and log a rejected event (called after the transaction, once per event)."""
        if verdict is not Verdict.FENCED:
            return
        self.meters.fenced.add(1, {"event": event.event})
        if event.lease_token is not None:
            self.stats.fenced_tokens = (self.stats.fenced_tokens + [event.lease_token])[-100:]
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

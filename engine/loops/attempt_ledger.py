"""The engine side of attempts: what attempt events and expired leases do to occurrences and attempts.

Consumer runtimes report every delivery on ``chronoq.attempts`` (see ``schemas/attempt_events.py``). The
rules — which event is accepted, a duplicate, fenced or ignored, and what it changes — are one pure fold,
:mod:`engine.rules.attempt_decisions`, following ``engine.rules.occurrence_states``. This ledger is its I/O,
set-based: for a batch of events it

1. locks every occurrence the batch names (one statement, in id order), reads the owning consumer group of
   their targets (one statement; a target without one is claimed by its first ``started`` here, two more)
   and every attempt their lease tokens name (one statement);
2. folds each occurrence's events, in order, over that snapshot;
3. writes what the fold decided with one statement per kind for the whole batch: new attempts, changed
   attempts, changed occurrences, unsent deliveries of finished occurrences;
4. concludes each accepted ``failed`` (:mod:`engine.loops.attempt_outcomes`, ``engine.rules.retry_policy``:
   RETRY_WAIT plus a new outbox row with the same occurrence_id and attempt + 1, or DEAD plus a dead-letter
   row, or CANCELED when the schedule changed meanwhile — reads and writes per occurrence, rare by nature),
   then applies that occurrence's later events of the batch one at a time.

Fencing stays per occurrence: the fold checks each event's lease token against its own occurrence's
current lease. A burst's ``started`` and ``succeeded`` usually arrive in one batch and cost one write of
the occurrence (ENQUEUED → SUCCEEDED) and one attempt row. The per-event path (:meth:`AttemptLedger.apply`)
is the same code with a batch of one.

Everything a batch changes — occurrences, attempts, outbox rows, the tenant's retry budget — is written in
the caller's transaction; the Kafka offset is committed after it, so a crash in between re-applies
events, which are idempotent.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from engine.loops.attempt_outcomes import AttemptMetrics, AttemptOutcomes, AttemptStats, lock_occurrence
from engine.rules.attempt_decisions import Decisions, Verdict, fold_events, owners_to_claim, tokens_to_read
from schemas.attempt_events import AttemptEvent
from schemas.clock import Clock
from schemas.connections import json_rows
from schemas.identity import random_uuid
from schemas.queries import QUERIES
from schemas.topics import occurrence_topic

log = logging.getLogger("chronoq.attempts")

__all__ = ["AttemptLedger", "Verdict"]

# The columns each write takes from the fold's states (the names are the tables' columns).
_NEW_ATTEMPT = (
    "attempt_id",
    "occurrence_id",
    "attempt_number",
    "lease_token",
    "consumer_group",
    "worker",
    "started_at",
    "heartbeat_at",
    "lease_expires_at",
    "finished_at",
    "result",
    "error_class",
    "error_message",
    "permanent",
    "claim_order",
)
_CHANGED_ATTEMPT = (
    "lease_token",
    "heartbeat_at",
    "lease_expires_at",
    "finished_at",
    "result",
    "error_class",
    "error_message",
    "permanent",
)
_MOVED_OCCURRENCE = (
    "occurrence_id",
    "state",
    "attempt_count",
    "lease_token",
    "lease_expires_at",
    "enqueued_at",
    "finished_at",
    "last_error_class",
    "last_error_message",
    "dead_reason",
)


def _recordset_row(state: Any, columns: tuple[str, ...]) -> dict[str, Any]:
    """One object of a write's JSON recordset: ``state``'s ``columns``, nulls left out. jsonb_to_recordset reads
    a missing key as NULL, so the statement writes the same; the nulls were a fifth to almost half of each
    event's bytes, which the processor sends and PostgreSQL parses (docs/benchmarks.md, stop 49)."""
    return {column: value for column in columns if (value := getattr(state, column)) is not None}


async def lock_event_occurrences(conn: asyncpg.Connection, events: Sequence[AttemptEvent]) -> list[asyncpg.Record]:
    """Lock the occurrences a batch of events names, in id order. Events that carry their occurrence's
    ``scheduled_for`` are looked up in those days' partitions only; an id not found there (an event from
    an older consumer runtime without the field, or with a wrong instant) is looked up by id alone, so a
    wrong or missing instant costs a wider lookup, never an event."""
    ids = sorted({event.occurrence_id for event in events})
    days = {event.occurrence_id: event.scheduled_for for event in events if event.scheduled_for is not None}
    if not days:
        return list(await conn.fetch(*QUERIES.lock_occurrences(occurrence_ids=ids)))
    rows = list(
        await conn.fetch(*QUERIES.lock_occurrences_of_days(occurrence_ids=list(days), days=sorted(set(days.values()))))
    )
    found = {row["occurrence_id"] for row in rows}
    missing = [occurrence_id for occurrence_id in ids if occurrence_id not in found]
    if missing:
        rows += await conn.fetch(*QUERIES.lock_occurrences(occurrence_ids=missing))
        rows.sort(key=lambda row: row["occurrence_id"])
    return rows


async def read_event_leases(
    conn: asyncpg.Connection, events: Sequence[AttemptEvent]
) -> dict[uuid.UUID, asyncpg.Record]:
    """The state and lease token of each occurrence the events name, by id (absent: no such occurrence).
    Pruned to the events' days like :func:`lock_event_occurrences`; an id not found there is read by id
    alone, so a wrong or missing instant costs a wider read, never an answer."""
    days = {event.occurrence_id: event.scheduled_for for event in events if event.scheduled_for is not None}
    ids = {event.occurrence_id for event in events}
    rows = (
        await conn.fetch(*QUERIES.occurrence_leases_of_days(occurrence_ids=list(days), days=sorted(set(days.values()))))
        if days
        else []
    )
    found = {row["occurrence_id"]: row for row in rows}
    missing = [occurrence_id for occurrence_id in ids if occurrence_id not in found]
    if missing:
        found.update(
            (row["occurrence_id"], row) for row in await conn.fetch(*QUERIES.occurrence_leases(occurrence_ids=missing))
        )
    return found


class AttemptLedger:
    """Applies attempt events and failure conclusions inside a caller's transaction.

    What an attempt's end leads to (retry, dead letter, final state) is :mod:`engine.loops.attempt_outcomes`,
    shared with the reaper.
    """

    def __init__(self, clock: Clock, rng: random.Random, meters: AttemptMetrics, stats: AttemptStats) -> None:
        self.meters = meters
        self.stats = stats
        self.outcomes = AttemptOutcomes(clock, rng, meters, stats)

    # -- events ---------------------------------------------------------------------------------

    async def apply(self, conn: asyncpg.Connection, event: AttemptEvent, now: datetime) -> Verdict:
        """One event (a batch of one)."""
        return (await self.apply_batch(conn, [event], now))[0]

    async def apply_batch(
        self,
        conn: asyncpg.Connection,
        events: Sequence[AttemptEvent],
        now: datetime,
        locked: Sequence[asyncpg.Record] | None = None,
    ) -> list[Verdict]:
        """Apply events in order (of their partition): the verdict of each, in order. ``locked``: the rows of
        :func:`lock_event_occurrences` this transaction already holds for (at least) these events' occurrences;
        read and locked here when not given."""
        if not events:
            return []
        rows = await lock_event_occurrences(conn, events) if locked is None else locked
        by_id = {row["occurrence_id"]: row for row in rows}
        # The locked occurrences' instants: every later statement of the batch reads those days' partitions.
        days = sorted({row["scheduled_for"] for row in rows})
        owners = await self.owners(conn, events, by_id, now)
        tokens = tokens_to_read(events, rows)
        attempts = await conn.fetch(*QUERIES.attempts_by_token(lease_tokens=list(tokens), days=days)) if tokens else []
        decisions = fold_events(events, by_id, attempts, now, owners)
        await self._write(conn, decisions, now, days)
        for occurrence_id, failure in decisions.failures.items():
            # The failed attempt is closed (written above); the retry decision reads the whole row now.
            occ = await lock_occurrence(conn, occurrence_id)
            assert occ is not None  # locked by this transaction
            await self.outcomes.conclude_failure(conn, occ, failure, now)
        verdicts = [decisions.verdicts.get(index, Verdict.IGNORED) for index in range(len(events))]
        for index in decisions.deferred:  # after their occurrence's failure was concluded
            verdicts[index] = await self.apply(conn, events[index], now)
        self._report(decisions)
        return verdicts

    async def owners(
        self,
        conn: asyncpg.Connection,
        events: Sequence[AttemptEvent],
        occurrences: Mapping[uuid.UUID, Mapping[str, Any]],
        now: datetime,
    ) -> dict[str, str]:
        """The owning group of every target the batch names; targets without one are claimed first (by the
        group of their first ``started`` here). The claim is an insert that waits for a concurrent claim of
        the same target, so two engine nodes never decide with different owners."""
        targets = sorted({row["target"] for row in occurrences.values()})
        if not targets:
            return {}
        owners = {r["target"]: r["consumer_group"] for r in await conn.fetch(*QUERIES.attempt_owners(targets=targets))}
        claims = owners_to_claim(events, occurrences, owners)
        if claims:
            await conn.execute(
                *QUERIES.claim_attempt_owners(targets=list(claims), consumer_groups=list(claims.values()), now=now)
            )
            rows = await conn.fetch(*QUERIES.attempt_owners(targets=list(claims)))
            owners.update({r["target"]: r["consumer_group"] for r in rows})
            log.info("attempt owners claimed", extra={"action": "target.attempt_owner_claimed", "claims": claims})
        return owners

    async def _write(
        self, conn: asyncpg.Connection, decisions: Decisions, now: datetime, days: Sequence[datetime]
    ) -> None:
        """What the fold decided: one statement per kind of write for the whole batch (``days``: the locked
        occurrences' instants, which prune the updates to their day partitions; a new attempt carries its own
        occurrence's instant)."""
        new = decisions.new_attempts()
        if new:
            for attempt in new:
                attempt.attempt_id = random_uuid()  # half of uuid4()'s cost (schemas.identity)
            # Each in its occurrence's day partition, by the instant this transaction's lock read.
            occurrences = decisions.occurrences
            rows = [
                {**_recordset_row(a, _NEW_ATTEMPT), "scheduled_for": occurrences[a.occurrence_id].row["scheduled_for"]}
                for a in new
            ]
            await conn.execute(*QUERIES.insert_attempts(attempts=json_rows(rows)))
        changed = decisions.changed_attempts()
        if changed:
            rows = [_recordset_row(a, _CHANGED_ATTEMPT) for a in changed]
            await conn.execute(
                *QUERIES.update_attempts(
                    attempts=json_rows(rows), lease_tokens=[a.lease_token for a in changed], days=days
                )
            )
        moved = decisions.changed_occurrences()
        if moved:
            rows = [_recordset_row(o, _MOVED_OCCURRENCE) for o in moved]
            await conn.execute(
                *QUERIES.update_occurrences(
                    occurrences=json_rows(rows), occurrence_ids=[o.occurrence_id for o in moved], now=now, days=days
                )
            )
        if decisions.finished:
            await conn.execute(
                *QUERIES.discard_pending_deliveries_of(
                    occurrence_ids=[o.occurrence_id for o in decisions.finished],
                    topics=[occurrence_topic(o.row["target"]) for o in decisions.finished],
                    now=now,
                )
            )

    def _report(self, decisions: Decisions) -> None:
        """Metrics and the log line of every transition (after the writes; the caller commits)."""
        for result, n in decisions.closed.items():
            self.meters.attempts.add(n, {"result": result})
        if log.isEnabledFor(logging.INFO):
            for change in decisions.transitions:
                log.info(
                    change.action.replace(".", " ").replace("_", " "),
                    extra=_ids(change.occurrence.row, action=change.action, **change.fields),
                )
        for warning in decisions.warnings:
            message = {
                "attempt.cancel_unconfirmed": "a consumer skipped an occurrence the engine does not consider obsolete",
                "occurrence.applied_after_final": "effect applied for an occurrence in a final state",
                "attempt.takeover_refused": "a late start of an earlier claim did not take the lease over",
            }
            log.warning(
                message.get(warning.action, warning.action),
                extra=_ids(warning.occurrence.row, action=warning.action, **warning.fields),
            )

    def fenced(self, event: AttemptEvent, verdict: Verdict) -> None:
        """Count and log a rejected event (called after the transaction, once per event)."""
        if verdict is Verdict.FOREIGN:
            # An observing group's report: expected whenever several groups read a target, so no warning.
            self.meters.foreign_group.add(1, {"event": event.event})
            log.debug(
                "attempt event of a group that does not own the target: ignored",
                extra={
                    "action": "attempt.foreign_group",
                    "occurrence_id": str(event.occurrence_id),
                    "event": event.event,
                    "consumer_group": event.consumer_group,
                },
            )
            return
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


def _ids(row: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "occurrence_id": str(row["occurrence_id"]),
        "schedule_id": str(row["schedule_id"]),
        "tenant_id": row["tenant_id"],
        **extra,
    }

"""What attempt events do to occurrences and attempts, decided as values: ``fold_events(...) -> Decisions``.

Pure: no I/O, no clock of its own. The attempt processor locks the occurrences a batch of events names
and reads the attempts their lease tokens name, then folds each occurrence's events, in the order they
were produced, over that snapshot; the result says what to write (one statement per kind for the whole
batch) and the verdict of every event. The per-event path (one event, one occurrence) is the same fold,
so the rules below have one definition:

* ``started`` opens an attempt with the consumer's fresh lease token and makes it current. Accepted for
  the next delivery (``attempt == attempt_count + 1``) of an occurrence that can take ``started``
  and is not running (SCHEDULED — published but not yet settled by the relay —, ENQUEUED, RETRY_WAIT: the
  state machine table says which), or as a **takeover** of the same delivery of a RUNNING occurrence
  under another token (the previous attempt is closed ``fenced``). A token already recorded is a
  duplicate; anything else is fenced.
* ``heartbeat`` / ``succeeded`` / ``failed`` / ``canceled`` with a token count only for the **current**
  lease token; an exact repeat of an outcome already recorded for that token is a duplicate, any other
  token is fenced. A token recorded for another occurrence is always fenced.
* ``failed`` closes the attempt; what follows (retry, DEAD, or CANCELED when the schedule changed)
  needs the retry policy, the tenant's budget and the original message, so the fold stops there for
  that occurrence: :attr:`Decisions.failures` names the failure, and the occurrence's later events in
  the batch are returned in :attr:`Decisions.deferred` to be applied after the conclusion.
* ``canceled`` without a token (a consumer skipped an obsolete delivery) cancels only what the engine
  agrees is obsolete; ``already_applied`` settles any unfinished or DEAD occurrence as SUCCEEDED.

Events of different occurrences never interact except through lease tokens (a token belongs to one
occurrence), so folding occurrence by occurrence equals applying the batch one event at a time, in
any order that keeps each occurrence's events in theirs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Protocol

from engine.rules.occurrence_states import Event, State, allowed, transition

# The event kinds of schemas/attempt_events.py (rules import no message code; a unit test keeps them equal).
STARTED, HEARTBEAT, SUCCEEDED, FAILED, CANCELED, ALREADY_APPLIED = (
    "started",
    "heartbeat",
    "succeeded",
    "failed",
    "canceled",
    "already_applied",
)


class AttemptEvent(Protocol):
    """What the fold reads of a decoded attempt event (``schemas.attempt_events.AttemptEvent``)."""

    @property
    def event(self) -> str: ...
    @property
    def occurrence_id(self) -> uuid.UUID: ...
    @property
    def attempt(self) -> int: ...
    @property
    def lease_token(self) -> uuid.UUID | None: ...
    @property
    def lease_ttl(self) -> float | None: ...
    @property
    def consumer_group(self) -> str | None: ...
    @property
    def worker(self) -> str | None: ...
    @property
    def error_class(self) -> str | None: ...
    @property
    def error_message(self) -> str | None: ...
    @property
    def permanent(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def applied_by(self) -> uuid.UUID | None: ...

    @property
    def claim_order(self) -> int | None: ...


#: States by their database text (an enum call costs a microsecond per row; unknown text still raises).
_STATES = {state.value: state for state in State}


class Verdict(str, Enum):
    ACCEPTED = "accepted"  # the event changed state
    DUPLICATE = "duplicate"  # the same outcome was already recorded (Kafka redelivered the event)
    FENCED = "fenced"  # the lease token is not the current one: rejected
    IGNORED = "ignored"  # nothing to do (e.g. the occurrence is already CANCELED)
    UNKNOWN = "unknown"  # no such occurrence
    REJECTED = "rejected"  # the event failed verification (not from the consumer it claims)
    FOREIGN = "foreign"  # from a consumer group that does not own the target: an observer, ignored


@dataclass(frozen=True)
class Failure:
    error_class: str
    error_message: str
    permanent: bool = False


@dataclass
class OccurrenceState:
    """The locked occurrence row as the fold moves it; ``row`` keeps what the database returned."""

    row: Mapping[str, Any]
    state: State
    attempt_count: int
    lease_token: uuid.UUID | None
    lease_expires_at: datetime | None
    enqueued_at: datetime | None
    finished_at: datetime | None
    last_error_class: str | None
    last_error_message: str | None
    dead_reason: str | None
    changed: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OccurrenceState:
        return cls(
            row,
            _STATES.get(row["state"]) or State(row["state"]),
            row["attempt_count"],
            row["lease_token"],
            row["lease_expires_at"],
            row["enqueued_at"],
            row["finished_at"],
            row["last_error_class"],
            row["last_error_message"],
            row["dead_reason"],
        )

    @property
    def occurrence_id(self) -> uuid.UUID:
        return self.row["occurrence_id"]

    @property
    def obsolete(self) -> bool:
        """Its schedule moved to a newer version or was canceled: consumers skip its deliveries."""
        return self.row["current_version"] > self.row["schedule_version"] or self.row["schedule_state"] == "canceled"


@dataclass
class AttemptState:
    """One attempt (by lease token): recorded before this batch (``new`` False) or opened by it."""

    lease_token: uuid.UUID
    occurrence_id: uuid.UUID
    attempt_number: int
    result: str | None = None
    finished_at: datetime | None = None
    new: bool = False
    changed: bool = False
    attempt_id: uuid.UUID | None = None  # a new attempt's is chosen where it is written (the ledger)
    consumer_group: str | None = None
    worker: str | None = None
    started_at: datetime | None = None
    heartbeat_at: datetime | None = None
    lease_expires_at: datetime | None = None
    error_class: str | None = None
    error_message: str | None = None
    permanent: bool | None = None
    claim_order: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AttemptState:
        return cls(
            row["lease_token"],
            row["occurrence_id"],
            row["attempt_number"],
            row["result"],
            row["finished_at"],
            claim_order=row.get("claim_order"),
        )

    @property
    def open(self) -> bool:
        return self.finished_at is None


@dataclass(frozen=True)
class Transition:
    """A state change to log once the transaction committed."""

    occurrence: OccurrenceState
    action: str
    fields: Mapping[str, Any]


@dataclass
class Decisions:
    """What a batch does: verdicts by event index, and the rows to write."""

    verdicts: dict[int, Verdict] = field(default_factory=dict)
    occurrences: dict[uuid.UUID, OccurrenceState] = field(default_factory=dict)
    attempts: dict[uuid.UUID, AttemptState] = field(default_factory=dict)
    #: attempts closed in this batch, by result (for ``chronoq.attempts{result}``)
    closed: dict[str, int] = field(default_factory=dict)
    #: occurrences that reached SUCCEEDED or CANCELED here: their unsent deliveries are dropped
    finished: list[OccurrenceState] = field(default_factory=list)
    #: occurrences whose current attempt failed here, with the failure: the retry decision is the caller's
    failures: dict[uuid.UUID, Failure] = field(default_factory=dict)
    #: events (by index) of those occurrences after the failure, to apply once the failure is concluded
    deferred: list[int] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    warnings: list[Transition] = field(default_factory=list)

    def changed_occurrences(self) -> list[OccurrenceState]:
        return [o for o in self.occurrences.values() if o.changed]

    def new_attempts(self) -> list[AttemptState]:
        return [a for a in self.attempts.values() if a.new]

    def changed_attempts(self) -> list[AttemptState]:
        return [a for a in self.attempts.values() if a.changed and not a.new]


def tokens_to_read(events: Iterable[AttemptEvent], occurrences: Iterable[Mapping[str, Any]]) -> set[uuid.UUID]:
    """The attempts a fold needs: every token an event names, and every occurrence's current token."""
    tokens = {e.lease_token for e in events if e.lease_token is not None}
    tokens.update(o["lease_token"] for o in occurrences if o["lease_token"] is not None)
    return tokens


def owners_to_claim(
    events: Iterable[AttemptEvent], occurrences: Mapping[uuid.UUID, Mapping[str, Any]], owners: Mapping[str, str]
) -> dict[str, str]:
    """Targets of this batch without an owning group, each with the group of its first ``started``: the
    first group the engine sees starting an attempt of a target owns it (until an operator says otherwise)."""
    claims: dict[str, str] = {}
    for event in events:
        occ = occurrences.get(event.occurrence_id)
        if event.event != STARTED or event.consumer_group is None or occ is None:
            continue
        target = occ["target"]
        if target not in owners and target not in claims:
            claims[target] = event.consumer_group
    return claims


def fold_events(
    events: Sequence[AttemptEvent],
    occurrences: Mapping[uuid.UUID, Mapping[str, Any]],
    attempts: Iterable[Mapping[str, Any]],
    now: datetime,
    owners: Mapping[str, str] | None = None,
) -> Decisions:
    """Decide a batch: ``occurrences`` are the locked rows by id, ``attempts`` the rows of
    :func:`tokens_to_read`, ``owners`` the owning consumer group by target (:func:`owners_to_claim`);
    events are taken in order (the order of their partition).

    An event naming a consumer group other than its target's owner is ``FOREIGN``: it changes nothing, so
    an observing group can neither take the owner's lease over nor settle its attempt. An event without a
    group, or of a target without an owner, is judged as any other."""
    owners = owners or {}
    decisions = Decisions()
    decisions.occurrences = {ident: OccurrenceState.from_row(row) for ident, row in occurrences.items()}
    decisions.attempts = {row["lease_token"]: AttemptState.from_row(row) for row in attempts}
    stopped: set[uuid.UUID] = set()
    for index, event in enumerate(events):
        if event.occurrence_id in stopped:
            decisions.deferred.append(index)
            continue
        occ = decisions.occurrences.get(event.occurrence_id)
        if occ is None:
            decisions.verdicts[index] = Verdict.UNKNOWN
            continue
        owner = owners.get(occ.row["target"])
        if owner is not None and event.consumer_group is not None and event.consumer_group != owner:
            decisions.verdicts[index] = Verdict.FOREIGN
            continue
        decisions.verdicts[index] = _Fold(decisions, occ, now).apply(event)
        if occ.occurrence_id in decisions.failures:
            stopped.add(occ.occurrence_id)
    return decisions


class _Fold:
    """One event against one occurrence (the rules of the module docstring)."""

    def __init__(self, decisions: Decisions, occ: OccurrenceState, now: datetime) -> None:
        self.d = decisions
        self.occ = occ
        self.now = now

    def apply(self, event: AttemptEvent) -> Verdict:
        known = self.d.attempts.get(event.lease_token) if event.lease_token is not None else None
        if known is not None and known.occurrence_id != self.occ.occurrence_id:
            return Verdict.FENCED  # a token of another occurrence: never ours
        return _HANDLERS[event.event](self, event, known)

    def current(self, event: AttemptEvent) -> bool:
        return self.occ.state is State.RUNNING and self.occ.lease_token == event.lease_token

    # -- the events ---------------------------------------------------------------------------------

    def started(self, event: AttemptEvent, known: AttemptState | None) -> Verdict:
        if known is not None:
            return Verdict.DUPLICATE
        occ = self.occ
        fresh = (
            occ.state is not State.RUNNING
            and allowed(occ.state, Event.STARTED)
            and event.attempt == occ.attempt_count + 1
        )
        takeover = occ.state is State.RUNNING and event.attempt == occ.attempt_count
        if not (fresh or takeover):
            return Verdict.FENCED
        if takeover and not self.claims_after_current(event):
            # A worker whose dedupe claim came before the current lease's: its transaction must have ended
            # for the current one's insert to succeed, so it can no longer commit. Its late `started` (it
            # stalled between the insert and the report) must not fence the worker that can.
            self.d.warnings.append(
                Transition(
                    occ,
                    "attempt.takeover_refused",
                    {"lease_token": str(event.lease_token), "current": str(occ.lease_token)},
                )
            )
            return Verdict.FENCED
        if takeover:
            self.close(occ.lease_token, "fenced", Failure("Superseded", f"lease taken over by {event.lease_token}"))
        assert event.lease_token is not None and event.lease_ttl is not None  # the event format guarantees it
        expires = self.now + timedelta(seconds=event.lease_ttl)
        self.d.attempts[event.lease_token] = AttemptState(
            event.lease_token,
            occ.occurrence_id,
            event.attempt,
            new=True,
            consumer_group=event.consumer_group,
            worker=event.worker,
            started_at=self.now,
            lease_expires_at=expires,
            claim_order=event.claim_order,
        )
        occ.state = transition(occ.state, Event.STARTED)
        occ.attempt_count, occ.lease_token, occ.lease_expires_at = event.attempt, event.lease_token, expires
        occ.enqueued_at = occ.enqueued_at or self.now
        self.touch()
        self.d.transitions.append(
            Transition(
                occ,
                "attempt.started",
                {"attempt": event.attempt, "lease_token": str(event.lease_token), "takeover": takeover},
            )
        )
        return Verdict.ACCEPTED

    def claims_after_current(self, event: AttemptEvent) -> bool:
        """A takeover's claim came after the current lease's (by the consumer database's transaction ids);
        without both orders (an older runtime), arrival order decides as before."""
        current = self.d.attempts.get(self.occ.lease_token) if self.occ.lease_token is not None else None
        if event.claim_order is None or current is None or current.claim_order is None:
            return True
        return event.claim_order > current.claim_order

    def heartbeat(self, event: AttemptEvent, known: AttemptState | None) -> Verdict:
        if not self.current(event):
            return Verdict.FENCED
        assert event.lease_ttl is not None and event.lease_token is not None
        expires = self.now + timedelta(seconds=event.lease_ttl)
        self.occ.lease_expires_at = expires
        self.touch()
        attempt = self.d.attempts.get(event.lease_token)
        if attempt is not None:
            attempt.heartbeat_at, attempt.lease_expires_at, attempt.changed = self.now, expires, True
        return Verdict.ACCEPTED

    def succeeded(self, event: AttemptEvent, known: AttemptState | None) -> Verdict:
        if not self.current(event):
            return _repeat_or_fenced(known, "succeeded")
        self.close(event.lease_token, "succeeded")
        self.finish(Event.SUCCEEDED)
        return Verdict.ACCEPTED

    def failed(self, event: AttemptEvent, known: AttemptState | None) -> Verdict:
        if not self.current(event):
            return _repeat_or_fenced(known, "failed")
        failure = Failure(event.error_class or "Error", event.error_message or "", event.permanent)
        self.close(event.lease_token, "failed", failure)
        self.d.failures[self.occ.occurrence_id] = failure
        return Verdict.ACCEPTED

    def canceled(self, event: AttemptEvent, known: AttemptState | None) -> Verdict:
        occ = self.occ
        if event.lease_token is not None:
            if self.current(event):
                self.close(event.lease_token, "canceled")
                self.finish(Event.CANCEL)
                return Verdict.ACCEPTED
            if occ.state is State.CANCELED:
                return Verdict.IGNORED
            return _repeat_or_fenced(known, "canceled")
        if occ.state is State.CANCELED:
            return Verdict.IGNORED
        if occ.state is not State.RUNNING and allowed(occ.state, Event.CANCEL) and occ.obsolete:
            self.finish(Event.CANCEL)
            return Verdict.ACCEPTED
        if not occ.obsolete:
            self.d.warnings.append(
                Transition(
                    occ, "attempt.cancel_unconfirmed", {"reason": event.reason, "consumer_group": event.consumer_group}
                )
            )
        return Verdict.IGNORED

    def already_applied(self, event: AttemptEvent, known: AttemptState | None) -> Verdict:
        occ = self.occ
        if occ.state is State.SUCCEEDED:
            return Verdict.DUPLICATE
        if not allowed(occ.state, Event.ALREADY_APPLIED):
            self.d.warnings.append(
                Transition(
                    occ,
                    "occurrence.applied_after_final",
                    {"state": occ.state.value, "applied_by": str(event.applied_by)},
                )
            )
            return Verdict.IGNORED
        if occ.state is State.RUNNING:
            mine = occ.lease_token == event.applied_by
            self.close(
                occ.lease_token,
                "succeeded" if mine else "fenced",
                None if mine else Failure("AppliedElsewhere", f"effect applied by {event.applied_by}"),
            )
        self.finish(Event.ALREADY_APPLIED)
        return Verdict.ACCEPTED

    # -- writes -------------------------------------------------------------------------------------

    def touch(self) -> None:
        self.occ.changed = True

    def close(self, token: uuid.UUID | None, result: str, failure: Failure | None = None) -> None:
        """Close an open attempt with its result; an attempt that is already closed stays as it is."""
        attempt = self.d.attempts.get(token) if token is not None else None
        if attempt is None or not attempt.open:
            return
        attempt.finished_at, attempt.result, attempt.changed = self.now, result, True
        if failure is not None:
            attempt.error_class, attempt.error_message = failure.error_class, failure.error_message
            attempt.permanent = failure.permanent
        self.d.closed[result] = self.d.closed.get(result, 0) + 1

    def finish(self, event: Event) -> None:
        """A final state (SUCCEEDED, CANCELED) without a failure: the lease is dropped."""
        occ = self.occ
        occ.state = transition(occ.state, event)
        occ.finished_at, occ.lease_token, occ.lease_expires_at, occ.dead_reason = self.now, None, None, None
        self.touch()
        self.d.finished.append(occ)
        self.d.transitions.append(Transition(occ, f"occurrence.{occ.state.value.lower()}", {"event": event.value}))


#: The rule of each event kind (a table built once: a dict of bound methods per event cost ~1 µs of ~20).
_HANDLERS = {
    STARTED: _Fold.started,
    HEARTBEAT: _Fold.heartbeat,
    SUCCEEDED: _Fold.succeeded,
    FAILED: _Fold.failed,
    CANCELED: _Fold.canceled,
    ALREADY_APPLIED: _Fold.already_applied,
}


def _repeat_or_fenced(known: AttemptState | None, result: str) -> Verdict:
    if known is not None and known.result == result:
        return Verdict.DUPLICATE
    return Verdict.FENCED

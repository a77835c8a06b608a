"""The occurrence state machine, as a value: ``transition(state, event) -> state``.

Pure: no I/O. The engine's attempt processor, reaper, overlap gate and DLQ
replay ask this module for the next state and write it conditionally on the
state they read, so the table below is the one definition of what may happen
to an occurrence. docs/state-machine.md draws it.

The materializer creates occurrences as SCHEDULED (or MISSED); the relay's
``mark_outbox_sent`` applies ``published`` (SCHEDULED/RETRY_WAIT → ENQUEUED)
in SQL, matching the table.
"""

from __future__ import annotations

from enum import Enum
from typing import cast

from schemas.errors import ChronoqError


class State(str, Enum):
    SCHEDULED = "SCHEDULED"  # has an outbox row the relay has not published yet
    ENQUEUED = "ENQUEUED"  # in Kafka, no attempt started
    RUNNING = "RUNNING"  # an attempt holds the lease
    SUCCEEDED = "SUCCEEDED"
    RETRY_WAIT = "RETRY_WAIT"  # an attempt failed; the next delivery waits in the outbox
    DEAD = "DEAD"  # no retry left (or permanent error): in the dead-letter list
    MISSED = "MISSED"  # misfire policy: never enqueued
    CANCELED = "CANCELED"  # schedule changed or canceled before the effect
    SKIPPED_OVERLAP = "SKIPPED_OVERLAP"  # overlap policy: another occurrence of the schedule was in flight


class Event(str, Enum):
    PUBLISHED = "published"  # the broker acknowledged the outbox row
    STARTED = "started"  # an attempt started (or took over the same delivery)
    SUCCEEDED = "succeeded"  # the current attempt committed its effect
    ALREADY_APPLIED = "already_applied"  # a consumer found the effect's dedupe row already committed
    RETRY = "retry"  # the attempt failed or timed out; a retry is scheduled
    DIE = "die"  # the attempt failed or timed out; no retry is allowed
    CANCEL = "cancel"  # the occurrence's schedule version is obsolete or canceled
    SKIP_OVERLAP = "skip_overlap"  # the overlap gate decided not to dispatch it
    REPLAY = "replay"  # an operator re-enqueued a dead occurrence
    BACKFILL = "backfill"  # an operator's backfill fires a slot of the current version that never ran


class IllegalTransition(ChronoqError):
    """An event that cannot happen to an occurrence in its current state."""

    def __init__(self, state: State, event: Event) -> None:
        self.state = state
        self.event = event
        super().__init__(f"an occurrence in state {state.value} cannot take event {event.value!r}")


S, E = State, Event

TRANSITIONS: dict[tuple[State, Event], State] = {
    (S.SCHEDULED, E.PUBLISHED): S.ENQUEUED,
    # Events can overtake the relay's mark: a consumer may start before the row is marked sent.
    (S.SCHEDULED, E.STARTED): S.RUNNING,
    (S.SCHEDULED, E.ALREADY_APPLIED): S.SUCCEEDED,
    (S.SCHEDULED, E.CANCEL): S.CANCELED,
    (S.SCHEDULED, E.SKIP_OVERLAP): S.SKIPPED_OVERLAP,
    (S.ENQUEUED, E.STARTED): S.RUNNING,
    (S.ENQUEUED, E.ALREADY_APPLIED): S.SUCCEEDED,
    (S.ENQUEUED, E.CANCEL): S.CANCELED,
    (S.RUNNING, E.STARTED): S.RUNNING,  # takeover of the same delivery by a new lease
    (S.RUNNING, E.SUCCEEDED): S.SUCCEEDED,
    (S.RUNNING, E.ALREADY_APPLIED): S.SUCCEEDED,
    (S.RUNNING, E.RETRY): S.RETRY_WAIT,
    (S.RUNNING, E.DIE): S.DEAD,
    (S.RUNNING, E.CANCEL): S.CANCELED,
    (S.RETRY_WAIT, E.PUBLISHED): S.ENQUEUED,
    (S.RETRY_WAIT, E.STARTED): S.RUNNING,
    (S.RETRY_WAIT, E.ALREADY_APPLIED): S.SUCCEEDED,
    (S.RETRY_WAIT, E.CANCEL): S.CANCELED,
    # A dead letter leaves only by replay, or when a consumer proves the effect exists.
    (S.DEAD, E.REPLAY): S.RETRY_WAIT,
    (S.DEAD, E.ALREADY_APPLIED): S.SUCCEEDED,
    # A slot that never ran (the misfire or overlap policy skipped it) is fired again only when an operator
    # backfills its window: the same occurrence, the same id (engine/rules/backfill_plan.py).
    (S.MISSED, E.BACKFILL): S.SCHEDULED,
    (S.SKIPPED_OVERLAP, E.BACKFILL): S.SCHEDULED,
}

#: Final states: nothing in the engine moves them on (MISSED and SKIPPED_OVERLAP only by an operator's backfill).
TERMINAL = frozenset({S.SUCCEEDED, S.MISSED, S.CANCELED, S.SKIPPED_OVERLAP})
#: The events that an operator alone applies to a final state.
OPERATOR_EVENTS = frozenset({E.BACKFILL})
#: States in which the occurrence may still be delivered to (or be run by) a consumer.
IN_FLIGHT = frozenset({S.ENQUEUED, S.RUNNING, S.RETRY_WAIT})
#: States whose unclaimed delivery the control plane may cancel.
UNCLAIMED = frozenset({S.SCHEDULED, S.ENQUEUED, S.RETRY_WAIT})


def transition(state: State | str, event: Event | str) -> State:
    """The state after ``event``; IllegalTransition if the event cannot happen in ``state``."""
    # The hot path passes members, which the table answers at once; a miss converts and asks again (a
    # member hashes by its name, its text by its value: an event's text misses), and what is no state or
    # event raises.
    following = _ANY_KEY.get((state, event))
    if following is None:
        state, event = State(state), Event(event)
        following = TRANSITIONS.get((state, event))
        if following is None:
            raise IllegalTransition(state, event)
    return following


def allowed(state: State | str, event: Event | str) -> bool:
    return (state, event) in _ANY_KEY or (State(state), Event(event)) in TRANSITIONS


#: The table as the fast paths above ask it: with whatever they were given, members or text.
_ANY_KEY = cast("dict[tuple[object, object], State]", TRANSITIONS)


def events_from(state: State | str) -> frozenset[Event]:
    """Every event an occurrence in ``state`` can take."""
    state = State(state)
    return frozenset(event for (source, event) in TRANSITIONS if source is state)

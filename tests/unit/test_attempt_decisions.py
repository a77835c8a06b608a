"""The attempt-event fold: each rule as a table case, and batching equals applying events one at a time."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.rules.attempt_decisions import Verdict, fold_events, tokens_to_read
from schemas import attempt_events
from schemas.attempt_events import AttemptEvent as Ev

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
TTL = 30.0
#: What the processor writes back of an occurrence (engine/loops/attempt_ledger.py).
MOVED = (
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


def occurrence(
    state: str = "ENQUEUED",
    attempt_count: int = 0,
    lease_token: uuid.UUID | None = None,
    obsolete: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "occurrence_id": uuid.uuid4(),
        "schedule_id": uuid.uuid4(),
        "tenant_id": "acme",
        "target": "t",
        "state": state,
        "attempt_count": attempt_count,
        "lease_token": lease_token,
        "lease_expires_at": NOW + timedelta(seconds=5) if lease_token else None,
        "enqueued_at": NOW - timedelta(seconds=1) if state != "SCHEDULED" else None,
        "finished_at": None,
        "last_error_class": None,
        "last_error_message": None,
        "dead_reason": None,
        "schedule_version": 1,
        "current_version": 2 if obsolete else 1,
        "schedule_state": "active",
        **extra,
    }


def attempt(occ: dict[str, Any], token: uuid.UUID, number: int = 1, result: str | None = None) -> dict[str, Any]:
    return {
        "lease_token": token,
        "occurrence_id": occ["occurrence_id"],
        "attempt_number": number,
        "result": result,
        "finished_at": NOW - timedelta(seconds=1) if result else None,
    }


def fold(events, *occurrences, attempts=()):
    return fold_events(events, {o["occurrence_id"]: o for o in occurrences}, attempts, NOW)


def test_the_event_kinds_are_the_wire_formats():
    from engine.rules import attempt_decisions as rules

    assert (
        rules.STARTED,
        rules.HEARTBEAT,
        rules.SUCCEEDED,
        rules.FAILED,
        rules.CANCELED,
        rules.ALREADY_APPLIED,
    ) == attempt_events.EVENT_KINDS


def test_started_and_succeeded_in_one_batch_finish_the_occurrence_with_one_closed_attempt():
    occ = occurrence("ENQUEUED")
    token = uuid.uuid4()
    d = fold(
        [
            Ev.started(occ["occurrence_id"], 1, token, TTL, "billing", "host:1"),
            Ev.succeeded(occ["occurrence_id"], 1, token),
        ],
        occ,
    )
    assert list(d.verdicts.values()) == [Verdict.ACCEPTED, Verdict.ACCEPTED]
    (state,) = d.changed_occurrences()
    assert (state.state.value, state.attempt_count, state.lease_token, state.finished_at) == ("SUCCEEDED", 1, None, NOW)
    assert state.enqueued_at == occ["enqueued_at"]  # the relay's mark stays
    (new,) = d.new_attempts()
    assert (new.lease_token, new.result, new.started_at, new.finished_at, new.worker, new.consumer_group) == (
        token,
        "succeeded",
        NOW,
        NOW,
        "host:1",
        "billing",
    )
    assert d.closed == {"succeeded": 1} and d.finished == [state] and not d.changed_attempts()


def test_a_start_is_accepted_for_a_published_occurrence_the_relay_has_not_settled_yet():
    occ = occurrence("SCHEDULED")
    token = uuid.uuid4()
    d = fold([Ev.started(occ["occurrence_id"], 1, token, TTL)], occ)
    assert d.verdicts == {0: Verdict.ACCEPTED}
    (state,) = d.changed_occurrences()
    assert (state.state.value, state.lease_token, state.lease_expires_at, state.enqueued_at) == (
        "RUNNING",
        token,
        NOW + timedelta(seconds=TTL),
        NOW,
    )


def test_a_redelivery_takes_the_lease_over_and_fences_the_previous_attempt():
    old = uuid.uuid4()
    occ = occurrence("RUNNING", attempt_count=1, lease_token=old)
    new = uuid.uuid4()
    d = fold([Ev.started(occ["occurrence_id"], 1, new, TTL)], occ, attempts=[attempt(occ, old)])
    assert d.verdicts == {0: Verdict.ACCEPTED}
    (closed,) = d.changed_attempts()
    assert (closed.lease_token, closed.result, closed.error_class) == (old, "fenced", "Superseded")
    assert d.occurrences[occ["occurrence_id"]].lease_token == new


def test_stale_starts_tokens_of_other_occurrences_and_repeats():
    occ, other = occurrence("RETRY_WAIT", attempt_count=1), occurrence("RUNNING", attempt_count=1)
    theirs = uuid.uuid4()
    other["lease_token"] = theirs
    mine = uuid.uuid4()
    d = fold(
        [
            Ev.started(occ["occurrence_id"], 1, uuid.uuid4(), TTL),  # an older delivery
            Ev.succeeded(occ["occurrence_id"], 2, theirs),  # another occurrence's token
            Ev.started(occ["occurrence_id"], 2, mine, TTL),
            Ev.started(occ["occurrence_id"], 2, mine, TTL),  # Kafka redelivered it
            Ev.succeeded(occ["occurrence_id"], 2, mine),
            Ev.succeeded(occ["occurrence_id"], 2, mine),
            Ev.heartbeat(occ["occurrence_id"], 2, mine, TTL),
        ],  # after the end: not current
        occ,
        other,
        attempts=[attempt(other, theirs)],
    )
    assert list(d.verdicts.values()) == [
        Verdict.FENCED,
        Verdict.FENCED,
        Verdict.ACCEPTED,
        Verdict.DUPLICATE,
        Verdict.ACCEPTED,
        Verdict.DUPLICATE,
        Verdict.FENCED,
    ]


def test_a_failure_is_left_to_the_retry_decision_and_later_events_of_that_occurrence_wait_for_it():
    occ, bystander = occurrence(), occurrence()
    token, other = uuid.uuid4(), uuid.uuid4()
    d = fold(
        [
            Ev.started(occ["occurrence_id"], 1, token, TTL),
            Ev.failed(occ["occurrence_id"], 1, token, "TimeoutError", "slow", permanent=True),
            Ev.started(bystander["occurrence_id"], 1, other, TTL),
            Ev.started(occ["occurrence_id"], 2, uuid.uuid4(), TTL),
        ],
        occ,
        bystander,
    )
    assert d.verdicts == {0: Verdict.ACCEPTED, 1: Verdict.ACCEPTED, 2: Verdict.ACCEPTED}
    assert d.deferred == [3]
    failure = d.failures[occ["occurrence_id"]]
    assert (failure.error_class, failure.permanent) == ("TimeoutError", True)
    assert d.attempts[token].result == "failed" and d.occurrences[occ["occurrence_id"]].state.value == "RUNNING"


def test_skips_cancel_only_what_the_engine_agrees_is_obsolete():
    stale, current, done = occurrence(obsolete=True), occurrence(), occurrence("CANCELED")
    d = fold(
        [
            Ev.canceled(stale["occurrence_id"], 1, "stale_version"),
            Ev.canceled(current["occurrence_id"], 1, "stale_version"),
            Ev.canceled(done["occurrence_id"], 1, "schedule_canceled"),
        ],
        stale,
        current,
        done,
    )
    assert list(d.verdicts.values()) == [Verdict.ACCEPTED, Verdict.IGNORED, Verdict.IGNORED]
    assert d.occurrences[stale["occurrence_id"]].state.value == "CANCELED"
    assert [w.action for w in d.warnings] == ["attempt.cancel_unconfirmed"]


def test_already_applied_settles_running_dead_and_waiting_occurrences_but_not_final_ones():
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    running_mine = occurrence("RUNNING", 1, mine)
    running_other = occurrence("RUNNING", 1, theirs)
    dead = occurrence("DEAD", 3, dead_reason="max_attempts")
    skipped = occurrence("SKIPPED_OVERLAP")
    d = fold(
        [
            Ev.already_applied(running_mine["occurrence_id"], 1, mine),
            Ev.already_applied(running_other["occurrence_id"], 1, uuid.uuid4()),
            Ev.already_applied(dead["occurrence_id"], 4, None),
            Ev.already_applied(skipped["occurrence_id"], 1, None),
        ],
        running_mine,
        running_other,
        dead,
        skipped,
        attempts=[attempt(running_mine, mine), attempt(running_other, theirs)],
    )
    assert list(d.verdicts.values()) == [Verdict.ACCEPTED, Verdict.ACCEPTED, Verdict.ACCEPTED, Verdict.IGNORED]
    assert (d.attempts[mine].result, d.attempts[theirs].result) == ("succeeded", "fenced")
    assert d.occurrences[dead["occurrence_id"]].dead_reason is None
    assert {o.occurrence_id for o in d.finished} == {
        running_mine["occurrence_id"],
        running_other["occurrence_id"],
        dead["occurrence_id"],
    }
    assert [w.action for w in d.warnings] == ["occurrence.applied_after_final"]


def test_events_for_occurrences_that_do_not_exist_are_unknown():
    assert fold([Ev.succeeded(uuid.uuid4(), 1, uuid.uuid4())]).verdicts == {0: Verdict.UNKNOWN}


def test_the_attempts_to_read_are_the_events_tokens_and_the_current_leases():
    current = uuid.uuid4()
    occ = occurrence("RUNNING", 1, current)
    named = uuid.uuid4()
    assert tokens_to_read(
        [Ev.succeeded(occ["occurrence_id"], 1, named), Ev.canceled(occ["occurrence_id"], 1, "stale_version")], [occ]
    ) == {named, current}


# -- batching equals one event at a time ---------------------------------------------------------------


def write(tables: dict[str, dict], decisions) -> None:
    """What the processor's statements do with decisions (the set-based writes, in memory)."""
    for state in decisions.changed_occurrences():
        tables["occurrences"][state.occurrence_id] = {**state.row, **{c: getattr(state, c) for c in MOVED}}
    for a in decisions.attempts.values():
        if a.new:
            tables["attempts"][a.lease_token] = {
                k: v for k, v in vars(a).items() if k not in ("new", "changed", "attempt_id")
            }
        elif a.changed:
            row = tables["attempts"][a.lease_token]
            for name in (
                "result",
                "finished_at",
                "error_class",
                "error_message",
                "permanent",
                "heartbeat_at",
                "lease_expires_at",
            ):
                if getattr(a, name) is not None:
                    row[name] = getattr(a, name)


def initial_tables(occurrences: list[dict], attempts: list[dict]) -> dict[str, dict]:
    return {
        "occurrences": {o["occurrence_id"]: dict(o) for o in occurrences},
        "attempts": {a["lease_token"]: dict(a) for a in attempts},
    }


def one_at_a_time(events, occurrences, attempts):
    tables = initial_tables(occurrences, attempts)
    verdicts: list = []
    stopped: set[uuid.UUID] = set()
    for event in events:
        if event.occurrence_id in stopped:
            verdicts.append("deferred")
            continue
        rows = [
            tables["attempts"][t]
            for t in tokens_to_read([event], tables["occurrences"].values())
            if t in tables["attempts"]
        ]
        d = fold_events([event], tables["occurrences"], rows, NOW)
        write(tables, d)
        verdicts.append(d.verdicts[0])
        stopped.update(d.failures)
    return tables, verdicts


def batched(events, occurrences, attempts):
    tables = initial_tables(occurrences, attempts)
    rows = [
        tables["attempts"][t] for t in tokens_to_read(events, tables["occurrences"].values()) if t in tables["attempts"]
    ]
    d = fold_events(events, tables["occurrences"], rows, NOW)
    write(tables, d)
    return tables, [d.verdicts.get(i, "deferred") for i in range(len(events))]


def event_of(kind, ident, number, token, draw):
    if kind == "started":
        return Ev.started(ident, number, token, TTL)
    if kind == "heartbeat":
        return Ev.heartbeat(ident, number, token, TTL)
    if kind == "succeeded":
        return Ev.succeeded(ident, number, token)
    if kind == "failed":
        return Ev.failed(ident, number, token, "E", "e", draw(st.booleans()))
    if kind == "canceled":
        return Ev.canceled(ident, number, "cooperative", draw(st.sampled_from([token, None])))
    return Ev.already_applied(ident, number, draw(st.sampled_from([token, None])))


@st.composite
def histories(draw):
    states = st.sampled_from(["SCHEDULED", "ENQUEUED", "RUNNING", "RETRY_WAIT", "DEAD", "SUCCEEDED", "CANCELED"])
    occurrences, attempts = [], []
    for _ in range(draw(st.integers(1, 3))):
        state = draw(states)
        token = uuid.uuid4() if state == "RUNNING" else None
        occ = occurrence(
            state, draw(st.integers(0 if state != "RUNNING" else 1, 2)), token, obsolete=draw(st.booleans())
        )
        occurrences.append(occ)
        if token:
            attempts.append(attempt(occ, token, occ["attempt_count"]))
    tokens = [a["lease_token"] for a in attempts] + [uuid.uuid4() for _ in range(3)]
    kinds = st.sampled_from(attempt_events.EVENT_KINDS)
    events = []
    for _ in range(draw(st.integers(1, 12))):
        occ = draw(st.sampled_from(occurrences)) if draw(st.integers(0, 9)) else {"occurrence_id": uuid.uuid4()}
        kind, number, token = draw(kinds), draw(st.integers(1, 3)), draw(st.sampled_from(tokens))
        ident = occ["occurrence_id"]
        events.append(event_of(kind, ident, number, token, draw))
    return occurrences, attempts, events


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_batch_decides_exactly_what_its_events_decide_one_at_a_time(history):
    occurrences, attempts, events = history
    assert batched(events, occurrences, attempts) == one_at_a_time(events, occurrences, attempts)

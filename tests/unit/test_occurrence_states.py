"""The occurrence state machine: a table of legal moves and properties of every path."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.rules.occurrence_states import (
    IN_FLIGHT,
    OPERATOR_EVENTS,
    TERMINAL,
    TRANSITIONS,
    Event,
    IllegalTransition,
    State,
    allowed,
    events_from,
    transition,
)

S, E = State, Event


@pytest.mark.parametrize(
    "state, event, expected",
    [
        (S.SCHEDULED, E.PUBLISHED, S.ENQUEUED),
        (S.SCHEDULED, E.STARTED, S.RUNNING),  # a start can overtake the relay's mark
        (S.SCHEDULED, E.SKIP_OVERLAP, S.SKIPPED_OVERLAP),
        (S.ENQUEUED, E.STARTED, S.RUNNING),
        (S.ENQUEUED, E.CANCEL, S.CANCELED),
        (S.RUNNING, E.STARTED, S.RUNNING),  # takeover of the same delivery
        (S.RUNNING, E.SUCCEEDED, S.SUCCEEDED),
        (S.RUNNING, E.RETRY, S.RETRY_WAIT),
        (S.RUNNING, E.DIE, S.DEAD),
        (S.RUNNING, E.ALREADY_APPLIED, S.SUCCEEDED),
        (S.RETRY_WAIT, E.PUBLISHED, S.ENQUEUED),
        (S.RETRY_WAIT, E.STARTED, S.RUNNING),
        (S.DEAD, E.REPLAY, S.RETRY_WAIT),
        (S.DEAD, E.ALREADY_APPLIED, S.SUCCEEDED),
    ],
)
def test_legal_moves(state, event, expected):
    assert transition(state, event) is expected
    assert transition(state.value, event.value) is expected  # plain strings from the database


@pytest.mark.parametrize(
    "state, event",
    [
        (S.ENQUEUED, E.SUCCEEDED),  # no success without a start
        (S.ENQUEUED, E.RETRY),
        (S.RETRY_WAIT, E.SUCCEEDED),
        (S.DEAD, E.STARTED),  # a dead letter comes back only by replay
        (S.SUCCEEDED, E.ALREADY_APPLIED),
        (S.CANCELED, E.STARTED),
        (S.RUNNING, E.SKIP_OVERLAP),  # overlap is decided before dispatch only
        (S.ENQUEUED, E.REPLAY),
        (S.MISSED, E.PUBLISHED),
    ],
)
def test_illegal_moves_raise(state, event):
    with pytest.raises(IllegalTransition) as caught:
        transition(state, event)
    assert caught.value.state is state and caught.value.event is event
    assert not allowed(state, event)


@given(st.sampled_from(list(State)), st.sampled_from(list(Event)), st.booleans(), st.booleans())
def test_members_and_their_text_answer_alike(state, event, state_as_text, event_as_text):
    # The table is looked up with members first (the fold's fast path) and with converted text on a miss:
    # the answer must not depend on which of the two the caller passed.
    given_state = state.value if state_as_text else state
    given_event = event.value if event_as_text else event
    expected = TRANSITIONS.get((state, event))
    assert allowed(given_state, given_event) is (expected is not None)
    if expected is None:
        with pytest.raises(IllegalTransition) as caught:
            transition(given_state, given_event)
        assert caught.value.state is state and caught.value.event is event
    else:
        assert transition(given_state, given_event) is expected


@pytest.mark.parametrize("state, event", [("RUNNING", "STARTED"), ("running", "started"), ("NOPE", "started")])
def test_text_that_is_no_state_or_event_is_an_error_not_a_no(state, event):
    # "STARTED" is the member's name, not its value; a lookup by hash must not mistake one for the other.
    with pytest.raises(ValueError):
        allowed(state, event)
    with pytest.raises(ValueError):
        transition(state, event)


def test_final_states_have_no_way_out_but_an_operators_backfill():
    for state in TERMINAL:
        assert events_from(state) <= OPERATOR_EVENTS
    assert events_from(State.MISSED) == events_from(State.SKIPPED_OVERLAP) == {Event.BACKFILL}


def test_every_state_but_the_final_ones_can_still_end():
    # From every non-final state some path reaches a final state (nothing is stuck by construction).
    reaches_end = set(TERMINAL)
    changed = True
    while changed:
        changed = False
        for (source, _), target in TRANSITIONS.items():
            if target in reaches_end and source not in reaches_end:
                reaches_end.add(source)
                changed = True
    assert reaches_end == set(State)


@given(st.lists(st.sampled_from(list(Event)), max_size=30))
def test_any_event_sequence_keeps_the_invariants(events):
    state = S.SCHEDULED
    for event in events:
        if not allowed(state, event):
            with pytest.raises(IllegalTransition):
                transition(state, event)
            continue
        following = transition(state, event)
        # RUNNING is entered only by a start; DEAD is left only by replay or proof of the effect.
        if following is S.RUNNING:
            assert event is E.STARTED
        if state is S.DEAD:
            assert event in (E.REPLAY, E.ALREADY_APPLIED)
        # A final state is left only by an operator's event (a backfill fires a slot that never ran).
        assert state not in TERMINAL or event in OPERATOR_EVENTS
        state = following


def test_in_flight_states_are_the_ones_a_consumer_may_still_see():
    assert IN_FLIGHT == {S.ENQUEUED, S.RUNNING, S.RETRY_WAIT}
    for state in IN_FLIGHT:
        assert E.STARTED in events_from(state)

"""Slots as pure rules: which canceled occurrence gives its slot up, and where a changed schedule resumes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.rules.occurrence_states import State
from engine.rules.slots import cursor_from, may_release, updated_cursor
from engine.rules.timing import TimeSpec

AT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
EVERY_MINUTE = TimeSpec("cron", "* * * * *")
EVERY_FIVE = TimeSpec("cron", "*/5 * * * *")


@pytest.mark.parametrize(
    ("state", "possibly_published", "released"),
    [
        (State.SCHEDULED, False, True),
        (State.SCHEDULED, True, False),  # claimed, acknowledged-but-unmarked, failed, or in a sealed ahead bucket
        (State.ENQUEUED, False, False),
        (State.RETRY_WAIT, False, False),
        (State.RUNNING, False, False),
    ],
)
def test_only_a_never_published_scheduled_occurrence_releases_its_slot(state, possibly_published, released):
    assert may_release(state.value, possibly_published) is released


def test_the_cursor_resumes_at_the_earlier_of_the_durable_cursor_and_the_earliest_released_slot():
    assert cursor_from(AT, None) == AT
    assert cursor_from(AT, AT - MINUTE) == AT - MINUTE
    assert cursor_from(AT, AT + MINUTE) == AT
    assert cursor_from(None, AT) == AT
    assert cursor_from(None, None) is None


def test_a_cursor_behind_now_is_continued_never_skipped_to_now():
    """Why: "Update loses slots". The materializer is behind (cursor 10:00, now 10:03:30): the update
    continues at 10:00, so the instants that fell due are judged by the misfire policy."""
    now = AT + 3 * MINUTE + timedelta(seconds=30)
    assert updated_cursor(EVERY_MINUTE, AT, now, AT + 4 * MINUTE) == AT  # inclusive: the cursor is a fire
    assert updated_cursor(EVERY_FIVE, AT + MINUTE, now + 5 * MINUTE, AT + 10 * MINUTE) == AT + 5 * MINUTE


def test_a_cursor_ahead_of_now_moves_back_to_now_for_the_new_definition():
    """Fires materialized ahead (cursor 10:05, now 10:00:30): a new definition's instants in between are due
    in the future; the ones an old occurrence still holds are no-ops for the materializer (slot index)."""
    now = AT + timedelta(seconds=30)
    assert updated_cursor(EVERY_MINUTE, AT + 5 * MINUTE, now, AT + MINUTE) == AT + MINUTE


def test_without_a_cursor_or_a_later_fire_the_first_fire_from_now_answers():
    assert updated_cursor(EVERY_MINUTE, None, AT, AT + MINUTE) == AT + MINUTE
    once = TimeSpec("once", "2026-11-29T10:03:00Z")
    assert updated_cursor(once, AT + 5 * MINUTE, AT + 6 * MINUTE, None) is None  # past: nothing fires
    assert updated_cursor(once, AT + 5 * MINUTE, AT, AT + 3 * MINUTE) == AT + 3 * MINUTE  # moved earlier

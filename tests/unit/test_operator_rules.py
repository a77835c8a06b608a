"""Pure rules of the operator features: expected slots, the backfill plan, catch-up pacing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.rules.backfill_plan import ExistingOccurrence, plan_backfill
from engine.rules.catch_up_pacing import pace
from engine.rules.expected_slots import VersionSpan, expected_slots
from engine.rules.timing import TimeSpec

UTC = UTC
T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
MINUTELY = TimeSpec("cron", "* * * * *")


def span(version: int, change: str, state: str, at: datetime, spec: TimeSpec = MINUTELY) -> VersionSpan:
    return VersionSpan(version, change, state, spec, at)


def test_slots_follow_the_version_in_force_and_flag_the_paused_ones():
    versions = [
        span(1, "create", "active", T0),
        span(2, "pause", "paused", T0 + timedelta(minutes=3, seconds=30)),
        span(3, "resume", "active", T0 + timedelta(minutes=6, seconds=30)),
        span(4, "update", "active", T0 + timedelta(minutes=8, seconds=10), TimeSpec("cron", "*/5 * * * *")),
        span(5, "cancel", "canceled", T0 + timedelta(minutes=21)),
    ]
    result = expected_slots(versions, T0 - timedelta(hours=1), T0 + timedelta(hours=1))
    got = [(s.scheduled_for.strftime("%H:%M"), s.version, s.paused) for s in result.slots]
    assert got == [
        ("10:01", 1, False),
        ("10:02", 1, False),
        ("10:03", 1, False),
        ("10:04", 2, True),
        ("10:05", 2, True),
        ("10:06", 2, True),
        ("10:07", 3, False),
        ("10:08", 3, False),
        ("10:10", 4, False),
        ("10:15", 4, False),
        ("10:20", 4, False),
    ]
    assert not result.truncated


def test_a_slot_on_a_change_instant_belongs_to_the_version_that_ends_there():
    versions = [span(1, "create", "active", T0), span(2, "pause", "paused", T0 + timedelta(minutes=2))]
    slots = expected_slots(versions, T0, T0 + timedelta(minutes=3)).slots
    assert [(s.scheduled_for.minute, s.version) for s in slots] == [(1, 1), (2, 1), (3, 2)]


def test_the_window_bounds_are_inclusive_and_work_is_bounded():
    versions = [span(1, "create", "active", T0 - timedelta(days=30), TimeSpec("rate", "1s", anchor=T0))]
    window = expected_slots(versions, T0, T0 + timedelta(seconds=10))
    assert [s.scheduled_for for s in window.slots] == [T0 + timedelta(seconds=i) for i in range(11)]
    capped = expected_slots(versions, T0, T0 + timedelta(days=7), limit=50)
    assert len(capped.slots) == 50 and capped.truncated


def test_a_once_schedule_created_just_after_its_instant_expects_it():
    at = T0 - timedelta(seconds=20)
    versions = [span(1, "create", "active", T0, TimeSpec("once", at.isoformat()))]
    assert [s.scheduled_for for s in expected_slots(versions, T0 - timedelta(hours=1), T0).slots] == [at]


def _occ(minute: int, version: int, state: str) -> ExistingOccurrence:
    return ExistingOccurrence(uuid.uuid4(), version, T0 + timedelta(minutes=minute), state)


def test_the_backfill_plan_creates_refires_or_leaves_each_slot():
    slots = [T0 + timedelta(minutes=m) for m in range(7)]
    existing = [
        _occ(0, 3, "SUCCEEDED"),
        _occ(1, 3, "MISSED"),
        _occ(2, 2, "CANCELED"),
        _occ(2, 3, "MISSED"),
        _occ(3, 1, "MISSED"),
        _occ(4, 3, "DEAD"),
        _occ(5, 3, "SKIPPED_OVERLAP"),
        _occ(6, 2, "RUNNING"),
    ]
    plan = plan_backfill(slots, existing, current_version=3)
    assert plan.create == [T0 + timedelta(minutes=3)]  # only an older version's MISSED there
    assert [o.scheduled_for.minute for o in plan.refire] == [1, 2, 5]  # current version, never ran
    assert plan.present == {"SUCCEEDED": 1, "DEAD": 1, "RUNNING": 1}


@given(
    st.lists(st.sampled_from(["SUCCEEDED", "MISSED", "CANCELED", "SKIPPED_OVERLAP", "DEAD", "SCHEDULED"]), max_size=20),
    st.integers(1, 4),
)
def test_a_second_backfill_after_the_first_releases_nothing(states, version):
    slots = [T0 + timedelta(minutes=i) for i in range(len(states))]
    existing = [
        ExistingOccurrence(uuid.uuid4(), version - (i % 2), slot, state)
        for i, (slot, state) in enumerate(zip(slots, states, strict=True))
    ]
    first = plan_backfill(slots, existing, version)
    after = [o for o in existing if o not in first.refire]
    after += [ExistingOccurrence(o.occurrence_id, version, o.scheduled_for, "SCHEDULED") for o in first.refire]
    after += [ExistingOccurrence(uuid.uuid4(), version, slot, "SCHEDULED") for slot in first.create]
    second = plan_backfill(slots, after, version)
    assert second.released == 0
    assert first.released + sum(first.present.values()) == len(slots)


def test_pacing_bursts_one_minute_of_quota_then_spaces_slots():
    now = T0
    paced = pace(25, 10, now, None)
    assert paced.release_at[:10] == [now] * 10
    assert paced.release_at[10:] == [now + timedelta(seconds=6 * i) for i in range(1, 16)]
    assert paced.free_at == now + timedelta(seconds=90)
    later = pace(1, 10, now, paced.free_at)
    assert later.release_at == [now + timedelta(seconds=96)]
    rested = pace(1, 10, now + timedelta(hours=1), paced.free_at)
    assert rested.release_at == [now + timedelta(hours=1)]
    with pytest.raises(ValueError):
        pace(1, 0, now, None)


@given(st.integers(0, 500), st.integers(1, 2000))
def test_pacing_never_exceeds_the_quota_in_any_minute_after_the_burst(count, per_minute):
    paced = pace(count, per_minute, T0, None)
    release = paced.release_at
    assert release == sorted(release) and all(r >= T0 for r in release)
    for i, instant in enumerate(release):
        in_minute = sum(1 for r in release if instant < r <= instant + timedelta(minutes=1))
        assert in_minute <= per_minute + 1
        if i > 50:
            break

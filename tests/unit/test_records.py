"""Typed rows: built from a row by column name, with the derived values the engine asks for."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from engine.records import DueSchedule, LockedOccurrence
from engine.rules.retry_policy import RetryPolicy
from engine.rules.timing import MisfirePolicy, TimeSpec

AT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def due_row(**overrides):
    row = {
        "schedule_id": uuid.uuid4(),
        "tenant_id": "acme",
        "kind": "cron",
        "expression": "0 9 * * *",
        "time_zone": "Europe/Berlin",
        "dst_repeat": "first",
        "dst_gap": "skip",
        "anchor": None,
        "start_at": None,
        "end_at": None,
        "version": 2,
        "next_run_at": AT,
        "target": "billing.invoice",
        "payload_json": '{"plan": "pro"}',
        "priority": "flexible",
        "flexible_window_s": 300,
        "misfire_policy": "catch_up:3",
        "max_lateness_s": 120,
        "deadline_s": 3600,
        "overlap_policy": "queue_one",
        "calendar_id": None,
        "max_runs": None,
        "runs": 0,
        "shard": 7,
        "weight": 2,
        "column_added_later": "ignored",
    }
    return {**row, **overrides}


def test_a_due_schedule_knows_its_spec_policies_and_windows():
    schedule = DueSchedule.from_row(due_row())
    assert schedule.spec == TimeSpec("cron", "0 9 * * *", "Europe/Berlin", "first", "skip")
    assert schedule.misfire == MisfirePolicy("catch_up", 3, timedelta(minutes=2))
    assert (schedule.flexible_window, schedule.deadline, schedule.gated) == (
        timedelta(minutes=5),
        timedelta(hours=1),
        True,
    )
    plain = DueSchedule.from_row(due_row(deadline_s=None, overlap_policy="allow"))
    assert (plain.deadline, plain.gated) == (None, False)


def test_a_due_schedule_knows_its_runs_left():
    assert DueSchedule.from_row(due_row()).runs_left is None
    assert DueSchedule.from_row(due_row(max_runs=5, runs=3)).runs_left == 2
    assert DueSchedule.from_row(due_row(max_runs=5, runs=7)).runs_left == 0  # lowered below what ran: none left


def test_a_locked_occurrence_knows_whether_it_is_obsolete_and_its_retry_policy():
    row = {
        "occurrence_id": uuid.uuid4(),
        "schedule_id": uuid.uuid4(),
        "schedule_version": 1,
        "tenant_id": "acme",
        "target": "t",
        "scheduled_for": AT,
        "state": "RUNNING",
        "attempt_count": 4,
        "attempt_floor": 3,
        "lease_token": uuid.uuid4(),
        "lease_expires_at": AT,
        "current_version": 1,
        "schedule_state": "active",
        "retry_max_attempts": 5,
        "retry_base_s": 2.0,
        "retry_cap_s": 60.0,
        "deadline_s": None,
        "priority": "strict",
        "payload": {},
        "retry_budget_per_hour": 1000,
    }
    occurrence = LockedOccurrence.from_row(row)
    assert not occurrence.obsolete and occurrence.counted_attempts == 1
    assert occurrence.retry_policy == RetryPolicy(5, timedelta(seconds=2), timedelta(minutes=1))
    assert LockedOccurrence.from_row({**row, "current_version": 2}).obsolete
    assert LockedOccurrence.from_row({**row, "schedule_state": "canceled"}).obsolete

"""Typed rows: built from a row by column name, with the derived values the engine asks for."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engine import records
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
        "cohort_id": None,
        "cohort_version": None,
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


RECORDS = [
    value
    for value in vars(records).values()
    if isinstance(value, type) and issubclass(value, records._Record) and dataclasses.is_dataclass(value)
]


def test_every_record_class_is_covered():
    assert {cls.__name__ for cls in RECORDS} >= {"DueSchedule", "Schedule", "Occurrence", "LockedOccurrence"}


@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: cls.__name__)
def test_from_row_builds_what_the_dataclass_builds(cls):
    # one distinct object per column, plus one the record does not declare
    row = {item.name: object() for item in dataclasses.fields(cls)} | {"column_added_later": object()}
    built = cls.from_row(row)
    own = cls(**{item.name: row[item.name] for item in dataclasses.fields(cls)})
    assert type(built) is cls and built == own and hash(built) == hash(own)
    assert all(getattr(built, item.name) is row[item.name] for item in dataclasses.fields(cls))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.__setattr__(dataclasses.fields(cls)[0].name, 1)
    missing = dict(row)
    del missing[dataclasses.fields(cls)[-1].name]
    with pytest.raises(KeyError):
        cls.from_row(missing)


def test_a_cohort_member_is_built_from_its_row_and_its_cohorts_values():
    row = due_row(cohort_id=uuid.uuid4(), cohort_version=3, next_run_at=AT + timedelta(hours=1), shard=7)
    shared = tuple(row[name] for name in records.COHORT_FIELDS)
    own = {name: value for name, value in row.items() if name not in records.COHORT_FIELDS}
    assert DueSchedule.of_member(own, shared) == DueSchedule.from_row(row)


def test_the_row_builder_refuses_records_it_would_build_wrongly():
    @dataclasses.dataclass(frozen=True, slots=True)
    class WithDefault(records._Record):
        a: int
        b: int = 2

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithPostInit(records._Record):
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (WithDefault, WithPostInit):
        with pytest.raises(TypeError):
            cls.from_row({"a": 1, "b": 2})


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

"""Typed rows at the engine database's boundary.

A row becomes one of these right after its fetch (``Schedule.from_row(row)``),
so what travels through the engine has named, typed fields instead of
``row["retry_base_s"]`` lookups, as the relay does with
:class:`relay.outbox.OutboxRow`. Each record takes the columns of its query
by name; a column the record does not declare is ignored, so ``RETURNING *``
keeps working when a migration adds one.

* :class:`DueSchedule` — a schedule as the materializer reads it;
* :class:`Schedule` — a whole ``schedules`` row (the control plane's reads and changes);
* :class:`ScheduleVersion` — one entry of a schedule's history;
* :class:`Occurrence` — a whole ``occurrences`` row;
* :class:`LockedOccurrence` — an occurrence locked for an attempt decision, with its schedule's
  retry policy and its tenant's retry budget;
* :class:`Attempt` — a whole ``attempts`` row;
* :class:`DeadLetter` — a DEAD occurrence as the dead-letter list shows it;
* :class:`Calendar` — a whole ``calendars`` row (an exclusion calendar, without its dates);
* :class:`CalendarVersion` — one version of a calendar with its dates.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Literal, TypeVar

from engine.rules import timing
from engine.rules.exclusion_calendars import CalendarEntry, entries_from_stored
from engine.rules.retry_policy import RetryPolicy

R = TypeVar("R")
DstRepeat = Literal["first", "both"]
DstGap = Literal["skip", "shift"]


_COLUMNS: dict[type, tuple[str, ...]] = {}
_BUILDERS: dict[tuple[type, tuple[str, ...]], Callable[..., Any]] = {}  # by (class, the fields shared)


def _columns(cls: type) -> tuple[str, ...]:
    """The field names of a record class (memoized)."""
    names = _COLUMNS.get(cls)
    if names is None:
        names = _COLUMNS[cls] = tuple(item.name for item in fields(cls))
    return names


def _builder(cls: type[R], shared: tuple[str, ...] = ()) -> Callable[..., R]:
    """A function building ``cls`` from a row: ``cls(**{name: row[name] for name in its fields})``, with the same
    instance as the result (tests/unit/test_records.py compares the two for every record class). With
    ``shared``, it takes a second argument, those fields' values in that order, read from it instead of the
    row (a cohort member: its own row and its cohort's values).

    A frozen dataclass's ``__init__`` sets each field with ``object.__setattr__``, and the call by keyword
    first builds a dict: ~5.7 µs for the 25 fields of a due schedule, which the materializer pays per due
    schedule of a burst. This one is generated once per class and stores each slot through its descriptor
    (~1.8 µs). Records here have no defaults and no ``__post_init__``, which that would skip: refused.
    """
    if hasattr(cls, "__post_init__") or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: the row builder takes slotted records without __post_init__")
    names = _columns(cls)
    if any(item.default is not MISSING or item.default_factory is not MISSING for item in fields(cls)):  # type: ignore[arg-type]
        raise TypeError(f"{cls.__name__}: the row builder takes records without field defaults")
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = ["def build(row, shared=()):\n    record = _new(_cls)\n"]
    for index, name in enumerate(names):
        namespace[f"_set{index}"] = getattr(cls, name).__set__  # the slot's member descriptor
        source = f"shared[{shared.index(name)}]" if name in shared else f"row[{name!r}]"
        lines.append(f"    _set{index}(record, {source})\n")
    exec("".join(lines) + "    return record\n", namespace)  # noqa: S102 -- source built from field names only
    built: Callable[..., R] = namespace["build"]
    return built


class _Record:
    """A row type: its dataclass fields are the columns it reads."""

    __slots__ = ()

    @classmethod
    def from_row(cls: type[R], row: Mapping[str, Any]) -> R:
        build = _BUILDERS.get((cls, ()))
        if build is None:
            build = _BUILDERS[cls, ()] = _builder(cls)
        record: R = build(row)
        return record


@lru_cache(maxsize=4096)
def _misfire_policy(text: str, max_lateness_s: int) -> timing.MisfirePolicy:
    # Validated when the schedule was stored; memoized because every due schedule asks.
    return timing.parse_misfire_policy(text, timedelta(seconds=max_lateness_s))


class _TimedSchedule(_Record):
    """What a schedule record knows about when it fires and how it is delivered (fields of the subclasses)."""

    __slots__ = ()
    kind: timing.Kind
    expression: str
    time_zone: str
    dst_repeat: DstRepeat
    dst_gap: DstGap
    anchor: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    misfire_policy: str
    max_lateness_s: int
    flexible_window_s: int
    deadline_s: int | None
    overlap_policy: str

    @property
    def spec(self) -> timing.TimeSpec:
        """The stored time spec (validated when it was stored)."""
        return timing.TimeSpec(
            self.kind,
            self.expression,
            self.time_zone,
            self.dst_repeat,
            self.dst_gap,
            self.anchor,
            self.start_at,
            self.end_at,
        )

    @property
    def misfire(self) -> timing.MisfirePolicy:
        return _misfire_policy(self.misfire_policy, self.max_lateness_s)

    @property
    def flexible_window(self) -> timedelta:
        return timedelta(seconds=self.flexible_window_s)

    @property
    def deadline(self) -> timedelta | None:
        """How long after its scheduled instant an occurrence may still start (None: no deadline)."""
        return timedelta(seconds=self.deadline_s) if self.deadline_s else None

    @property
    def gated(self) -> bool:
        """Whether its deliveries wait for the overlap gate (any policy but ``allow``)."""
        return self.overlap_policy != "allow"


#: A cohort member's DueSchedule fields that are its cohort's (lock_due_cohorts returns them once per cohort;
#: cohort_members only the others).
COHORT_FIELDS = (
    "kind", "expression", "time_zone", "dst_repeat", "dst_gap", "anchor", "end_at", "misfire_policy",
    "max_lateness_s", "calendar_id", "max_runs", "next_run_at", "shard", "cohort_id", "cohort_version",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class DueSchedule(_TimedSchedule):
    """A schedule as the materializer reads it (``due_schedules_of_shards``): with its shard, its tenant's
    fairness weight, and its payload as stored JSON text (spliced into the message without a decode)."""

    schedule_id: uuid.UUID
    tenant_id: str
    kind: timing.Kind
    expression: str
    time_zone: str
    dst_repeat: DstRepeat
    dst_gap: DstGap
    anchor: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    version: int
    next_run_at: datetime
    target: str
    payload_json: str
    priority: str
    flexible_window_s: int
    misfire_policy: str
    max_lateness_s: int
    deadline_s: int | None
    overlap_policy: str
    calendar_id: uuid.UUID | None
    max_runs: int | None
    runs: int
    shard: int
    weight: int
    cohort_id: uuid.UUID | None  # its cohort (migration 0026): next_run_at is then the cohort's cursor
    cohort_version: int | None  # the cohort's members_version as read (the pass's compare-and-set)

    @classmethod
    def of_member(cls, row: Mapping[str, Any], shared: tuple[Any, ...]) -> DueSchedule:
        """A cohort member from its row (``cohort_members``) and its cohort's values of COHORT_FIELDS."""
        build = _BUILDERS.get((cls, COHORT_FIELDS))
        if build is None:
            build = _BUILDERS[cls, COHORT_FIELDS] = _builder(cls, COHORT_FIELDS)
        member: DueSchedule = build(row, shared)
        return member

    @property
    def runs_left(self) -> int | None:
        """Runs ``max_runs`` still allows (None: no limit)."""
        return max(self.max_runs - self.runs, 0) if self.max_runs is not None else None


@dataclass(frozen=True, slots=True)
class Schedule(_TimedSchedule):
    """A whole ``schedules`` row."""

    schedule_id: uuid.UUID
    tenant_id: str
    kind: timing.Kind
    expression: str
    time_zone: str
    dst_repeat: DstRepeat
    dst_gap: DstGap
    anchor: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    version: int
    state: str
    next_run_at: datetime | None  # a cohort member's own is frozen: reads go through chronoq_effective_schedule
    target: str
    payload: Any
    priority: str
    flexible_window_s: int
    misfire_policy: str
    max_lateness_s: int
    overlap_policy: str
    retry_max_attempts: int
    retry_base_s: float
    retry_cap_s: float
    deadline_s: int | None
    shard: int
    created_by_key: str | None
    created_at: datetime
    updated_at: datetime
    fires_per_minute: float
    request_hash: str | None
    calendar_id: uuid.UUID | None
    calendar_name: str | None
    max_runs: int | None
    runs: int  # a cohort member's own is frozen too (its cohort's fires since cohort_base add to it)
    cohort_id: uuid.UUID | None  # its cohort (migration 0026), or None: its own cursor
    cohort_base: int | None  # its cohort's fires when it joined


@dataclass(frozen=True, slots=True)
class ScheduleVersion(_Record):
    """One version of a schedule, as its history records it."""

    schedule_id: uuid.UUID
    version: int
    tenant_id: str
    change: str
    state: str
    definition: dict[str, Any]
    next_run_at: datetime | None
    changed_at: datetime


@dataclass(frozen=True, slots=True)
class Occurrence(_Record):
    """A whole ``occurrences`` row."""

    occurrence_id: uuid.UUID
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: str
    target: str
    scheduled_for: datetime
    available_at: datetime
    state: str
    attempt_count: int
    enqueued_at: datetime | None
    created_at: datetime
    updated_at: datetime
    lease_token: uuid.UUID | None
    lease_expires_at: datetime | None
    attempt_floor: int
    replay_count: int
    dispatched_at: datetime | None
    finished_at: datetime | None
    last_error_class: str | None
    last_error_message: str | None
    dead_reason: str | None
    origin: str  # schedule (its own slots) | backfill | manual (trigger now)
    requested_by: str | None  # backfill / manual: the principal that asked
    canceled_by_version: int | None  # the schedule version whose change canceled it
    slot_released_at: datetime | None  # canceled before it was ever published: a newer version may run its instant


@dataclass(frozen=True, slots=True)
class LockedOccurrence(_Record):
    """An occurrence locked for an attempt decision (``lock_occurrence``), with what the decision needs:
    its schedule's current version, state and retry policy, and its tenant's retry budget."""

    occurrence_id: uuid.UUID
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: str
    target: str
    scheduled_for: datetime
    state: str
    attempt_count: int
    attempt_floor: int
    lease_token: uuid.UUID | None
    lease_expires_at: datetime | None
    current_version: int
    schedule_state: str
    retry_max_attempts: int
    retry_base_s: float
    retry_cap_s: float
    deadline_s: int | None
    priority: str
    payload: Any
    retry_budget_per_hour: int

    @property
    def obsolete(self) -> bool:
        """Its schedule changed since it was materialized (a newer version, or canceled)."""
        return self.current_version > self.schedule_version or self.schedule_state == "canceled"

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            self.retry_max_attempts, timedelta(seconds=self.retry_base_s), timedelta(seconds=self.retry_cap_s)
        )

    @property
    def counted_attempts(self) -> int:
        """Attempts that count against max_attempts: those since the last replay."""
        return self.attempt_count - self.attempt_floor

    @property
    def deadline(self) -> timedelta | None:
        return timedelta(seconds=self.deadline_s) if self.deadline_s else None


@dataclass(frozen=True, slots=True)
class Attempt(_Record):
    """A whole ``attempts`` row."""

    attempt_id: uuid.UUID
    occurrence_id: uuid.UUID
    attempt_number: int
    lease_token: uuid.UUID
    consumer_group: str | None
    started_at: datetime
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None
    finished_at: datetime | None
    result: str | None
    error_class: str | None
    error_message: str | None
    worker: str | None
    permanent: bool | None
    claim_order: int | None  # the consumer's dedupe transaction id, when its runtime sent one (migration 0015)
    scheduled_for: datetime  # its occurrence's: the day partition it lives in (migration 0016)


@dataclass(frozen=True, slots=True)
class DeadLetter(_Record):
    """A DEAD occurrence as the dead-letter list shows it (``list_dead_letters``)."""

    occurrence_id: uuid.UUID
    schedule_id: uuid.UUID
    schedule_version: int
    tenant_id: str
    target: str
    scheduled_for: datetime
    attempt_count: int
    replay_count: int
    dead_reason: str | None
    last_error_class: str | None
    last_error_message: str | None
    finished_at: datetime


@dataclass(frozen=True, slots=True)
class Calendar(_Record):
    """A whole ``calendars`` row; its dates are in the current version (:class:`CalendarVersion`)."""

    calendar_id: uuid.UUID
    tenant_id: str
    name: str
    version: int
    time_zone: str | None
    description: str
    entry_count: int
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None


@dataclass(frozen=True, slots=True)
class CalendarVersion(_Record):
    """One version of a calendar, as ``calendar_versions`` records it (``entries`` in their stored form)."""

    calendar_id: uuid.UUID
    version: int
    tenant_id: str
    change: str
    time_zone: str | None
    description: str
    entries: list[list[Any]]
    changed_at: datetime

    @property
    def dates(self) -> tuple[CalendarEntry, ...]:
        return entries_from_stored(self.entries)

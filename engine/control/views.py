"""JSON views of stored records: what the HTTP API, the CLI and command results show.

Field names are the API's (``max_attempts``, not ``retry_max_attempts``);
instants are ISO 8601 UTC with ``Z``. These shapes are a wire format: the
OpenAPI document (``engine/api/openapi.py``) describes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engine.control.schedule_requests import SCHEDULE_FIELDS
from engine.records import Attempt, DeadLetter, Occurrence, Schedule, ScheduleVersion
from schemas.messages import format_instant


def instant(value: datetime | None) -> str | None:
    return format_instant(value) if value else None


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    items: list[dict[str, Any]]
    next_cursor: str | None

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items, "next_cursor": self.next_cursor}


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    """The public representation of a schedule row (API field names)."""
    return {
        "schedule_id": str(schedule.schedule_id),
        "tenant_id": schedule.tenant_id,
        "kind": schedule.kind,
        "expression": schedule.expression,
        "time_zone": schedule.time_zone,
        "dst_repeat": schedule.dst_repeat,
        "dst_gap": schedule.dst_gap,
        "anchor": instant(schedule.anchor),
        "start_at": instant(schedule.start_at),
        "end_at": instant(schedule.end_at),
        "version": schedule.version,
        "state": schedule.state,
        "next_run_at": instant(schedule.next_run_at),
        "target": schedule.target,
        "payload": schedule.payload,
        "priority": schedule.priority,
        "flexible_window": schedule.flexible_window_s,
        "misfire_policy": schedule.misfire_policy,
        "max_lateness": schedule.max_lateness_s,
        "overlap_policy": schedule.overlap_policy,
        "max_attempts": schedule.retry_max_attempts,
        "retry_base": schedule.retry_base_s,
        "retry_cap": schedule.retry_cap_s,
        "deadline": schedule.deadline_s,
        "exclusion_calendar": schedule.calendar_name,
        "max_runs": schedule.max_runs,
        "runs": schedule.runs,
        "created_at": instant(schedule.created_at),
        "updated_at": instant(schedule.updated_at),
    }


def definition_of(schedule: Schedule) -> dict[str, Any]:
    """A stored schedule's definition under API field names (what create/update accept)."""
    data = schedule_to_json(schedule)
    return {name: data[name] for name in SCHEDULE_FIELDS if data.get(name) is not None}


def version_to_json(version: ScheduleVersion) -> dict[str, Any]:
    """One entry of a schedule's version history."""
    return {
        "version": version.version,
        "change": version.change,
        "state": version.state,
        "definition": version.definition,
        "next_run_at": instant(version.next_run_at),
        "changed_at": instant(version.changed_at),
    }


def occurrence_to_json(occurrence: Occurrence) -> dict[str, Any]:
    return {
        "occurrence_id": str(occurrence.occurrence_id),
        "schedule_id": str(occurrence.schedule_id),
        "schedule_version": occurrence.schedule_version,
        "tenant_id": occurrence.tenant_id,
        "target": occurrence.target,
        "scheduled_for": instant(occurrence.scheduled_for),
        "available_at": instant(occurrence.available_at),
        "state": occurrence.state,
        "attempt_count": occurrence.attempt_count,
        "enqueued_at": instant(occurrence.enqueued_at),
        "canceled_by_version": occurrence.canceled_by_version,
        "slot_released": occurrence.slot_released_at is not None,
        "created_at": instant(occurrence.created_at),
        "updated_at": instant(occurrence.updated_at),
        "origin": occurrence.origin,
        "requested_by": occurrence.requested_by,
    }


def attempt_to_json(attempt: Attempt) -> dict[str, Any]:
    return {
        "attempt_id": str(attempt.attempt_id),
        "attempt_number": attempt.attempt_number,
        "lease_token": str(attempt.lease_token),
        "consumer_group": attempt.consumer_group,
        "started_at": instant(attempt.started_at),
        "finished_at": instant(attempt.finished_at),
        "result": attempt.result,
        "error_class": attempt.error_class,
        "error_message": attempt.error_message,
    }


def dead_letter_to_json(dead: DeadLetter) -> dict[str, Any]:
    return {
        "occurrence_id": str(dead.occurrence_id),
        "schedule_id": str(dead.schedule_id),
        "schedule_version": dead.schedule_version,
        "tenant_id": dead.tenant_id,
        "target": dead.target,
        "scheduled_for": instant(dead.scheduled_for),
        "attempts": dead.attempt_count,
        "replays": dead.replay_count,
        "reason": dead.dead_reason,
        "error_class": dead.last_error_class,
        "error_message": dead.last_error_message,
        "died_at": instant(dead.finished_at),
    }

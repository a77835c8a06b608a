"""JSON views of stored rows: what the HTTP API, the CLI and command results show.

Field names are the API's (``max_attempts``, not ``retry_max_attempts``);
instants are ISO 8601 UTC with ``Z``. These shapes are a wire format: the
OpenAPI document (``engine/api/openapi.py``) describes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from engine.control.schedule_requests import SCHEDULE_FIELDS
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


def schedule_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """The public representation of a schedule row (API field names)."""
    return {
        "schedule_id": str(row["schedule_id"]),
        "tenant_id": row["tenant_id"],
        "kind": row["kind"],
        "expression": row["expression"],
        "time_zone": row["time_zone"],
        "dst_repeat": row["dst_repeat"],
        "dst_gap": row["dst_gap"],
        "anchor": instant(row["anchor"]),
        "start_at": instant(row["start_at"]),
        "end_at": instant(row["end_at"]),
        "version": row["version"],
        "state": row["state"],
        "next_run_at": instant(row["next_run_at"]),
        "target": row["target"],
        "payload": row["payload"],
        "priority": row["priority"],
        "flexible_window": row["flexible_window_s"],
        "misfire_policy": row["misfire_policy"],
        "max_lateness": row["max_lateness_s"],
        "overlap_policy": row["overlap_policy"],
        "max_attempts": row["retry_max_attempts"],
        "retry_base": row["retry_base_s"],
        "retry_cap": row["retry_cap_s"],
        "deadline": row["deadline_s"],
        "created_at": instant(row["created_at"]),
        "updated_at": instant(row["updated_at"]),
    }


def definition_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored schedule's definition under API field names (what create/update accept)."""
    data = schedule_to_json(row)
    return {name: data[name] for name in SCHEDULE_FIELDS if data.get(name) is not None}


def version_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """One entry of a schedule's version history."""
    return {"version": row["version"], "change": row["change"], "state": row["state"],
            "definition": row["definition"], "next_run_at": instant(row["next_run_at"]),
            "changed_at": instant(row["changed_at"])}


def occurrence_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "occurrence_id": str(row["occurrence_id"]), "schedule_id": str(row["schedule_id"]),
        "schedule_version": row["schedule_version"], "tenant_id": row["tenant_id"], "target": row["target"],
        "scheduled_for": instant(row["scheduled_for"]), "available_at": instant(row["available_at"]),
        "state": row["state"], "attempt_count": row["attempt_count"], "enqueued_at": instant(row["enqueued_at"]),
        "created_at": instant(row["created_at"]), "updated_at": instant(row["updated_at"]),
    }


def attempt_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "attempt_id": str(row["attempt_id"]), "attempt_number": row["attempt_number"],
        "lease_token": str(row["lease_token"]), "consumer_group": row["consumer_group"],
        "started_at": instant(row["started_at"]), "finished_at": instant(row["finished_at"]),
        "result": row["result"], "error_class": row["error_class"], "error_message": row["error_message"],
    }


def dead_letter_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "occurrence_id": str(row["occurrence_id"]), "schedule_id": str(row["schedule_id"]),
        "schedule_version": row["schedule_version"], "tenant_id": row["tenant_id"], "target": row["target"],
        "scheduled_for": instant(row["scheduled_for"]), "attempts": row["attempt_count"],
        "replays": row["replay_count"], "reason": row["dead_reason"], "error_class": row["last_error_class"],
        "error_message": row["last_error_message"], "died_at": instant(row["finished_at"]),
    }

"""The OpenAPI 3 document of the HTTP API (served at ``/openapi.json``).

Written by hand next to the routes it describes; the API fuzz test generates
requests from it, so a field added to a route without being added here goes
untested.
"""

from __future__ import annotations

from typing import Any

from engine.control.pagination import MAX_CURSOR, MAX_PAGE
from engine.control.schedule_requests import DURATIONS, MAX_PAYLOAD_BYTES, DurationRange
from engine.rules.cron_expression import MAX_EXPRESSION_LENGTH
from engine.rules.timing.zones import zone_keys
from schemas.commands import MAX_IDEMPOTENCY_KEY

# The constraints below are the ones the server enforces (engine/control_plane.py, engine/timing.py), so a
# generated client or a fuzzer sees the truth. Where the server's rule is not expressible in JSON Schema
# (a cron expression that can never fire, retry_cap >= retry_base, end_at after start_at), the schema
# describes a subset that is always accepted and the description states the rule.

_YEARS = "(19\\d\\d|[2-8]\\d\\d\\d)"  # 1900-8999: user-given instants, after their offset
_DATE_TIME = "-(0[1-9]|1[0-2])-(0[1-9]|1\\d|2[0-8])T([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?Z"
_INSTANT_PATTERN = f"^{_YEARS}{_DATE_TIME}$"
_FUTURE_PATTERN = f"^(2[1-9]\\d\\d|[3-8]\\d\\d\\d){_DATE_TIME}$"  # a one-time instant that is surely ahead
_INSTANT: dict[str, Any] = {
    "type": "string",
    "pattern": _INSTANT_PATTERN,
    "maxLength": 40,
    "example": "2026-11-29T10:00:00Z",
    "description": "ISO-8601 instant with an offset or Z, in the years 1900-8999 once converted to UTC",
}
_NULLABLE_INSTANT = {"type": "string", "format": "date-time", "nullable": True}
_ZONES = sorted(zone_keys())
_CRON = "^(\\*|[1-5]?\\d) (\\*|1?\\d|2[0-3]) (\\*|[1-9]|1\\d|2[0-8]) (\\*|[1-9]|1[0-2]) (\\*|[0-6])$"


def _duration(name: str, limits: DurationRange, note: str = "") -> dict[str, Any]:
    low, high = limits.minimum.total_seconds(), limits.maximum.total_seconds()
    number: dict[str, Any] = (
        {"type": "integer", "minimum": int(low), "maximum": int(high)}
        if limits.whole_seconds
        else {"type": "number", "minimum": low, "maximum": high}
    )
    # Strings: numbers with units d h m s in that order, whole seconds. The pattern keeps each part small
    # enough that any match lies in range; longer forms the server also accepts are described.
    if high <= 86400:
        pattern = "^(([01]?\\d|2[0-3])h)?([1-5]?\\dm)?([1-5]?\\ds)?$"
    else:
        pattern = "^([1-9]\\d{0,2}d)?(([01]?\\d|2[0-3])h)?([1-5]?\\dm)?([1-5]?\\ds)?$"
    unit = "whole seconds" if limits.whole_seconds else "seconds, fractions honoured to the millisecond"
    text = {"type": "string", "pattern": pattern, "minLength": 2, "maxLength": 20, "example": "90s"}
    if low >= 1:
        text["not"] = {"pattern": "^(0+[dhms])+$"}
    return {
        "oneOf": [text, number],
        "description": f"{name}: a duration from {low:g} to {high:g} s ({unit}); a number is seconds, a string"
        " is like '90s', '15m', '1h30m', '2d' (units d, h, m, s in that order)" + note,
    }


_DURATIONS = {name: _duration(name, limits) for name, limits in DURATIONS.items()}
_TARGET = {
    "type": "string",
    "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
    "example": "billing.invoice",
    "description": "the handler that consumes the occurrences; it belongs to the tenant that first uses it"
    " (or that an operator granted it to): another tenant's target is a 403",
}
_TIME_ZONE = {"$ref": "#/components/schemas/TimeZone"}
_PAYLOAD = {
    "description": f"any JSON value, at most the tenant's payload quota ({MAX_PAYLOAD_BYTES} bytes"
    " encoded by default), nested at most 64 levels, without NUL (U+0000) in any string"
    " or key"
}
_POLICIES: dict[str, Any] = {
    "target": _TARGET,
    "payload": _PAYLOAD,
    "misfire_policy": {
        "type": "string",
        "pattern": "^(skip|fire_once|catch_up:([1-9]\\d{0,2}|1000))$",
        "example": "catch_up:3",
        "description": "skip | fire_once | catch_up:K (K 1..1000)",
    },
    "max_lateness": _DURATIONS["max_lateness"],
    "overlap_policy": {"type": "string", "enum": ["allow", "skip_if_running", "queue_one"]},
    "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
    "retry_base": _DURATIONS["retry_base"],
    "retry_cap": _duration(
        "retry_cap",
        DURATIONS["retry_cap"],
        "; at least retry_base (when both are given; a default adapts to the other)",
    ),
    "deadline": _DURATIONS["deadline"],
    "exclusion_calendar": {
        "type": "string",
        "nullable": True,
        "pattern": "^[a-z0-9][a-z0-9_.-]{0,62}$",
        "example": "de-holidays",
        "description": "name of one of the tenant's calendars (404 if it has none of that name): fires on its"
        " dates are skipped",
    },
    "max_runs": {
        "type": "integer",
        "minimum": 1,
        "maximum": 1000000000,
        "nullable": True,
        "description": "the schedule completes after this many runs (occurrences materialized to run)",
    },
}
# end_at must lie ahead (the schedule must still fire before it), which a schema cannot say relative to
# now: the pattern states years from 2100, always ahead; nearer ends are accepted too.
_BOUNDS: dict[str, Any] = {
    "start_at": _INSTANT,
    "end_at": {
        **_INSTANT,
        "pattern": _FUTURE_PATTERN,
        "description": _INSTANT["description"] + "; not before start_at, and the schedule must fire before it (any such"
        " instant is accepted; the pattern shows years from 2100)",
    },
}
_KINDS: dict[str, dict[str, Any]] = {
    "cron": {
        "expression": {
            "type": "string",
            "pattern": _CRON,
            "maxLength": MAX_EXPRESSION_LENGTH,
            "example": "0 9 * * 1",
            "description": "a five-field cron expression in the time"
            " zone's wall-clock time (names, ranges, lists and steps are accepted too; an"
            " expression that never fires is refused)",
        },
        "time_zone": _TIME_ZONE,
        "dst_repeat": {"type": "string", "enum": ["first", "both"]},
        "dst_gap": {"type": "string", "enum": ["skip", "shift"]},
        **_BOUNDS,
    },
    "rate": {
        "expression": {**_DURATIONS["deadline"]["oneOf"][0], "description": "the period, at least 1s"},
        "time_zone": _TIME_ZONE,
        "anchor": _INSTANT,
        **_BOUNDS,
    },
    "once": {
        "expression": {
            "type": "string",
            "pattern": _FUTURE_PATTERN,
            "maxLength": 40,
            "example": "2127-03-01T09:00:00Z",
            "description": "the instant (ISO-8601 with an offset); in the past by more than"
            " max_lateness it is refused. start_at/end_at are accepted when they bracket it",
        },
        "time_zone": _TIME_ZONE,
    },
}
_PRIORITIES: dict[str, dict[str, Any]] = {
    "strict": {"priority": {"type": "string", "enum": ["strict"]}},
    "flexible": {
        "priority": {"type": "string", "enum": ["flexible"]},
        "flexible_window": {
            **_DURATIONS["flexible_window"],
            "description": _DURATIONS["flexible_window"]["description"] + " (default 5m)",
        },
    },
}


def _create_branch(kind: str, priority: str) -> dict[str, Any]:
    required = ["kind", "expression", "target"] + (["priority"] if priority == "flexible" else [])
    return {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": {
            "kind": {"type": "string", "enum": [kind]},
            **_KINDS[kind],
            **_POLICIES,
            **_PRIORITIES[priority],
        },
    }


def _update_branch(kind: str | None) -> dict[str, Any]:
    """A change is merged into the stored definition: a new expression comes with its kind (so it never
    meets the stored one of another kind); without them, the fields that apply to every kind."""
    common = {
        **_POLICIES,
        "priority": _DEFINITION["priority"],
        "flexible_window": _DEFINITION["flexible_window"],
        "time_zone": _TIME_ZONE,
        "expected_version": {
            "type": "integer",
            "minimum": 1,
            "description": "apply only if the schedule is still at this version (409 otherwise)",
        },
    }
    if kind is None:
        # expected_version alone changes nothing: at least one other field
        return {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": False,
            "properties": common,
            "not": {"required": ["expected_version"], "maxProperties": 1},
        }
    return {
        "type": "object",
        "required": ["kind", "expression"],
        "additionalProperties": False,
        "properties": {"kind": {"type": "string", "enum": [kind]}, **_KINDS[kind], **common},
    }


def _preview_branch(kind: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["kind", "expression"],
        "additionalProperties": False,
        "properties": {
            "kind": {"type": "string", "enum": [kind]},
            **_KINDS[kind],
            "from": _INSTANT,
            "count": {"type": "integer", "minimum": 1, "maximum": 1000},
            "exclusion_calendar": _POLICIES["exclusion_calendar"],
            "max_runs": _POLICIES["max_runs"],
        },
    }


_DEFINITION: dict[str, Any] = {
    "kind": {"type": "string", "enum": ["once", "cron", "rate"]},
    "expression": {
        "type": "string",
        "maxLength": MAX_EXPRESSION_LENGTH,
        "description": "cron expression (kind=cron), ISO-8601 instant (once) or duration (rate)",
    },
    **{name: schema for branch in _KINDS.values() for name, schema in branch.items() if name != "expression"},
    **_POLICIES,
    "priority": {"type": "string", "enum": ["strict", "flexible"]},
    "flexible_window": _DURATIONS["flexible_window"],
}

_CALENDAR_NAME = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]{0,62}$", "example": "de-holidays"}
_DATE = {"type": "string", "format": "date", "example": "2026-12-25"}
_DATE_ITEM = {
    "oneOf": [
        {"type": "string", "example": "2026-12-24/2026-12-26", "description": "YYYY-MM-DD or YYYY-MM-DD/YYYY-MM-DD"},
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["date"],
            "properties": {"date": _DATE, "label": {"type": "string", "maxLength": 200}},
        },
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["start"],
            "properties": {"start": _DATE, "end": _DATE, "label": {"type": "string", "maxLength": 200}},
        },
    ]
}
_CALENDAR_FIELDS: dict[str, Any] = {
    "time_zone": {
        "type": "string",
        "nullable": True,
        "example": "Europe/Berlin",
        "description": "the clock the dates are read on; null: each referencing schedule's zone",
    },
    "description": {"type": "string", "maxLength": 500},
    "dates": {
        "type": "array",
        "maxItems": 10000,
        "items": _DATE_ITEM,
        "description": "dates and inclusive date ranges; on update, replaces the whole list",
    },
}
_CALENDAR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": _CALENDAR_NAME,
        "calendar_id": {"type": "string", "format": "uuid"},
        "tenant_id": {"type": "string"},
        "version": {"type": "integer"},
        "date_count": {"type": "integer"},
        "created_at": _INSTANT,
        "updated_at": _INSTANT,
        "deleted": {"type": "boolean"},
        "imported": {"type": "object", "description": "on import: events read, cancelled ones skipped, entries"},
        "created": {"type": "boolean", "description": "on import: the calendar did not exist"},
        **{k: v for k, v in _CALENDAR_FIELDS.items() if k != "dates"},
        "dates": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"start": _DATE, "end": _DATE, "label": {"type": "string", "nullable": True}},
            },
        },
    },
    "required": ["name", "calendar_id", "version", "time_zone", "date_count"],
}

_SCHEDULE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "schedule_id": {"type": "string", "format": "uuid"},
        "tenant_id": {"type": "string"},
        "version": {"type": "integer"},
        "state": {"type": "string", "enum": ["active", "paused", "canceled", "completed"]},
        "next_run_at": _NULLABLE_INSTANT,
        "created_at": _INSTANT,
        "updated_at": _INSTANT,
        "canceled_occurrences": {
            "type": "integer",
            "description": "on changes: unfinished occurrences of older versions now CANCELED",
        },
        "released_slots": {
            "type": "integer",
            "description": "on changes: of the canceled ones, never published; the new version may run their"
            " instants (from the cursor, under the misfire policy)",
        },
        "still_running": {
            "type": "integer",
            "description": "on changes: RUNNING occurrences of older versions, not canceled; they finish and a"
            " failure is not retried",
        },
        "runs": {"type": "integer", "description": "runs so far (counted against max_runs)"},
        **_DEFINITION,
    },
    "required": ["schedule_id", "tenant_id", "version", "state", "next_run_at", "kind", "expression", "target"],
}

_OCCURRENCE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "occurrence_id": {"type": "string", "format": "uuid"},
        "schedule_id": {"type": "string", "format": "uuid"},
        "schedule_version": {"type": "integer"},
        "tenant_id": {"type": "string"},
        "target": {"type": "string"},
        "scheduled_for": _INSTANT,
        "available_at": _INSTANT,
        "state": {
            "type": "string",
            "enum": [
                "SCHEDULED",
                "ENQUEUED",
                "RUNNING",
                "SUCCEEDED",
                "RETRY_WAIT",
                "DEAD",
                "MISSED",
                "CANCELED",
                "SKIPPED_OVERLAP",
            ],
        },
        "attempt_count": {"type": "integer"},
        "enqueued_at": _NULLABLE_INSTANT,
        "canceled_by_version": {
            "type": "integer",
            "nullable": True,
            "description": "the schedule version whose change (update, pause, cancel) canceled it",
        },
        "slot_released": {
            "type": "boolean",
            "description": "canceled before it was ever published: a newer version may run its instant",
        },
        "attempts": {"type": "array", "items": {"type": "object"}},
    },
    "required": ["occurrence_id", "schedule_id", "state", "scheduled_for"],
}


def _page(item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["items", "next_cursor"],
        "properties": {
            "items": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}},
            "next_cursor": {"type": "string", "nullable": True},
        },
    }


def _json(schema_ref: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    meaning = {
        400: "bad request",
        401: "missing or invalid bearer token",
        403: "the tenant may not use this target (another tenant's): the error names the field",
        404: "not found (or another tenant's)",
        405: "method not allowed",
        409: "conflict (idempotency key reused, final state)",
        413: "body too large",
        422: "invalid input: the error names the field",
        429: "tenant quota exceeded",
        503: "database unavailable, retry",
    }
    return {str(code): {"description": meaning[code], **_json("Error")} for code in codes}


_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
_NAME = {"name": "name", "in": "path", "required": True, "schema": _CALENDAR_NAME}
_PAGING = [
    {
        "name": "cursor",
        "in": "query",
        "description": "the next_cursor of the previous page (anything else is a 422 naming cursor)",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$", "maxLength": MAX_CURSOR},
    },
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}},
]
_COMMON = (401, 422, 503)


_OPERATION_IDS = {
    ("post", "/v1/schedules"): "createSchedule",
    ("get", "/v1/schedules"): "listSchedules",
    ("get", "/v1/schedules/{id}"): "getSchedule",
    ("patch", "/v1/schedules/{id}"): "updateSchedule",
    ("post", "/v1/schedules/{id}/pause"): "pauseSchedule",
    ("post", "/v1/schedules/{id}/resume"): "resumeSchedule",
    ("post", "/v1/schedules/{id}/cancel"): "cancelSchedule",
    ("get", "/v1/schedules/{id}/occurrences"): "listOccurrences",
    ("get", "/v1/schedules/{id}/versions"): "listVersions",
    ("get", "/v1/occurrences/{id}"): "getOccurrence",
    ("get", "/v1/dead-letters"): "listDeadLetters",
    ("get", "/v1/tenant"): "getTenant",
    ("post", "/v1/occurrences/{id}/replay"): "replayOccurrence",
    ("post", "/v1/preview"): "preview",
}
# Links let a stateful fuzzer follow a created schedule through its lifecycle instead of guessing ids.
_SCHEDULE_LINKS = {
    operation[0].upper() + operation[1:]: {
        "operationId": operation,
        "parameters": {"id": "$response.body#/schedule_id"},
    }
    for operation in (
        "getSchedule",
        "updateSchedule",
        "pauseSchedule",
        "resumeSchedule",
        "cancelSchedule",
        "listOccurrences",
        "listVersions",
    )
}
_OCCURRENCE_LINKS = {
    operation[0].upper() + operation[1:]: {
        "operationId": operation,
        "parameters": {"id": "$response.body#/items/0/occurrence_id"},
    }
    for operation in ("getOccurrence", "replayOccurrence")
}


def _lifecycle(summary: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [_ID],
            "responses": {
                "200": {"description": "the schedule after the change", **_json("Schedule"), "links": _SCHEDULE_LINKS},
                **_errors(404, 409, *_COMMON),
            },
        }
    }


_BACKFILL_WINDOW = {
    "type": "object",
    "required": ["from", "to"],
    "additionalProperties": False,
    "properties": {"from": _INSTANT, "to": {**_INSTANT, "description": "not in the future"}},
}

#: The operator features' schemas and routes (engine/api/operator_routes.py, docs/console.md).
_OPERATOR_SCHEMAS: dict[str, Any] = {
    "BatchRequest": {
        "type": "object",
        "required": ["items"],
        "additionalProperties": False,
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 1000,
                "items": {
                    "type": "object",
                    "required": ["idempotency_key", "schedule"],
                    "properties": {
                        "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 200},
                        "schedule": {"$ref": "#/components/schemas/ScheduleCreate"},
                    },
                },
            }
        },
    },
    "BatchResult": {
        "type": "object",
        "required": ["results", "statuses"],
        "properties": {
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "status"],
                    "properties": {
                        "index": {"type": "integer"},
                        "status": {"type": "integer", "enum": [200, 201, 409, 422, 429]},
                        "schedule": {"type": "object"},
                        "error": {"type": "object"},
                    },
                },
            },
            "statuses": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
    },
    "BackfillRequest": _BACKFILL_WINDOW,
    "Backfill": {
        "type": "object",
        "required": ["slots", "created", "refired", "present"],
        "properties": {
            "schedule_id": {"type": "string", "format": "uuid"},
            "version": {"type": "integer"},
            "slots": {"type": "integer"},
            "created": {"type": "integer"},
            "refired": {"type": "integer"},
            "present": {"type": "object", "additionalProperties": {"type": "integer"}},
            "first_release": _NULLABLE_INSTANT,
            "last_release": _NULLABLE_INSTANT,
        },
    },
    "Timeline": {
        "type": "object",
        "required": ["entries", "counts", "truncated"],
        "properties": {
            "from": _INSTANT,
            "to": _INSTANT,
            "truncated": {"type": "boolean"},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "entries": {"type": "array", "items": {"type": "object"}},
        },
    },
}

_OPERATOR_PATHS: dict[str, Any] = {
    "/v1/schedules/batch": {
        "post": {
            "summary": "Create up to 1,000 schedules, each with its own idempotency key and result",
            "requestBody": {"required": True, **_json("BatchRequest")},
            "responses": {
                "200": {"description": "one result per item", **_json("BatchResult")},
                **_errors(404, 409, 413, *_COMMON),
            },
        }
    },
    "/v1/schedules/{id}/backfill": {
        "post": {
            "summary": "Fire the past slots of a window that never ran (same occurrence ids; paced by the"
            " tenant's catch-up quota)",
            "parameters": [_ID],
            "requestBody": {"required": True, **_json("BackfillRequest")},
            "responses": {
                "200": {"description": "what each slot got", **_json("Backfill")},
                **_errors(404, 409, 429, *_COMMON),
            },
        }
    },
    "/v1/schedules/{id}/trigger": {
        "post": {
            "summary": "Run the schedule now: one manual occurrence (the overlap policy applies)",
            "parameters": [
                _ID,
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                },
            ],
            "responses": {
                "201": {"description": "created", **_json("Occurrence")},
                "200": {"description": "the key was used before", **_json("Occurrence")},
                **_errors(404, 409, *_COMMON),
            },
        }
    },
    "/v1/schedules/{id}/timeline": {
        "get": {
            "summary": "Every expected slot in a window and what happened to it",
            "parameters": [
                _ID,
                {"name": "from", "in": "query", "schema": _INSTANT},
                {"name": "to", "in": "query", "schema": _INSTANT},
            ],
            "responses": {"200": {"description": "the timeline", **_json("Timeline")}, **_errors(404, *_COMMON)},
        }
    },
}


def openapi_document() -> dict[str, Any]:
    document = _document()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            operation["operationId"] = _OPERATION_IDS.get((method, path)) or _operation_id(method, path)
    return document


def _operation_id(method: str, path: str) -> str:
    """An id for an operation without a chosen one: the method and the path's words, camel-cased."""
    words = [w.strip("{}") for w in path.removeprefix("/v1/").replace("-", "/").split("/") if w]
    return method + "".join(w[:1].upper() + w[1:] for w in words)


def _document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "chronoq control plane",
            "version": "1",
            "description": "Create, inspect and change schedules and exclusion calendars. Every /v1 call"
            " is scoped to the tenant of the bearer token.",
        },
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                **_OPERATOR_SCHEMAS,
                "ScheduleCreate": {
                    "oneOf": [_create_branch(kind, priority) for kind in _KINDS for priority in _PRIORITIES]
                },
                "ScheduleUpdate": {"oneOf": [_update_branch(kind) for kind in (*_KINDS, None)]},
                "Schedule": _SCHEDULE,
                "TimeZone": {
                    "type": "string",
                    "enum": _ZONES,
                    "example": "Europe/Berlin",
                    "description": "an IANA zone name",
                },
                "SchedulePage": _page("Schedule"),
                "Occurrence": _OCCURRENCE,
                "OccurrencePage": _page("Occurrence"),
                "DeadLetter": {
                    "type": "object",
                    "properties": {
                        "occurrence_id": {"type": "string", "format": "uuid"},
                        "schedule_id": {"type": "string"},
                        "reason": {"type": "string"},
                        "error_class": {"type": "string", "nullable": True},
                        "error_message": {"type": "string", "nullable": True},
                        "attempts": {"type": "integer"},
                        "died_at": _NULLABLE_INSTANT,
                    },
                },
                "DeadLetterPage": _page("DeadLetter"),
                "Tenant": {
                    "type": "object",
                    "required": ["tenant_id", "quotas", "usage"],
                    "properties": {
                        "tenant_id": {"type": "string"},
                        "quotas": {
                            "type": "object",
                            "description": "the tenant's limits (docs/control-plane.md, Tenants)",
                            "properties": {
                                name: {"type": "number" if name == "max_fires_per_minute" else "integer"}
                                for name in (
                                    "max_active_schedules",
                                    "max_fires_per_minute",
                                    "max_payload_bytes",
                                    "max_running",
                                    "catch_up_per_minute",
                                    "retry_budget_per_hour",
                                    "weight",
                                )
                            },
                        },
                        "usage": {
                            "type": "object",
                            "description": "what counts against max_active_schedules, max_fires_per_minute and "
                            "max_running now",
                            "required": ["schedules", "fires_per_minute", "open_occurrences"],
                            "properties": {
                                "schedules": {"type": "integer", "description": "live (active or paused)"},
                                "fires_per_minute": {"type": "number", "description": "their summed trigger rate"},
                                "open_occurrences": {
                                    "type": "integer",
                                    "description": "occurrences SCHEDULED, ENQUEUED, RUNNING or RETRY_WAIT "
                                    "(max_running bounds them; further first deliveries wait, held)",
                                },
                            },
                        },
                    },
                },
                "Replay": {
                    "type": "object",
                    "required": ["occurrence_id", "state", "attempt"],
                    "properties": {
                        "occurrence_id": {"type": "string", "format": "uuid"},
                        "schedule_id": {"type": "string"},
                        "tenant_id": {"type": "string"},
                        "state": {"type": "string"},
                        "attempt": {"type": "integer"},
                        "replays": {"type": "integer"},
                        "available_at": _INSTANT,
                    },
                },
                "VersionList": {
                    "type": "object",
                    "properties": {"items": {"type": "array", "items": {"type": "object"}}},
                },
                "PreviewRequest": {"oneOf": [_preview_branch(kind) for kind in _KINDS]},
                "Preview": {
                    "type": "object",
                    "required": ["fires", "excluded", "excluded_dates"],
                    "properties": {
                        "fires": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "utc": _INSTANT,
                                    "local": {"type": "string"},
                                    "rule": {
                                        "type": "string",
                                        "example": "day-of-week TUE#2: second Tuesday of the month",
                                        "description": "which rule produced the fire (and what daylight saving did)",
                                    },
                                },
                            },
                        },
                        "excluded": {
                            "type": "array",
                            "description": "fires the exclusion calendar removes in the window",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "utc": _INSTANT,
                                    "local": {"type": "string"},
                                    "date": _DATE,
                                    "label": {"type": "string", "nullable": True},
                                },
                            },
                        },
                        "excluded_dates": {
                            "type": "array",
                            "description": "the calendar's entries in the window",
                            "items": {"type": "object"},
                        },
                        "runs_left": {"type": "integer", "description": "with max_runs: runs left"},
                        "schedule_id": {"type": "string"},
                        "state": {"type": "string"},
                    },
                },
                "CalendarCreate": {
                    "type": "object",
                    "required": ["name", "dates"],
                    "additionalProperties": False,
                    "properties": {"name": _CALENDAR_NAME, **_CALENDAR_FIELDS},
                },
                "CalendarUpdate": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": False,
                    "properties": {
                        **_CALENDAR_FIELDS,
                        "expected_version": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "apply only if the calendar is still at this version",
                        },
                    },
                },
                "Calendar": _CALENDAR,
                "CalendarPage": _page("Calendar"),
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "field": {"type": "string"},
                            },
                        }
                    },
                },
            },
        },
        "paths": {
            "/v1/schedules": {
                "post": {
                    "summary": "Create a schedule (idempotent with Idempotency-Key)",
                    "parameters": [
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY},
                        }
                    ],
                    "requestBody": {"required": True, **_json("ScheduleCreate")},
                    "responses": {
                        "201": {
                            "description": "created (or the same request replayed)",
                            **_json("Schedule"),
                            "links": _SCHEDULE_LINKS,
                        },
                        **_errors(400, 403, 404, 409, 413, 429, *_COMMON),
                    },
                },
                "get": {
                    "summary": "List the tenant's schedules",
                    "parameters": [
                        {
                            "name": "state",
                            "in": "query",
                            "schema": {"type": "string", "enum": ["active", "paused", "canceled", "completed"]},
                        },
                        {"name": "target", "in": "query", "schema": _TARGET},
                        *_PAGING,
                    ],
                    "responses": {"200": {"description": "a page", **_json("SchedulePage")}, **_errors(*_COMMON)},
                },
            },
            "/v1/schedules/{id}": {
                "get": {
                    "summary": "One schedule",
                    "parameters": [_ID],
                    "responses": {
                        "200": {"description": "the schedule", **_json("Schedule")},
                        **_errors(404, *_COMMON),
                    },
                },
                "patch": {
                    "summary": "Change a schedule: a new version; unclaimed older occurrences are canceled",
                    "parameters": [_ID],
                    "requestBody": {"required": True, **_json("ScheduleUpdate")},
                    "responses": {
                        "200": {"description": "the new version", **_json("Schedule"), "links": _SCHEDULE_LINKS},
                        **_errors(400, 403, 404, 409, 429, *_COMMON),
                    },
                },
            },
            "/v1/schedules/{id}/pause": _lifecycle("Pause: no fires until resumed"),
            "/v1/schedules/{id}/resume": _lifecycle("Resume from the durable cursor under the misfire policy"),
            "/v1/schedules/{id}/cancel": _lifecycle("Cancel for good; nothing is deleted"),
            "/v1/schedules/{id}/occurrences": {
                "get": {
                    "summary": "The schedule's occurrences, oldest first",
                    "parameters": [_ID, *_PAGING],
                    "responses": {
                        "200": {"description": "a page", **_json("OccurrencePage"), "links": _OCCURRENCE_LINKS},
                        **_errors(404, *_COMMON),
                    },
                }
            },
            "/v1/schedules/{id}/versions": {
                "get": {
                    "summary": "The schedule's version history",
                    "parameters": [_ID],
                    "responses": {
                        "200": {"description": "every version", **_json("VersionList")},
                        **_errors(404, *_COMMON),
                    },
                }
            },
            "/v1/occurrences/{id}": {
                "get": {
                    "summary": "One occurrence with its attempts",
                    "parameters": [_ID],
                    "responses": {
                        "200": {"description": "the occurrence", **_json("Occurrence")},
                        **_errors(404, *_COMMON),
                    },
                }
            },
            "/v1/dead-letters": {
                "get": {
                    "summary": "DEAD occurrences of the tenant, oldest death first",
                    "parameters": _PAGING,
                    "responses": {"200": {"description": "a page", **_json("DeadLetterPage")}, **_errors(*_COMMON)},
                }
            },
            "/v1/tenant": {
                "get": {
                    "summary": "The calling tenant's quotas and its usage of them",
                    "responses": {"200": {"description": "the tenant", **_json("Tenant")}, **_errors(401, 503)},
                }
            },
            "/v1/occurrences/{id}/replay": {
                "post": {
                    "summary": "Re-enqueue a DEAD occurrence with the same occurrence_id",
                    "parameters": [_ID],
                    "responses": {
                        "200": {"description": "the occurrence, RETRY_WAIT with a delivery due now", **_json("Replay")},
                        **_errors(404, 409, *_COMMON),
                    },
                }
            },
            **_OPERATOR_PATHS,
            "/v1/schedules/{id}/preview": {
                "get": {
                    "summary": "The next fires of a stored schedule: its calendar's current version, its runs left",
                    "parameters": [
                        _ID,
                        {"name": "from", "in": "query", "schema": _INSTANT},
                        {"name": "count", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                    ],
                    "responses": {
                        "200": {"description": "fires and exclusions", **_json("Preview")},
                        **_errors(404, *_COMMON),
                    },
                }
            },
            "/v1/calendars": {
                "post": {
                    "summary": "Create an exclusion calendar (409 if the name is taken)",
                    "requestBody": {"required": True, **_json("CalendarCreate")},
                    "responses": {
                        "201": {"description": "created", **_json("Calendar")},
                        **_errors(400, 404, 409, 413, *_COMMON),
                    },
                },
                "get": {
                    "summary": "List the tenant's calendars (without their dates)",
                    "parameters": _PAGING,
                    "responses": {"200": {"description": "a page", **_json("CalendarPage")}, **_errors(*_COMMON)},
                },
            },
            "/v1/calendars/{name}": {
                "get": {
                    "summary": "One calendar with its dates",
                    "parameters": [_NAME],
                    "responses": {
                        "200": {"description": "the calendar", **_json("Calendar")},
                        **_errors(404, *_COMMON),
                    },
                },
                "patch": {
                    "summary": "Change a calendar: a new version, for every slot not yet materialized",
                    "parameters": [_NAME],
                    "requestBody": {"required": True, **_json("CalendarUpdate")},
                    "responses": {
                        "200": {"description": "the new version", **_json("Calendar")},
                        **_errors(400, 404, 409, *_COMMON),
                    },
                },
                "delete": {
                    "summary": "Delete a calendar no live schedule references (409 otherwise)",
                    "parameters": [_NAME],
                    "responses": {
                        "200": {"description": "deleted", **_json("Calendar")},
                        **_errors(404, 409, *_COMMON),
                    },
                },
            },
            "/v1/calendars/{name}/import": {
                "post": {
                    "summary": "Replace the calendar's dates with an iCalendar file's all-day events (creates it if"
                    " needed)",
                    "parameters": [
                        _NAME,
                        {"name": "time_zone", "in": "query", "schema": {"type": "string"}},
                        {"name": "description", "in": "query", "schema": {"type": "string", "maxLength": 500}},
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "text/calendar": {
                                "schema": {
                                    "type": "string",
                                    "example": "BEGIN:VCALENDAR\r\nBEGIN:VEVENT\r\nDTSTART;VALUE=DATE:20261225"
                                    "\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n",
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": {"description": "a new version", **_json("Calendar")},
                        "201": {"description": "created", **_json("Calendar")},
                        **_errors(400, 404, 413, *_COMMON),
                    },
                }
            },
            "/v1/calendars/{name}/versions": {
                "get": {
                    "summary": "The calendar's version history with each version's dates",
                    "parameters": [_NAME],
                    "responses": {
                        "200": {"description": "every version", **_json("VersionList")},
                        **_errors(404, *_COMMON),
                    },
                }
            },
            "/v1/preview": {
                "post": {
                    "summary": "The next fire instants of a definition, UTC and local, with the rule of each and"
                    " what its exclusion calendar removes",
                    "requestBody": {"required": True, **_json("PreviewRequest")},
                    "responses": {"200": {"description": "fires", **_json("Preview")}, **_errors(400, *_COMMON)},
                }
            },
        },
    }

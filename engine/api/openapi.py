"""The OpenAPI 3 document of the HTTP API (served at ``/openapi.json``).

Written by hand next to the routes it describes; the API fuzz test generates
requests from it, so a field added to a route without being added here goes
untested.
"""

from __future__ import annotations

from typing import Any

_DURATION = {
    "oneOf": [{"type": "string", "example": "90s"}, {"type": "number", "minimum": 0}],
    "description": "duration: '90s', '15m', '1h30m', or seconds",
}
_INSTANT = {"type": "string", "format": "date-time", "example": "2026-11-29T10:00:00Z"}
_NULLABLE_INSTANT = {"type": "string", "format": "date-time", "nullable": True}

_DEFINITION: dict[str, Any] = {
    "kind": {"type": "string", "enum": ["once", "cron", "rate"]},
    "expression": {
        "type": "string",
        "maxLength": 200,
        "description": "cron expression (kind=cron), ISO-8601 instant (once) or duration (rate)",
        "example": "0 9 * * MON-FRI",
    },
    "time_zone": {"type": "string", "example": "Europe/Berlin", "description": "IANA zone of a cron expression"},
    "target": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", "example": "billing.invoice"},
    "payload": {"description": "any JSON value, at most the tenant's payload quota (64 KiB by default)"},
    "priority": {"type": "string", "enum": ["strict", "flexible"]},
    "flexible_window": _DURATION,
    "misfire_policy": {
        "type": "string",
        "example": "catch_up:3",
        "description": "skip | fire_once | catch_up:K (K 1..1000)",
    },
    "max_lateness": _DURATION,
    "overlap_policy": {"type": "string", "enum": ["allow", "skip_if_running", "queue_one"]},
    "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
    "retry_base": _DURATION,
    "retry_cap": _DURATION,
    "deadline": _DURATION,
    "dst_repeat": {"type": "string", "enum": ["first", "both"]},
    "dst_gap": {"type": "string", "enum": ["skip", "shift"]},
    "start_at": _INSTANT,
    "end_at": _INSTANT,
    "anchor": _INSTANT,
    "exclusion_calendar": {
        "type": "string",
        "nullable": True,
        "pattern": "^[a-z0-9][a-z0-9_.-]{0,62}$",
        "example": "de-holidays",
        "description": "name of one of the tenant's calendars: fires on its dates are skipped",
    },
    "max_runs": {
        "type": "integer",
        "minimum": 1,
        "maximum": 1000000000,
        "nullable": True,
        "description": "the schedule completes after this many runs (occurrences materialized to run)",
    },
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
            "description": "on changes: unclaimed occurrences of older versions canceled",
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
    {"name": "cursor", "in": "query", "schema": {"type": "string"}},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
]
_COMMON = (401, 422, 503)


def _lifecycle(summary: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [_ID],
            "responses": {
                "200": {"description": "the schedule after the change", **_json("Schedule")},
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
                    "type": "object",
                    "required": ["kind", "expression", "target"],
                    "properties": _DEFINITION,
                    "additionalProperties": False,
                },
                "ScheduleUpdate": {
                    "type": "object",
                    "minProperties": 1,
                    "properties": _DEFINITION,
                    "additionalProperties": False,
                },
                "Schedule": _SCHEDULE,
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
                "PreviewRequest": {
                    "type": "object",
                    "required": ["kind", "expression"],
                    "additionalProperties": False,
                    "properties": {
                        **{
                            k: _DEFINITION[k]
                            for k in (
                                "kind",
                                "expression",
                                "time_zone",
                                "dst_repeat",
                                "dst_gap",
                                "anchor",
                                "start_at",
                                "end_at",
                                "exclusion_calendar",
                                "max_runs",
                            )
                        },
                        "from": _INSTANT,
                        "count": {"type": "integer", "minimum": 1, "maximum": 1000},
                    },
                },
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
                            "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                        }
                    ],
                    "requestBody": {"required": True, **_json("ScheduleCreate")},
                    "responses": {
                        "201": {"description": "created (or the same request replayed)", **_json("Schedule")},
                        **_errors(400, 404, 409, 413, 429, *_COMMON),
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
                        {"name": "target", "in": "query", "schema": {"type": "string"}},
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
                        "200": {"description": "the new version", **_json("Schedule")},
                        **_errors(400, 404, 409, 429, *_COMMON),
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
                        "200": {"description": "a page", **_json("OccurrencePage")},
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

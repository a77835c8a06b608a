"""The control plane: validate, version and store schedules.

Every path that changes a schedule (the Python API, the CLI, later the HTTP
API and the command topic) goes through this module, so validation, quotas and
versioning are written once. Validation raises :class:`InvalidInput` naming
the field; nothing is written when a request is rejected.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Mapping

import asyncpg
import orjson

from engine import timing
from schemas.clock import Clock, DatabaseClock
from schemas.errors import Conflict, InvalidInput, NotFound
from schemas.messages import format_instant
from schemas.queries import load_queries
from schemas.topics import validate_target

SQL = load_queries("engine")

#: Logical shards: shard = hash(schedule_id) mod SHARD_COUNT. Engine nodes
#: lease shards; the count is fixed for the life of a database.
SHARD_COUNT = 256
MAX_PAYLOAD_BYTES = 64 * 1024
PRIORITIES = ("strict", "flexible")
OVERLAP_POLICIES = ("allow", "skip_if_running", "queue_one")

_KNOWN_FIELDS = frozenset({
    "kind", "expression", "time_zone", "target", "payload", "priority", "flexible_window",
    "misfire_policy", "max_lateness", "overlap_policy", "max_attempts", "retry_base", "retry_cap",
    "deadline", "dst_repeat", "dst_gap", "start_at", "end_at", "anchor",
})


@dataclass(frozen=True)
class ScheduleRequest:
    """A validated request to create (or replace the definition of) a schedule."""

    spec: timing.TimeSpec
    target: str
    payload: Any = field(default_factory=dict)
    priority: str = "strict"
    flexible_window: timedelta = timedelta(0)
    misfire: timing.MisfirePolicy = timing.MisfirePolicy("fire_once", 0, timedelta(minutes=1))
    misfire_text: str = "fire_once"
    overlap_policy: str = "allow"
    max_attempts: int = 3
    retry_base: timedelta = timedelta(seconds=1)
    retry_cap: timedelta = timedelta(minutes=5)
    deadline: timedelta | None = None


def _duration(raw: Mapping[str, Any], name: str, default: timedelta | None) -> timedelta | None:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        raise InvalidInput(name, "must be a duration", "90s")
    if isinstance(value, (int, float)):
        if value < 0:
            raise InvalidInput(name, "must not be negative", "90s")
        return timedelta(seconds=value)
    if isinstance(value, str):
        return timing.parse_duration(value, field=name)
    raise InvalidInput(name, f"must be a duration string or a number of seconds, got {type(value).__name__}", "90s")


def _choice(raw: Mapping[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    value = raw.get(name, default)
    if value is None:
        return default
    if value not in choices:
        raise InvalidInput(name, f"must be one of {', '.join(choices)}; got {str(value)[:60]!r}", choices[0])
    return value


def validate_payload(payload: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> Any:
    """The payload must be JSON and at most ``max_bytes`` once encoded."""
    try:
        encoded = orjson.dumps(payload)
    except TypeError as err:
        raise InvalidInput("payload", f"must be JSON-serializable: {err}", '{"invoice": 42}') from err
    if len(encoded) > max_bytes:
        raise InvalidInput(
            "payload",
            f"is {len(encoded)} bytes encoded; the limit is {max_bytes} bytes."
            " Store large data elsewhere and send a reference",
            '{"blob_url": "s3://bucket/key"}',
        )
    return payload


def parse_schedule_request(raw: Mapping[str, Any], *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> ScheduleRequest:
    """Validate a create request given as API field names; raise InvalidInput naming the field."""
    if not isinstance(raw, Mapping):
        raise InvalidInput("body", "must be a JSON object", '{"kind": "cron", "expression": "0 9 * * *"}')
    unknown = sorted(set(raw) - _KNOWN_FIELDS)
    if unknown:
        raise InvalidInput(unknown[0], f"is not a schedule field; known fields: {', '.join(sorted(_KNOWN_FIELDS))}")
    kind = raw.get("kind")
    expression = raw.get("expression")
    if not isinstance(kind, str):
        raise InvalidInput("kind", "is required: once, cron or rate", "cron")
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidInput("expression", "is required: a cron expression, an ISO-8601 instant or a duration",
                           "0 9 * * MON-FRI")
    time_zone = raw.get("time_zone")
    if time_zone is not None and not isinstance(time_zone, str):
        raise InvalidInput("time_zone", "must be an IANA zone name", "Europe/Berlin")
    spec = timing.build_time_spec(
        kind, expression, time_zone,
        dst_repeat=raw.get("dst_repeat"), dst_gap=raw.get("dst_gap"),
        anchor=raw.get("anchor"), start_at=raw.get("start_at"), end_at=raw.get("end_at"),
    )
    target = validate_target(raw.get("target"))
    payload = validate_payload(raw.get("payload", {}), max_payload_bytes)
    priority = _choice(raw, "priority", PRIORITIES, "strict")
    window = _duration(raw, "flexible_window", timedelta(0))
    assert window is not None
    if priority == "flexible" and window <= timedelta(0):
        window = timedelta(minutes=5)  # DESIGN.md: flexible jobs spread over a 5-minute window by default
    if priority == "strict" and window > timedelta(0):
        raise InvalidInput("flexible_window", "applies only to priority=flexible", "5m")
    if window > timedelta(hours=24):
        raise InvalidInput("flexible_window", "must be at most 24h", "5m")
    misfire_text = raw.get("misfire_policy") or "fire_once"
    if not isinstance(misfire_text, str):
        raise InvalidInput("misfire_policy", "must be skip, fire_once or catch_up:K", "catch_up:3")
    max_lateness = raw.get("max_lateness")
    if isinstance(max_lateness, (int, float)) and not isinstance(max_lateness, bool):
        max_lateness = timedelta(seconds=max_lateness)
    misfire = timing.parse_misfire_policy(misfire_text, max_lateness)
    overlap = _choice(raw, "overlap_policy", OVERLAP_POLICIES, "allow")
    max_attempts = raw.get("max_attempts", 3)
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or not 1 <= max_attempts <= 100:
        raise InvalidInput("max_attempts", "must be an integer from 1 to 100", "5")
    retry_base = _duration(raw, "retry_base", timedelta(seconds=1))
    retry_cap = _duration(raw, "retry_cap", timedelta(minutes=5))
    assert retry_base is not None and retry_cap is not None
    if retry_base <= timedelta(0):
        raise InvalidInput("retry_base", "must be positive", "1s")
    if retry_cap < retry_base:
        raise InvalidInput("retry_cap", "must be at least retry_base", "5m")
    deadline = _duration(raw, "deadline", None)
    if deadline is not None and deadline <= timedelta(0):
        raise InvalidInput("deadline", "must be positive", "1h")
    return ScheduleRequest(
        spec=spec, target=target, payload=payload, priority=priority, flexible_window=window,
        misfire=misfire, misfire_text=misfire_text.strip(), overlap_policy=overlap, max_attempts=max_attempts,
        retry_base=retry_base, retry_cap=retry_cap, deadline=deadline,
    )


MAX_PREVIEW = 1000


def preview_fires(raw: Mapping[str, Any], after: datetime, count: int) -> list[dict[str, str]]:
    """The next ``count`` fires strictly after ``after`` of a schedule definition.

    Uses the same rules as create: a rate without an anchor is anchored at
    ``after`` (whole seconds), as a schedule created at that instant would be.
    Each fire is ``{"utc": ..., "local": ...}`` in ISO 8601 (local with its
    offset in the schedule's zone).
    """
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_PREVIEW:
        raise InvalidInput("count", f"must be an integer from 1 to {MAX_PREVIEW}", "10")
    kind, expression = raw.get("kind"), raw.get("expression")
    if not isinstance(kind, str):
        raise InvalidInput("kind", "is required: once, cron or rate", "cron")
    if not isinstance(expression, str):
        raise InvalidInput("expression", "is required: a cron expression, an ISO-8601 instant or a duration",
                           "0 9 * * MON-FRI")
    anchor = raw.get("anchor")
    if kind == "rate" and anchor is None:
        anchor = after.replace(microsecond=0)
    spec = timing.build_time_spec(kind, expression, raw.get("time_zone"), dst_repeat=raw.get("dst_repeat"),
                                  dst_gap=raw.get("dst_gap"), anchor=anchor, start_at=raw.get("start_at"),
                                  end_at=raw.get("end_at"))
    return [{"utc": format_instant(fire.utc), "local": fire.local.isoformat()}
            for fire in timing.preview(spec, after, count)]


def shard_of(schedule_id: uuid.UUID) -> int:
    return int.from_bytes(schedule_id.bytes[:4], "big") % SHARD_COUNT


def first_fire(request: ScheduleRequest, now: datetime) -> datetime | None:
    """The first fire instant of a new schedule.

    cron and rate fire strictly after ``now`` (a rate without an anchor is
    anchored at ``now`` by the caller, so it first fires one period later); a one-time instant slightly in
    the past (within max_lateness) is accepted and fires at once, further in
    the past it is rejected rather than silently never firing.
    """
    spec = request.spec
    if spec.kind == "once":
        first = timing.next_fire_after(spec, now - request.misfire.max_lateness - timedelta(microseconds=1))
        if first is None:
            raise InvalidInput(
                "expression",
                f"the instant {spec.expression} is already past (now is {format_instant(now)});"
                " choose a future instant",
                format_instant(now + timedelta(minutes=5)),
            )
        return first
    first = timing.next_fire_after(spec, now)
    if first is None:
        raise InvalidInput("end_at", "the schedule has no fire time before its end; move end_at later")
    return first


def schedule_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """The public representation of a schedule row (API field names)."""
    def instant(value: datetime | None) -> str | None:
        return format_instant(value) if value else None

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


class ControlPlane:
    """Schedule lifecycle operations against the engine database."""

    def __init__(self, pool: asyncpg.Pool, clock: Clock | None = None) -> None:
        self.pool = pool
        self.clock = clock or DatabaseClock()

    async def now(self, conn: asyncpg.Connection | None = None) -> datetime:
        if conn is None:
            return await self.pool.fetchval(SQL["current_instant"], self.clock.now())
        return await conn.fetchval(SQL["current_instant"], self.clock.now())

    async def create_schedule(self, tenant_id: str, raw: Mapping[str, Any],
                              idempotency_key: str | None = None) -> dict[str, Any]:
        """Validate and store a schedule; return it (with schedule_id, version, next_run_at).

        With an idempotency key, repeating the same request returns the stored
        schedule; the same key with a different definition is a Conflict.
        """
        request = parse_schedule_request(raw)
        async with self.pool.acquire() as conn, conn.transaction():
            now = await self.now(conn)
            if request.spec.kind == "rate" and request.spec.anchor is None:
                # Anchor on a whole second so "every 10s" fires at readable instants.
                anchor = now.replace(microsecond=0)
                request = dataclasses.replace(request, spec=dataclasses.replace(request.spec, anchor=anchor))
            next_run_at = first_fire(request, now)
            spec = request.spec
            schedule_id = uuid.uuid4()
            row = await conn.fetchrow(
                SQL["insert_schedule"],
                schedule_id, tenant_id, spec.kind, spec.expression, spec.time_zone, spec.dst_repeat,
                spec.dst_gap, spec.anchor, spec.start_at, spec.end_at, next_run_at, "active", request.target,
                request.payload, request.priority, int(request.flexible_window.total_seconds()),
                request.misfire_text, int(request.misfire.max_lateness.total_seconds()),
                request.overlap_policy, request.max_attempts, request.retry_base.total_seconds(),
                request.retry_cap.total_seconds(),
                int(request.deadline.total_seconds()) if request.deadline else None,
                shard_of(schedule_id), idempotency_key, self.clock.now(),
            )
            if row is None:
                existing = await conn.fetchrow(SQL["get_schedule_by_key"], tenant_id, idempotency_key)
                if existing is None:  # pragma: no cover - the conflicting row is visible after ON CONFLICT
                    raise Conflict("idempotency key in use by a concurrent request; retry")
                if not _same_definition(existing, request):
                    raise Conflict(
                        f"idempotency key {idempotency_key!r} was already used for a different schedule"
                        f" ({existing['schedule_id']}); use a new key for a new schedule"
                    )
                row = existing
        return schedule_to_json(row)

    async def get_schedule(self, tenant_id: str, schedule_id: uuid.UUID | str) -> dict[str, Any]:
        row = await self.pool.fetchrow(SQL["get_schedule"], _as_uuid(schedule_id, "schedule"), tenant_id)
        if row is None:
            raise NotFound("schedule", schedule_id)
        return schedule_to_json(row)


def _as_uuid(value: uuid.UUID | str, kind: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError as err:
        raise NotFound(kind, value) from err


def _same_definition(row: Mapping[str, Any], request: ScheduleRequest) -> bool:
    spec = request.spec
    return (
        row["kind"] == spec.kind and row["expression"] == spec.expression
        and row["time_zone"] == spec.time_zone and row["target"] == request.target
        and row["payload"] == request.payload and row["priority"] == request.priority
        and row["misfire_policy"] == request.misfire_text and row["overlap_policy"] == request.overlap_policy
    )

"""The control plane: validate, version and store schedules.

Every path that changes a schedule (the Python API, the CLI, later the HTTP
API and the command topic) goes through this module, so validation, quotas and
versioning are written once. Validation raises :class:`InvalidInput` naming
the field; nothing is written when a request is rejected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, AsyncIterator, Mapping

import asyncpg
import orjson

from engine.rules import timing
from schemas.clock import Clock, DatabaseClock
from engine.control.pagination import decode_cursor, key_of, page_size, split_page
from engine.control.tenants import Tenant
from schemas.errors import Conflict, InvalidInput, NotFound, QuotaExceeded
from schemas.messages import ScheduleStateMessage, format_instant
from schemas.queries import load_queries
from schemas.topics import SCHEDULE_STATES_TOPIC, validate_target

SQL = load_queries("engine")
CP_SQL = load_queries("control_plane")

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


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    items: list[dict[str, Any]]
    next_cursor: str | None

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items, "next_cursor": self.next_cursor}


# Lifecycle: which state each action leads to from each state. A missing entry
# is a conflict; an action that leaves the state as it is is a no-op (retrying
# a pause is safe and creates no new version).
_LIFECYCLE: dict[str, dict[str, str]] = {
    "pause": {"active": "paused", "paused": "paused"},
    "resume": {"paused": "active", "active": "active"},
    "cancel": {"active": "canceled", "paused": "canceled", "canceled": "canceled", "completed": "completed"},
    "update": {"active": "active", "paused": "paused"},
}


def lifecycle_transition(state: str, action: str) -> str:
    """The state after ``action``, or Conflict saying why the action is not possible."""
    following = _LIFECYCLE[action].get(state)
    if following is None:
        raise Conflict(f"cannot {action} a {state} schedule; {state} is final, create a new schedule instead"
                       if state in ("canceled", "completed") else f"cannot {action} a {state} schedule")
    return following


class ControlPlane:
    """Schedule lifecycle operations against the engine database.

    Every change runs in one transaction that locks the schedule, bumps its
    version, records the version in ``schedule_versions``, invalidates
    unclaimed occurrences of older versions and queues a schedule state
    message for consumers — all or nothing.
    """

    def __init__(self, pool: asyncpg.Pool, clock: Clock | None = None) -> None:
        self.pool = pool
        self.clock = clock or DatabaseClock()

    async def now(self, conn: asyncpg.Connection | None = None) -> datetime:
        return await (conn or self.pool).fetchval(SQL["current_instant"], self.clock.now())

    # ------------------------------------------------------------------ create

    @contextlib.asynccontextmanager
    async def _transaction(self, conn: asyncpg.Connection | None) -> AsyncIterator[asyncpg.Connection]:
        """A transaction of our own, or a savepoint inside the caller's (the command
        processor applies a command in the transaction that records it as processed)."""
        if conn is None:
            async with self.pool.acquire() as own, own.transaction():
                yield own
        else:
            async with conn.transaction():
                yield conn

    async def create_schedule(self, tenant_id: str, raw: Mapping[str, Any], idempotency_key: str | None = None,
                              *, conn: asyncpg.Connection | None = None) -> dict[str, Any]:
        """Validate and store a schedule; return it (with schedule_id, version, next_run_at).

        With an idempotency key, repeating the same request returns the stored
        schedule; the same key with a different body is a Conflict.
        """
        request_hash = _request_hash(raw)
        if idempotency_key is not None:
            if not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= 200:
                raise InvalidInput("Idempotency-Key", "must be 1-200 characters", "create-invoice-42")
            existing = await (conn or self.pool).fetchrow(CP_SQL["get_schedule_by_key"], tenant_id,
                                                          idempotency_key)
            if existing is not None:
                return _replayed(existing, request_hash, idempotency_key)
        async with self._transaction(conn) as conn:
            tenant = await _lock_tenant(conn, tenant_id)
            request = parse_schedule_request(raw, max_payload_bytes=tenant.quotas.max_payload_bytes)
            now = await self.now(conn)
            if request.spec.kind == "rate" and request.spec.anchor is None:
                # Anchor on a whole second so "every 10s" fires at readable instants.
                anchor = now.replace(microsecond=0)
                request = dataclasses.replace(request, spec=dataclasses.replace(request.spec, anchor=anchor))
            next_run_at = first_fire(request, now)
            rate = timing.fires_per_minute(request.spec, now)
            await _check_quotas(conn, tenant, rate, exclude=None)
            schedule_id = uuid.uuid4()
            row = await conn.fetchrow(
                CP_SQL["insert_schedule"], schedule_id, tenant_id, *_definition_columns(request), next_run_at,
                "active", *_policy_columns(request), shard_of(schedule_id), idempotency_key, rate, request_hash,
                self.clock.now(),
            )
            if row is None:  # a concurrent create with the same key won the insert
                existing = await conn.fetchrow(CP_SQL["get_schedule_by_key"], tenant_id, idempotency_key)
                return _replayed(existing, request_hash, idempotency_key)
            await self._record(conn, row, "create")
        return schedule_to_json(row)

    # ------------------------------------------------------------------ reads

    async def get_schedule(self, tenant_id: str, schedule_id: uuid.UUID | str) -> dict[str, Any]:
        row = await self.pool.fetchrow(CP_SQL["get_schedule"], as_uuid(schedule_id, "schedule"), tenant_id)
        if row is None:
            raise NotFound("schedule", schedule_id)
        return schedule_to_json(row)

    async def list_schedules(self, tenant_id: str, *, state: str | None = None, target: str | None = None,
                             cursor: str | None = None, limit: int = 50) -> Page:
        """A tenant's schedules in creation order, ``limit`` at a time."""
        if state is not None and state not in SCHEDULE_STATES:
            raise InvalidInput("state", f"must be one of {', '.join(SCHEDULE_STATES)}", "active")
        after_at, after_id = decode_cursor(cursor)
        limit = page_size(limit)
        rows = await self.pool.fetch(CP_SQL["list_schedules"], tenant_id, state, target, after_at, after_id,
                                     limit + 1)
        page, next_cursor = split_page(rows, limit, key_of("created_at", "schedule_id"))
        return Page([schedule_to_json(r) for r in page], next_cursor)

    async def list_occurrences(self, tenant_id: str, schedule_id: uuid.UUID | str, *, cursor: str | None = None,
                               limit: int = 50) -> Page:
        """One schedule's occurrences, oldest first (NotFound for another tenant's schedule)."""
        sid = as_uuid(schedule_id, "schedule")
        if await self.pool.fetchrow(CP_SQL["get_schedule"], sid, tenant_id) is None:
            raise NotFound("schedule", schedule_id)
        after_at, after_id = decode_cursor(cursor)
        limit = page_size(limit)
        rows = await self.pool.fetch(CP_SQL["list_schedule_occurrences"], sid, tenant_id, after_at, after_id,
                                     limit + 1)
        page, next_cursor = split_page(rows, limit, key_of("scheduled_for", "occurrence_id"))
        return Page([occurrence_to_json(r) for r in page], next_cursor)

    async def get_occurrence(self, tenant_id: str, occurrence_id: uuid.UUID | str) -> dict[str, Any]:
        """An occurrence with its attempts."""
        oid = as_uuid(occurrence_id, "occurrence")
        row = await self.pool.fetchrow(CP_SQL["get_occurrence"], oid, tenant_id)
        if row is None:
            raise NotFound("occurrence", occurrence_id)
        attempts = await self.pool.fetch(CP_SQL["list_attempts"], oid)
        return {**occurrence_to_json(row), "attempts": [attempt_to_json(a) for a in attempts]}

    async def schedule_history(self, tenant_id: str, schedule_id: uuid.UUID | str) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(CP_SQL["list_schedule_versions"], as_uuid(schedule_id, "schedule"),
                                     tenant_id)
        if not rows:
            raise NotFound("schedule", schedule_id)
        return [{"version": r["version"], "change": r["change"], "state": r["state"],
                 "definition": r["definition"], "next_run_at": _instant(r["next_run_at"]),
                 "changed_at": _instant(r["changed_at"])} for r in rows]

    # ------------------------------------------------------------------ changes

    async def update_schedule(self, tenant_id: str, schedule_id: uuid.UUID | str, changes: Mapping[str, Any],
                              *, conn: asyncpg.Connection | None = None) -> dict[str, Any]:
        """Apply a partial definition change as a new version.

        Unclaimed occurrences of older versions become CANCELED; future fires
        follow the new definition only, from now on.
        """
        if not isinstance(changes, Mapping) or not changes:
            raise InvalidInput("body", "give at least one field to change", '{"expression": "0 10 * * *"}')
        unknown = sorted(set(changes) - _KNOWN_FIELDS)
        if unknown:
            raise InvalidInput(unknown[0], f"is not a schedule field; known fields: {', '.join(sorted(_KNOWN_FIELDS))}")
        async with self._transaction(conn) as conn:
            row = await self._lock(conn, tenant_id, schedule_id)
            state = lifecycle_transition(row["state"], "update")
            tenant = await _lock_tenant(conn, tenant_id)
            merged = {**definition_of(row), **changes}
            if "kind" in changes and changes["kind"] != row["kind"] and "anchor" not in changes:
                merged.pop("anchor", None)
            for name in ("dst_repeat", "dst_gap"):
                if merged.get("kind") != "cron" and name not in changes:
                    merged.pop(name, None)   # DST options only apply to cron
            request = parse_schedule_request(merged, max_payload_bytes=tenant.quotas.max_payload_bytes)
            now = await self.now(conn)
            if request.spec.kind == "rate" and request.spec.anchor is None:
                request = dataclasses.replace(
                    request, spec=dataclasses.replace(request.spec, anchor=now.replace(microsecond=0)))
            next_run_at = first_fire(request, now)
            rate = timing.fires_per_minute(request.spec, now)
            await _check_quotas(conn, tenant, rate, exclude=row["schedule_id"])
            updated = await conn.fetchrow(
                CP_SQL["replace_schedule"], row["schedule_id"], tenant_id, *_definition_columns(request),
                next_run_at, state, *_policy_columns(request), rate, self.clock.now(),
            )
            canceled = await self._invalidate_older_versions(conn, updated["schedule_id"], updated["version"])
            await self._record(conn, updated, "update")
        return {**schedule_to_json(updated), "canceled_occurrences": canceled["canceled"]}

    async def pause_schedule(self, tenant_id: str, schedule_id: uuid.UUID | str, *,
                              conn: asyncpg.Connection | None = None) -> dict[str, Any]:
        """Stop firing; occurrences not yet started are canceled and counted as missed on resume."""
        return await self._change_state(tenant_id, schedule_id, "pause", conn)

    async def resume_schedule(self, tenant_id: str, schedule_id: uuid.UUID | str, *,
                              conn: asyncpg.Connection | None = None) -> dict[str, Any]:
        """Fire again from the durable cursor: what was missed while paused follows the misfire policy."""
        return await self._change_state(tenant_id, schedule_id, "resume", conn)

    async def cancel_schedule(self, tenant_id: str, schedule_id: uuid.UUID | str, *,
                              conn: asyncpg.Connection | None = None) -> dict[str, Any]:
        """Stop for good. Nothing is deleted: the schedule, its versions and occurrences stay readable."""
        return await self._change_state(tenant_id, schedule_id, "cancel", conn)

    async def _change_state(self, tenant_id: str, schedule_id: uuid.UUID | str, action: str,
                            conn: asyncpg.Connection | None) -> dict[str, Any]:
        async with self._transaction(conn) as conn:
            row = await self._lock(conn, tenant_id, schedule_id)
            state = lifecycle_transition(row["state"], action)
            if state == row["state"]:
                return {**schedule_to_json(row), "canceled_occurrences": 0}
            canceled = await self._invalidate_older_versions(conn, row["schedule_id"], row["version"] + 1)
            cursor = None if state == "canceled" else row["next_run_at"]
            if action == "pause" and canceled["earliest_unpublished"] is not None and cursor is not None:
                # Materialized ahead but never published: rewind the cursor so that
                # resume judges those slots with the misfire policy. Published ones
                # may already have run; they are canceled, never re-materialized.
                cursor = min(cursor, canceled["earliest_unpublished"])
            updated = await conn.fetchrow(CP_SQL["change_schedule_state"], row["schedule_id"], tenant_id, state,
                                          cursor, self.clock.now())
            await self._record(conn, updated, action)
        return {**schedule_to_json(updated), "canceled_occurrences": canceled["canceled"]}

    async def _lock(self, conn: asyncpg.Connection, tenant_id: str, schedule_id: uuid.UUID | str) -> asyncpg.Record:
        row = await conn.fetchrow(CP_SQL["lock_schedule"], as_uuid(schedule_id, "schedule"), tenant_id)
        if row is None:
            raise NotFound("schedule", schedule_id)
        return row

    async def _invalidate_older_versions(self, conn: asyncpg.Connection, schedule_id: uuid.UUID,
                                         new_version: int) -> asyncpg.Record:
        """Cancel unclaimed occurrences of versions before ``new_version``; count them."""
        return await conn.fetchrow(CP_SQL["cancel_unclaimed_occurrences"], schedule_id, new_version,
                                   self.clock.now())

    async def _record(self, conn: asyncpg.Connection, row: asyncpg.Record, change: str) -> None:
        """Version history row + schedule state message, in the change's transaction."""
        now = self.clock.now()
        await conn.execute(CP_SQL["insert_schedule_version"], row["schedule_id"], row["version"], row["tenant_id"],
                           change, row["state"], definition_of(row), row["next_run_at"], now)
        message = ScheduleStateMessage(row["schedule_id"], row["tenant_id"], row["version"], row["state"],
                                       row["updated_at"])
        await conn.execute(CP_SQL["insert_topic_message"], row["tenant_id"], SCHEDULE_STATES_TOPIC, message.key,
                           message.encode(), now)


SCHEDULE_STATES = ("active", "paused", "canceled", "completed")


async def _lock_tenant(conn: asyncpg.Connection, tenant_id: str) -> Tenant:
    row = await conn.fetchrow(CP_SQL["lock_tenant"], tenant_id)
    if row is None:
        raise NotFound("tenant", f"{tenant_id} (create it with: chronoq tenant create {tenant_id})")
    tenant = Tenant.from_row(row)
    if tenant.state != "active":
        raise Conflict(f"tenant {tenant_id} is {tenant.state}; an operator must reactivate it")
    return tenant


async def _check_quotas(conn: asyncpg.Connection, tenant: Tenant, rate: float, exclude: uuid.UUID | None) -> None:
    """Raise QuotaExceeded if one more live schedule with this trigger rate does not fit."""
    usage = await conn.fetchrow(CP_SQL["tenant_usage"], tenant.tenant_id, exclude)
    quotas = tenant.quotas
    if usage["schedules"] + 1 > quotas.max_active_schedules:
        raise QuotaExceeded("max_active_schedules", quotas.max_active_schedules, usage["schedules"] + 1)
    wanted = usage["fires_per_minute"] + rate
    if wanted > quotas.max_fires_per_minute:
        raise QuotaExceeded("max_fires_per_minute", quotas.max_fires_per_minute, round(wanted, 3))


def _definition_columns(request: ScheduleRequest) -> tuple[Any, ...]:
    spec = request.spec
    return (spec.kind, spec.expression, spec.time_zone, spec.dst_repeat, spec.dst_gap, spec.anchor,
            spec.start_at, spec.end_at)


def _policy_columns(request: ScheduleRequest) -> tuple[Any, ...]:
    return (
        request.target, request.payload, request.priority, int(request.flexible_window.total_seconds()),
        request.misfire_text, int(request.misfire.max_lateness.total_seconds()), request.overlap_policy,
        request.max_attempts, request.retry_base.total_seconds(), request.retry_cap.total_seconds(),
        int(request.deadline.total_seconds()) if request.deadline else None,
    )


def _request_hash(raw: Mapping[str, Any]) -> str:
    try:
        canonical = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError as err:
        raise InvalidInput("payload", f"must be JSON-serializable: {err}", '{"invoice": 42}') from err
    return hashlib.sha256(canonical).hexdigest()


def _replayed(row: Mapping[str, Any], request_hash: str, key: str) -> dict[str, Any]:
    if row["request_hash"] != request_hash:
        raise Conflict(f"Idempotency-Key {key!r} was already used with a different request body (schedule"
                       f" {row['schedule_id']}); use a new key for a new schedule")
    return schedule_to_json(row)


def _instant(value: datetime | None) -> str | None:
    return format_instant(value) if value else None


def occurrence_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "occurrence_id": str(row["occurrence_id"]), "schedule_id": str(row["schedule_id"]),
        "schedule_version": row["schedule_version"], "tenant_id": row["tenant_id"], "target": row["target"],
        "scheduled_for": _instant(row["scheduled_for"]), "available_at": _instant(row["available_at"]),
        "state": row["state"], "attempt_count": row["attempt_count"], "enqueued_at": _instant(row["enqueued_at"]),
        "created_at": _instant(row["created_at"]), "updated_at": _instant(row["updated_at"]),
    }


def attempt_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "attempt_id": str(row["attempt_id"]), "attempt_number": row["attempt_number"],
        "lease_token": str(row["lease_token"]), "consumer_group": row["consumer_group"],
        "started_at": _instant(row["started_at"]), "finished_at": _instant(row["finished_at"]),
        "result": row["result"], "error_class": row["error_class"], "error_message": row["error_message"],
    }


def definition_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored schedule's definition under API field names (what create/update accept)."""
    data = schedule_to_json(row)
    return {name: data[name] for name in _KNOWN_FIELDS if data.get(name) is not None}


def as_uuid(value: uuid.UUID | str, kind: str) -> uuid.UUID:
    """A path or CLI id as a UUID; anything else is simply not found (never a 500 or a leak)."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError as err:
        raise NotFound(kind, value) from err

"""Batch create: up to :data:`MAX_BATCH` schedules in one request, each with its own idempotency key and result.

Each item is validated exactly like a single create (the same
:mod:`engine.control.schedule_requests`); an invalid item gets its own 422
and does not stop the others. Writing is set-based: one transaction locks the
tenant once (quotas are checked for the whole batch, item by item in order),
inserts every new schedule with one ``INSERT … SELECT FROM unnest``, their
first versions with another, and their schedule state messages with a third —
so importing 100,000 schedules is a hundred transactions, not 100,000.

Idempotency is per item: a key already used with the same body answers the
stored schedule (status 200), with another body a 409; a key repeated inside
one batch is the same schedule. Importing the same file twice creates none.

An item's status: 201 created, 200 replayed, 409 conflict, 422 invalid
(with the field), 429 quota exceeded; a stored item's result carries the
schedule's id, version, state, next_run_at and target.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from opentelemetry import metrics

from engine.control.cohort_membership import claim_cohorts, cohort_spec_of
from engine.control.quotas import TenantQuotas, quota_refusal, tenant_usage
from engine.control.schedule_requests import (
    anchored,
    first_fire,
    parse_schedule_request,
    request_hash,
    validate_idempotency_key,
)
from engine.control.schedules import ControlPlane, definition_columns
from engine.control.tenants import find_tenant, lock_tenant
from engine.control.views import definition_of, instant
from engine.records import Schedule
from engine.rules import timing
from engine.rules.shards import shard_of
from schemas import observability as obs
from schemas.errors import ChronoqError, Conflict, InvalidInput, NotFound
from schemas.messages import ScheduleStateMessage
from schemas.queries import QUERIES
from schemas.topics import SCHEDULE_STATES_TOPIC

MAX_BATCH = 1000


@dataclass(frozen=True)
class BatchItem:
    idempotency_key: Any
    schedule: Any


def parse_batch(body: Any) -> list[BatchItem]:
    """``{"items": [{"idempotency_key": "...", "schedule": {...}}, ...]}`` → items (shape only)."""
    if not isinstance(body, Mapping) or set(body) != {"items"}:
        raise InvalidInput(
            "items",
            'send {"items": [{"idempotency_key": ..., "schedule": {...}}, ...]}',
            '{"items": [{"idempotency_key": "k1", "schedule": {"kind": "cron", ...}}]}',
        )
    items = body["items"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise InvalidInput("items", f"must be a list of 1 to {MAX_BATCH} items; split larger imports")
    return [
        BatchItem(item.get("idempotency_key"), item.get("schedule"))
        if isinstance(item, Mapping)
        else BatchItem(None, None)
        for item in items
    ]


def _error(status: int, err: ChronoqError, index: int) -> dict[str, Any]:
    error: dict[str, Any] = {"code": err.code, "message": str(err)}
    name = getattr(err, "field", None) or getattr(err, "quota", None)
    if name is not None:
        error["field"] = name
    return {"index": index, "status": status, "error": error}


#: insert_schedules' array parameters and the schedules column each one carries.
_COLUMNS = {
    "schedule_ids": "schedule_id",
    "kinds": "kind",
    "expressions": "expression",
    "time_zones": "time_zone",
    "dst_repeats": "dst_repeat",
    "dst_gaps": "dst_gap",
    "anchors": "anchor",
    "start_ats": "start_at",
    "end_ats": "end_at",
    "next_run_ats": "next_run_at",
    "targets": "target",
    "payloads": "payload",
    "priorities": "priority",
    "flexible_window_ss": "flexible_window_s",
    "misfire_policies": "misfire_policy",
    "max_lateness_ss": "max_lateness_s",
    "overlap_policies": "overlap_policy",
    "retry_max_attemptss": "retry_max_attempts",
    "retry_base_ss": "retry_base_s",
    "retry_cap_ss": "retry_cap_s",
    "deadline_ss": "deadline_s",
    "shards": "shard",
    "created_by_keys": "created_by_key",
    "fires_per_minutes": "fires_per_minute",
    "request_hashes": "request_hash",
    "calendar_ids": "calendar_id",
    "calendar_names": "calendar_name",
    "max_runss": "max_runs",
}


class ScheduleBatches:
    def __init__(self, control: ControlPlane, meter: metrics.Meter | None = None) -> None:
        self.control = control
        self.pool: asyncpg.Pool = control.pool
        self._items = (meter or obs.get_meter("engine")).create_counter(obs.BATCH_SCHEDULES, unit="1")

    async def create_schedules(self, tenant_id: str, items: Sequence[BatchItem]) -> list[dict[str, Any]]:
        """One result per item, in order."""
        if len(items) > MAX_BATCH:
            raise InvalidInput("items", f"at most {MAX_BATCH} items per batch")
        results: list[dict[str, Any] | None] = [None] * len(items)
        keyed, hashes = _keyed(items, results)
        existing = {
            row.created_by_key: row
            for row in map(
                Schedule.from_row,
                await self.pool.fetch(*QUERIES.schedules_by_keys(tenant_id=tenant_id, keys=list(keyed))),
            )
            if row.created_by_key is not None
        }
        _answer_replays(keyed, existing, hashes, results)
        fresh = [(indexes[0], key) for key, indexes in keyed.items() if key not in existing]
        if fresh:
            _answer_replays(keyed, await self._insert(tenant_id, items, fresh, hashes, results), hashes, results)
        final = [result if result is not None else {"index": i, "status": 500} for i, result in enumerate(results)]
        for result in final:
            self._items.add(1, {"status": str(result["status"])})
        return final

    async def _insert(
        self,
        tenant_id: str,
        items: Sequence[BatchItem],
        fresh: list[tuple[int, str]],
        hashes: Mapping[int, str],
        results: list[dict[str, Any] | None],
    ) -> dict[str, Schedule]:
        """Insert the new items; fill their results; return the stored rows by key.

        Items are validated before the tenant's row is locked, so a second batch of the same tenant is
        validated while the first one writes; only the quota admission and the writes hold the lock.
        """
        found = await find_tenant(self.pool, tenant_id)
        payload_limit = found.quotas.max_payload_bytes if found is not None else TenantQuotas.max_payload_bytes
        now = await self.control.now()
        prepared = _prepare(items, fresh, hashes, results, payload_limit, now)
        if not prepared:
            return {}
        async with self.pool.acquire() as conn, conn.transaction():
            quotas: TenantQuotas = (await lock_tenant(conn, tenant_id)).quotas
            prepared = await _resolve_calendars(conn, tenant_id, prepared, results)
            usage = await tenant_usage(conn, tenant_id)
            columns, order = _admit(tenant_id, prepared, quotas, usage.schedules, usage.fires_per_minute, results)
            if not order:
                return {}
            now_arg = self.control.clock.now()
            columns.update(await _cohorts_of(conn, tenant_id, columns, now_arg))
            rows = [
                Schedule.from_row(r)
                for r in await conn.fetch(*QUERIES.insert_schedules(tenant_id=tenant_id, now=now_arg, **columns))
            ]
            await conn.execute(
                *QUERIES.insert_first_versions(
                    tenant_id=tenant_id,
                    schedule_ids=[r.schedule_id for r in rows],
                    versions=[r.version for r in rows],
                    states=[r.state for r in rows],
                    definitions=[definition_of(r) for r in rows],
                    next_run_ats=[r.next_run_at for r in rows],
                    now=now_arg,
                )
            )
            messages = [
                ScheduleStateMessage(r.schedule_id, r.tenant_id, r.version, r.state, r.updated_at) for r in rows
            ]
            await conn.execute(
                *QUERIES.insert_topic_messages(
                    tenant_id=tenant_id,
                    topic=SCHEDULE_STATES_TOPIC,
                    message_keys=[m.key for m in messages],
                    messages=[m.encode() for m in messages],
                    now=now_arg,
                )
            )
            stored: dict[str, Schedule] = {r.created_by_key: r for r in rows if r.created_by_key is not None}
            for index, key in order:
                row = stored.get(key)
                if row is not None:
                    results[index] = {"index": index, "status": 201, "schedule": summary_of(row)}
            missing = [key for _, key in order if key not in stored]
            if missing:  # a concurrent request with the same keys won those inserts
                for row in await conn.fetch(*QUERIES.schedules_by_keys(tenant_id=tenant_id, keys=missing)):
                    stored[row["created_by_key"]] = Schedule.from_row(row)
            return stored


Prepared = tuple[int, str, dict[str, Any], float]  # (item index, key, schedules columns, trigger rate)


async def _resolve_calendars(
    conn: asyncpg.Connection, tenant_id: str, prepared: list[Prepared], results: list[dict[str, Any] | None]
) -> list[Prepared]:
    """The items with their exclusion calendar's id; an item naming a calendar the tenant lacks gets its 404."""
    names = sorted({values["calendar_name"] for _, _, values, _ in prepared if values["calendar_name"] is not None})
    if not names:
        return prepared
    found = {
        row["name"]: row["calendar_id"]
        for row in await conn.fetch(*QUERIES.share_calendars_by_names(tenant_id=tenant_id, names=names))
    }
    kept: list[Prepared] = []
    for index, key, values, rate in prepared:
        name = values["calendar_name"]
        if name is not None and name not in found:
            results[index] = _error(404, NotFound("calendar", name), index)
            continue
        kept.append((index, key, {**values, "calendar_id": found.get(name) if name else None}, rate))
    return kept


def _keyed(
    items: Sequence[BatchItem], results: list[dict[str, Any] | None]
) -> tuple[dict[str, list[int]], dict[int, str]]:
    """Item indexes by idempotency key and each valid item's body hash; malformed items get their 422."""
    keyed: dict[str, list[int]] = {}
    hashes: dict[int, str] = {}
    for index, item in enumerate(items):
        try:
            key = validate_idempotency_key(item.idempotency_key)
            if not isinstance(item.schedule, Mapping):
                raise InvalidInput("schedule", "must be a JSON object", '{"kind": "cron", ...}')
            hashes[index] = request_hash(item.schedule)
        except InvalidInput as err:
            results[index] = _error(422, err, index)
            continue
        keyed.setdefault(key, []).append(index)
    return keyed, hashes


def _answer_replays(
    keyed: Mapping[str, list[int]],
    stored: Mapping[str, Schedule],
    hashes: Mapping[int, str],
    results: list[dict[str, Any] | None],
) -> None:
    """Every still unanswered item whose key is stored: the same body replays it (200), another conflicts."""
    for key, indexes in keyed.items():
        row = stored.get(key)
        if row is None:
            continue
        for index in indexes:
            if results[index] is None:
                results[index] = _replayed(row, hashes[index], key, index)


def _prepare(
    items: Sequence[BatchItem],
    fresh: list[tuple[int, str]],
    hashes: Mapping[int, str],
    results: list[dict[str, Any] | None],
    payload_limit: int,
    now: datetime,
) -> list[Prepared]:
    """Validate the new items exactly like a single create; invalid ones get their 422."""
    prepared: list[Prepared] = []
    for index, key in fresh:
        try:
            request = anchored(parse_schedule_request(items[index].schedule, max_payload_bytes=payload_limit), now)
            next_run_at = first_fire(request, now)
            rate = timing.fires_per_minute(request.spec, now)
        except InvalidInput as err:
            results[index] = _error(422, err, index)
            continue
        schedule_id = uuid.uuid4()
        columns = {
            **definition_columns(request),
            "schedule_id": schedule_id,
            "next_run_at": next_run_at,
            "shard": shard_of(schedule_id),
            "created_by_key": key,
            "fires_per_minute": rate,
            "request_hash": hashes[index],
            "calendar_id": None,  # resolved in the tenant, under the tenant's lock (_resolve_calendars)
            "calendar_name": request.calendar_name,
            "max_runs": request.max_runs,
        }
        prepared.append((index, key, columns, rate))
    return prepared


def _admit(
    tenant_id: str,
    prepared: list[Prepared],
    quotas: TenantQuotas,
    count: int,
    rate_sum: float,
    results: list[dict[str, Any] | None],
) -> tuple[dict[str, list[Any]], list[tuple[int, str]]]:
    """The items that fit the tenant's quotas, in order, as insert_schedules' column arrays; the others 429."""
    columns: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    order: list[tuple[int, str]] = []
    for index, key, values, rate in prepared:
        refused = quota_refusal(tenant_id, quotas, count, rate_sum, rate)
        if refused is not None:
            results[index] = _error(429, refused, index)
            continue
        count, rate_sum = count + 1, rate_sum + rate
        for column, name in _COLUMNS.items():
            columns[column].append(values[name])
        order.append((index, key))
    return columns, order


async def _cohorts_of(
    conn: asyncpg.Connection, tenant_id: str, columns: Mapping[str, list[Any]], now: datetime | None
) -> dict[str, list[Any]]:
    """insert_schedules' cohort arrays for the admitted items (engine/control/cohort_membership.py)."""
    count = len(columns["schedule_ids"])
    rows = [{name: columns[column][i] for column, name in _COLUMNS.items()} for i in range(count)]
    claimed = await claim_cohorts(
        conn, [(tenant_id, row["shard"], cohort_spec_of(row), row["next_run_at"]) for row in rows], now
    )
    return {"cohort_ids": [c for c, _ in claimed], "cohort_bases": [b for _, b in claimed]}


def summary_of(schedule: Schedule) -> dict[str, Any]:
    """What an item's result says of its schedule (a batch of a thousand full definitions would be mostly
    echo; GET /v1/schedules/{id} has the rest)."""
    return {
        "schedule_id": str(schedule.schedule_id),
        "version": schedule.version,
        "state": schedule.state,
        "next_run_at": instant(schedule.next_run_at),
        "target": schedule.target,
    }


def _replayed(row: Schedule, body_hash: str, key: str, index: int) -> dict[str, Any]:
    if row.request_hash != body_hash:
        return _error(
            409,
            Conflict(
                f"Idempotency-Key {key!r} was already used with a different request body"
                f" (schedule {row.schedule_id}); use a new key for a new schedule"
            ),
            index,
        )
    return {"index": index, "status": 200, "schedule": summary_of(row)}

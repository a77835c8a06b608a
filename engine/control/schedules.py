"""The control plane's I/O: schedule changes and reads against the engine database.

Every path that changes a schedule (the HTTP API, the CLI, the command topic,
the Python API) calls :class:`ControlPlane`; requests are validated first by
:mod:`engine.control.schedule_requests` (nothing is written when one is
rejected), quotas are checked by :mod:`engine.control.quotas`, the lifecycle
follows :mod:`engine.rules.schedule_lifecycle`, and results are shown through
:mod:`engine.control.views`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from engine.control import targets
from engine.control.calendars import calendar_by_id, reference_calendar
from engine.control.cohort_membership import claim_cohorts, cohort_spec_of, lock_for_change
from engine.control.identifiers import as_uuid
from engine.control.pagination import decode_cursor, key_of, page_size, split_page, text_filter
from engine.control.quotas import check_quotas
from engine.control.schedule_requests import (
    ScheduleRequest,
    anchored,
    check_changes,
    first_fire,
    parse_changed_request,
    parse_schedule_request,
    preview_fires,
    request_hash,
    split_expected_version,
    validate_idempotency_key,
)
from engine.control.tenants import lock_tenant
from engine.control.views import (
    Page,
    attempt_to_json,
    definition_of,
    occurrence_to_json,
    schedule_to_json,
    version_to_json,
)
from engine.records import Attempt, Occurrence, Schedule, ScheduleVersion
from engine.rules import timing
from engine.rules.occurrence_states import Event, State, transition
from engine.rules.schedule_lifecycle import SCHEDULE_STATES, lifecycle_transition
from engine.rules.shards import shard_of
from engine.rules.slots import Invalidation, cursor_from, may_release, updated_cursor
from schemas.clock import Clock, DatabaseClock
from schemas.errors import Conflict, InvalidInput, NotFound
from schemas.messages import ScheduleStateMessage
from schemas.queries import QUERIES
from schemas.topics import SCHEDULE_STATES_TOPIC


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
        return await (conn or self.pool).fetchval(*QUERIES.current_instant(now=self.clock.now()))

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

    async def create_schedule(
        self,
        tenant_id: str,
        raw: Mapping[str, Any],
        idempotency_key: str | None = None,
        *,
        conn: asyncpg.Connection | None = None,
    ) -> dict[str, Any]:
        """Validate and store a schedule; return it (with schedule_id, version, next_run_at).

        With an idempotency key, repeating the same request returns the stored
        schedule; the same key with a different body is a Conflict.
        """
        body_hash = request_hash(raw)
        if idempotency_key is not None:
            validate_idempotency_key(idempotency_key)
            existing = _schedule(
                await (conn or self.pool).fetchrow(
                    *QUERIES.get_schedule_by_key(tenant_id=tenant_id, created_by_key=idempotency_key)
                )
            )
            if existing is not None:
                return _replayed(existing, body_hash, idempotency_key)
        async with self._transaction(conn) as conn:
            tenant = await lock_tenant(conn, tenant_id)
            request = parse_schedule_request(raw, max_payload_bytes=tenant.quotas.max_payload_bytes)
            await targets.authorize(conn, tenant_id, request.target, self.clock.now())
            calendar = await _calendar_columns(conn, tenant_id, request)
            now = await self.now(conn)
            request = anchored(request, now)
            next_run_at = first_fire(request, now)
            rate = timing.fires_per_minute(request.spec, now)
            await check_quotas(conn, tenant_id, tenant.quotas, rate, exclude=None)
            schedule_id = uuid.uuid4()
            columns = {**definition_columns(request), **calendar}
            shard = shard_of(schedule_id)
            [(cohort_id, cohort_base)] = await claim_cohorts(
                conn, [(tenant_id, shard, cohort_spec_of(columns), next_run_at)], self.clock.now()
            )
            created = _schedule(
                await conn.fetchrow(
                    *QUERIES.insert_schedule(
                        schedule_id=schedule_id,
                        tenant_id=tenant_id,
                        **columns,
                        next_run_at=next_run_at,
                        state="active",
                        shard=shard,
                        cohort_id=cohort_id,
                        cohort_base=cohort_base,
                        created_by_key=idempotency_key,
                        fires_per_minute=rate,
                        request_hash=body_hash,
                        now=self.clock.now(),
                    )
                )
            )
            if created is None:  # a concurrent create with the same key won the insert
                existing = _schedule(
                    await conn.fetchrow(
                        *QUERIES.get_schedule_by_key(tenant_id=tenant_id, created_by_key=idempotency_key)
                    )
                )
                assert existing is not None and idempotency_key is not None  # no key: no conflict possible
                return _replayed(existing, body_hash, idempotency_key)
            await self._record(conn, created, "create")
        return schedule_to_json(created)

    # ------------------------------------------------------------------ reads

    async def get_schedule(self, tenant_id: str, schedule_id: uuid.UUID | str) -> dict[str, Any]:
        schedule = _schedule(
            await self.pool.fetchrow(
                *QUERIES.get_schedule(schedule_id=as_uuid(schedule_id, "schedule"), tenant_id=tenant_id)
            )
        )
        if schedule is None:
            raise NotFound("schedule", schedule_id)
        return schedule_to_json(schedule)

    async def list_schedules(
        self,
        tenant_id: str,
        *,
        state: str | None = None,
        target: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> Page:
        """A tenant's schedules in creation order, ``limit`` at a time."""
        if state is not None and state not in SCHEDULE_STATES:
            raise InvalidInput("state", f"must be one of {', '.join(SCHEDULE_STATES)}", "active")
        target = text_filter("target", target)
        after_at, after_id = decode_cursor(cursor)
        limit = page_size(limit)
        rows = await self.pool.fetch(
            *QUERIES.list_schedules(
                tenant_id=tenant_id, state=state, target=target, after_at=after_at, after_id=after_id, limit=limit + 1
            )
        )
        page, next_cursor = split_page([Schedule.from_row(r) for r in rows], limit, key_of("created_at", "schedule_id"))
        return Page([schedule_to_json(s) for s in page], next_cursor)

    async def list_occurrences(
        self, tenant_id: str, schedule_id: uuid.UUID | str, *, cursor: str | None = None, limit: int = 50
    ) -> Page:
        """One schedule's occurrences, oldest first (NotFound for another tenant's schedule)."""
        sid = as_uuid(schedule_id, "schedule")
        if await self.pool.fetchrow(*QUERIES.get_schedule(schedule_id=sid, tenant_id=tenant_id)) is None:
            raise NotFound("schedule", schedule_id)
        after_at, after_id = decode_cursor(cursor)
        limit = page_size(limit)
        rows = await self.pool.fetch(
            *QUERIES.list_schedule_occurrences(
                schedule_id=sid, tenant_id=tenant_id, after_at=after_at, after_id=after_id, limit=limit + 1
            )
        )
        page, next_cursor = split_page(
            [Occurrence.from_row(r) for r in rows], limit, key_of("scheduled_for", "occurrence_id")
        )
        return Page([occurrence_to_json(o) for o in await self._as_published(list(page))], next_cursor)

    async def get_occurrence(self, tenant_id: str, occurrence_id: uuid.UUID | str) -> dict[str, Any]:
        """An occurrence with its attempts."""
        oid = as_uuid(occurrence_id, "occurrence")
        row = await self.pool.fetchrow(*QUERIES.get_occurrence(occurrence_id=oid, tenant_id=tenant_id))
        if row is None:
            raise NotFound("occurrence", occurrence_id)
        attempts = await self.pool.fetch(*QUERIES.list_attempts(occurrence_id=oid))
        (occurrence,) = await self._as_published([Occurrence.from_row(row)])
        return {
            **occurrence_to_json(occurrence),
            "attempts": [attempt_to_json(Attempt.from_row(a)) for a in attempts],
        }

    async def _as_published(self, occurrences: list[Occurrence]) -> list[Occurrence]:
        """The occurrences as a reader should see them, before the settle pass has written their publication
        down (it runs off the hot path, after a burst): a SCHEDULED one that the ahead-lane relay already
        published (its page is in the dispatch log) is ENQUEUED since that page's acknowledgement; one a
        consumer started meanwhile shows that acknowledgement as ``enqueued_at``, not the instant the attempt
        processor applied its start (the value the settle pass replaces)."""
        if not occurrences:
            return occurrences
        # Any state: the settle pass records the acknowledgement on whatever state its row reached.
        acked = {
            r["occurrence_id"]: r["acked_at"]
            for r in await self.pool.fetch(
                *QUERIES.ahead_enqueued_at(
                    occurrence_ids=[o.occurrence_id for o in occurrences],
                    schedule_ids=[o.schedule_id for o in occurrences],
                    available_ats=[o.available_at for o in occurrences],
                )
            )
        }
        published = transition(State.SCHEDULED, Event.PUBLISHED).value
        return [
            dataclasses.replace(
                o,
                state=published if o.state == State.SCHEDULED.value else o.state,
                enqueued_at=acked[o.occurrence_id],
            )
            if o.occurrence_id in acked
            else o
            for o in occurrences
        ]

    async def schedule_history(self, tenant_id: str, schedule_id: uuid.UUID | str) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(
            *QUERIES.list_schedule_versions(schedule_id=as_uuid(schedule_id, "schedule"), tenant_id=tenant_id)
        )
        if not rows:
            raise NotFound("schedule", schedule_id)
        return [version_to_json(ScheduleVersion.from_row(r)) for r in rows]

    # ------------------------------------------------------------------ changes

    async def update_schedule(
        self,
        tenant_id: str,
        schedule_id: uuid.UUID | str,
        changes: Mapping[str, Any],
        *,
        conn: asyncpg.Connection | None = None,
    ) -> dict[str, Any]:
        """Apply a partial definition change as a new version.

        Unfinished occurrences of older versions become CANCELED (RUNNING ones
        finish). The new definition continues from the durable cursor (or from
        the earliest slot the change released, if earlier): instants that fell
        due meanwhile follow the misfire policy, and a slot that may already
        have been published keeps its old occurrence instead of running again.

        ``expected_version`` among the changes makes the update conditional: Conflict, and nothing changed,
        if the schedule has moved on since the caller read it (two editors never overwrite each other).
        """
        expected, changes = split_expected_version(changes)
        check_changes(changes)
        async with self._transaction(conn) as conn:
            row = await self._lock(conn, tenant_id, schedule_id)
            if expected is not None and expected != row.version:
                raise Conflict(
                    f"schedule {row.schedule_id} is at version {row.version}, not {expected}; read it again"
                    " and reapply your change"
                )
            state = lifecycle_transition(row.state, "update")
            tenant = await lock_tenant(conn, tenant_id)
            request = parse_changed_request(
                definition_of(row), changes, max_payload_bytes=tenant.quotas.max_payload_bytes
            )
            if request.target != row.target:
                await targets.authorize(conn, tenant_id, request.target, self.clock.now())
            calendar = await _calendar_columns(conn, tenant_id, request)
            now = await self.now(conn)
            request = anchored(request, now)
            if _unchanged(row, {**definition_columns(request), **calendar}):
                # The stored definition sent again (a deploy re-applying it): no version, nothing canceled. As
                # a change it would cancel what is materialized ahead, and a published one keeps its slot.
                return _change_report(row, Invalidation())
            first = first_fire(request, now)  # also rejects a one-time instant already past
            rate = timing.fires_per_minute(request.spec, now)
            await check_quotas(conn, tenant_id, tenant.quotas, rate, exclude=row.schedule_id)
            invalidation = await self._invalidate_older_versions(conn, row.schedule_id, row.version + 1)
            start = cursor_from(row.next_run_at, invalidation.earliest_released)
            next_run_at = updated_cursor(request.spec, start, now, first)
            updated = Schedule.from_row(
                await conn.fetchrow(
                    *QUERIES.replace_schedule(
                        schedule_id=row.schedule_id,
                        tenant_id=tenant_id,
                        **definition_columns(request),
                        **calendar,
                        next_run_at=next_run_at,
                        state=state,
                        fires_per_minute=rate,
                        now=self.clock.now(),
                    )
                )
            )
            updated = await self._give_back_runs(conn, updated, invalidation)
            if request.max_runs is not None and request.max_runs <= updated.runs:
                # Raised inside the transaction: the new version and the cancellations roll back.
                raise InvalidInput(
                    "max_runs",
                    f"the schedule has already run {updated.runs} times; give more"
                    f" than {updated.runs}, or cancel the schedule",
                    str(updated.runs + 1),
                )
            await self._record(conn, updated, "update")
        return _change_report(updated, invalidation)

    async def pause_schedule(
        self, tenant_id: str, schedule_id: uuid.UUID | str, *, conn: asyncpg.Connection | None = None
    ) -> dict[str, Any]:
        """Stop firing; occurrences not yet started are canceled. Slots never published are judged again
        on resume (the cursor rewinds to the earliest of them); possibly published ones are not run again."""
        return await self._change_state(tenant_id, schedule_id, "pause", conn)

    async def resume_schedule(
        self, tenant_id: str, schedule_id: uuid.UUID | str, *, conn: asyncpg.Connection | None = None
    ) -> dict[str, Any]:
        """Fire again from the durable cursor: what was missed while paused follows the misfire policy."""
        return await self._change_state(tenant_id, schedule_id, "resume", conn)

    async def cancel_schedule(
        self, tenant_id: str, schedule_id: uuid.UUID | str, *, conn: asyncpg.Connection | None = None
    ) -> dict[str, Any]:
        """Stop for good. Nothing is deleted: the schedule, its versions and occurrences stay readable."""
        return await self._change_state(tenant_id, schedule_id, "cancel", conn)

    async def _change_state(
        self, tenant_id: str, schedule_id: uuid.UUID | str, action: str, conn: asyncpg.Connection | None
    ) -> dict[str, Any]:
        async with self._transaction(conn) as conn:
            row = await self._lock(conn, tenant_id, schedule_id)
            state = lifecycle_transition(row.state, action)
            if state == row.state:
                return _change_report(row, Invalidation())
            invalidation = await self._invalidate_older_versions(conn, row.schedule_id, row.version + 1)
            # Released slots (materialized ahead, never published) are judged again from the cursor with
            # the misfire policy; possibly published ones keep their canceled occurrence and the unique
            # slot index (occurrences_slot, migration 0028) keeps the materializer from running them twice.
            cursor = None if state == "canceled" else cursor_from(row.next_run_at, invalidation.earliest_released)
            updated = Schedule.from_row(
                await conn.fetchrow(
                    *QUERIES.change_schedule_state(
                        schedule_id=row.schedule_id,
                        tenant_id=tenant_id,
                        state=state,
                        next_run_at=cursor,
                        now=self.clock.now(),
                    )
                )
            )
            updated = await self._give_back_runs(conn, updated, invalidation)
            await self._record(conn, updated, action)
        return _change_report(updated, invalidation)

    async def _lock(self, conn: asyncpg.Connection, tenant_id: str, schedule_id: uuid.UUID | str) -> Schedule:
        return await lock_for_change(conn, tenant_id, schedule_id, self.clock.now())

    async def _invalidate_older_versions(
        self, conn: asyncpg.Connection, schedule_id: uuid.UUID, new_version: int
    ) -> Invalidation:
        """Cancel the unfinished occurrences of versions before ``new_version`` (RUNNING ones excepted);
        release the slots of those proven never published (:func:`engine.rules.slots.may_release`)."""
        targets = await conn.fetch(
            *QUERIES.lock_unfinished_older_occurrences(schedule_id=schedule_id, new_version=new_version)
        )
        if not targets:
            return Invalidation()
        scheduled = [t["occurrence_id"] for t in targets if t["state"] == State.SCHEDULED.value]
        published: set[uuid.UUID] = set()
        if scheduled:
            published = {
                r["occurrence_id"]
                for r in await conn.fetch(*QUERIES.lock_deliveries(schedule_id=schedule_id, occurrence_ids=scheduled))
                if r["possibly_published"]
            }
        cancel = [t for t in targets if t["state"] != State.RUNNING.value]
        released = [t for t in cancel if may_release(t["state"], t["occurrence_id"] in published)]
        canceled = await conn.fetchval(
            *QUERIES.cancel_older_occurrences(
                occurrence_ids=[t["occurrence_id"] for t in cancel],
                released_ids=[t["occurrence_id"] for t in released],
                new_version=new_version,
                now=self.clock.now(),
            )
        )
        return Invalidation(
            canceled=canceled,
            released=len(released),
            still_running=len(targets) - len(cancel),
            earliest_released=min((t["scheduled_for"] for t in released), default=None),
            never_started=sum(t["state"] in (State.SCHEDULED.value, State.ENQUEUED.value) for t in cancel),
        )

    async def _give_back_runs(self, conn: asyncpg.Connection, row: Schedule, invalidation: Invalidation) -> Schedule:
        """Canceled occurrences that never started were not runs: max_runs does not count them."""
        if not invalidation.never_started:
            return row
        return Schedule.from_row(
            await conn.fetchrow(*QUERIES.give_back_runs(schedule_id=row.schedule_id, count=invalidation.never_started))
        )

    async def preview_schedule(
        self, tenant_id: str, schedule_id: uuid.UUID | str, *, after: datetime | None = None, count: int = 10
    ) -> dict[str, Any]:
        """The next fires of a stored schedule after ``after`` (default: now) under its definition, its
        calendar's current version and the runs it has left (see ``preview_fires``)."""
        schedule = _schedule(
            await self.pool.fetchrow(
                *QUERIES.get_schedule(schedule_id=as_uuid(schedule_id, "schedule"), tenant_id=tenant_id)
            )
        )
        if schedule is None:
            raise NotFound("schedule", schedule_id)
        if after is None:
            after = await self.now()
        calendar = (
            await calendar_by_id(self.pool, tenant_id, schedule.calendar_id)
            if schedule.calendar_id is not None
            else None
        )
        preview = preview_fires(definition_of(schedule), after, count, calendar=calendar, runs=schedule.runs)
        if schedule.state not in ("active", "paused"):
            preview = {**preview, "fires": [], "excluded": []}  # a finished schedule fires no more
        return {"schedule_id": str(schedule.schedule_id), "state": schedule.state, **preview}

    async def _record(self, conn: asyncpg.Connection, row: Schedule, change: str) -> None:
        """Version history row + schedule state message, in the change's transaction."""
        now = self.clock.now()
        await conn.execute(
            *QUERIES.insert_schedule_version(
                schedule_id=row.schedule_id,
                version=row.version,
                tenant_id=row.tenant_id,
                change=change,
                state=row.state,
                definition=definition_of(row),
                next_run_at=row.next_run_at,
                now=now,
            )
        )
        message = ScheduleStateMessage(row.schedule_id, row.tenant_id, row.version, row.state, row.updated_at)
        await conn.execute(
            *QUERIES.insert_topic_message(
                tenant_id=row.tenant_id,
                topic=SCHEDULE_STATES_TOPIC,
                message_key=message.key,
                message=message.encode(),
                now=now,
            )
        )


def definition_columns(request: ScheduleRequest) -> dict[str, Any]:
    """The schedules columns a request defines (insert_schedule and replace_schedule take them by name)."""
    spec = request.spec
    return {
        "kind": spec.kind,
        "expression": spec.expression,
        "time_zone": spec.time_zone,
        "dst_repeat": spec.dst_repeat,
        "dst_gap": spec.dst_gap,
        "anchor": spec.anchor,
        "start_at": spec.start_at,
        "end_at": spec.end_at,
        "target": request.target,
        "payload": request.payload,
        "priority": request.priority,
        "flexible_window_s": int(request.flexible_window.total_seconds()),
        "misfire_policy": request.misfire_text,
        "max_lateness_s": int(request.misfire.max_lateness.total_seconds()),
        "overlap_policy": request.overlap_policy,
        "retry_max_attempts": request.max_attempts,
        "retry_base_s": request.retry_base.total_seconds(),
        "retry_cap_s": request.retry_cap.total_seconds(),
        "deadline_s": int(request.deadline.total_seconds()) if request.deadline else None,
    }


def _unchanged(row: Schedule, columns: dict[str, Any]) -> bool:
    """Whether the definition columns of a change are the stored ones, every one of them. The payload is
    compared as JSON text with sorted keys, not as Python values: ``true`` and ``1``, or ``1`` and ``1.0``,
    are equal in Python but not to a consumer."""
    for name, value in columns.items():
        stored = getattr(row, name)
        if name == "payload":
            if orjson.dumps(stored, option=orjson.OPT_SORT_KEYS) != orjson.dumps(value, option=orjson.OPT_SORT_KEYS):
                return False
        elif stored != value:
            return False
    return True


def _change_report(schedule: Schedule, invalidation: Invalidation) -> dict[str, Any]:
    """A changed schedule plus what the change did to older versions' unfinished occurrences.

    canceled_occurrences: CANCELED now (each records the version that canceled it); released_slots: of
    those, never published, so the new version may run their instants (from the cursor, under the misfire
    policy); still_running: RUNNING, not canceled — they finish, and a failure is not retried.
    """
    return {
        **schedule_to_json(schedule),
        "canceled_occurrences": invalidation.canceled,
        "released_slots": invalidation.released,
        "still_running": invalidation.still_running,
    }


def _schedule(row: asyncpg.Record | None) -> Schedule | None:
    return Schedule.from_row(row) if row is not None else None


async def _calendar_columns(conn: asyncpg.Connection, tenant_id: str, request: ScheduleRequest) -> dict[str, Any]:
    """The calendar reference and run limit columns; another tenant's calendar is simply not found (404)."""
    if request.calendar_name is None:
        return {"calendar_id": None, "calendar_name": None, "max_runs": request.max_runs}
    calendar = await reference_calendar(conn, tenant_id, request.calendar_name)
    return {"calendar_id": calendar.calendar_id, "calendar_name": calendar.name, "max_runs": request.max_runs}


def _replayed(existing: Schedule, request_hash: str, key: str) -> dict[str, Any]:
    if existing.request_hash != request_hash:
        raise Conflict(
            f"Idempotency-Key {key!r} was already used with a different request body (schedule"
            f" {existing.schedule_id}); use a new key for a new schedule"
        )
    return schedule_to_json(existing)

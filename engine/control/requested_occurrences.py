"""Occurrences a principal asks for outside the schedule's own firing: backfill and trigger now.

* :func:`backfill` fires the past slots of a window with the **same
  deterministic ids** the schedule's own firing uses — (schedule, current
  version, slot) — so running it twice creates nothing the second time (what
  each slot gets is decided by :mod:`engine.rules.backfill_plan`). It is
  bounded (:data:`MAX_BACKFILL_SLOTS` slots per request, a window in the past)
  and paced by the tenant's ``catch_up_per_minute`` quota
  (:mod:`engine.rules.catch_up_pacing`): slots beyond the quota wait in the
  outbox until their release instant, and the timeline shows them held.
* :func:`trigger_now` creates one manual occurrence due now, with an id of its
  own (derived from an idempotency key when one is given, so a retried request
  fires once) and a record of who asked.

Both write the occurrence and its outbox row in one transaction that holds the
schedule's row lock, exactly like the materializer; a schedule with an overlap
policy gets its rows held for the overlap gate, so both are subject to the
policy like any other fire. Each occurrence carries ``origin`` and
``requested_by``.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from opentelemetry import metrics

from engine.control.calendars import calendar_by_id
from engine.control.cohort_membership import lock_for_change
from engine.control.targets import binding_versions
from engine.control.views import instant, occurrence_to_json
from engine.loops.overlap_gate import OVERLAP_GATE_TOKEN
from engine.records import Occurrence, Schedule
from engine.rules import timing
from engine.rules.backfill_plan import BackfillPlan, ExistingOccurrence, plan_backfill
from engine.rules.catch_up_pacing import pace
from engine.rules.occurrence_states import Event, transition
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.errors import Conflict, InvalidInput, QuotaExceeded
from schemas.identity import occurrence_id as slot_occurrence_id
from schemas.messages import OccurrenceMessage
from schemas.queries import QUERIES
from schemas.topics import occurrence_topic, schedule_key

log = logging.getLogger("chronoq.requested_occurrences")

#: Slots one backfill request may cover; split longer windows.
MAX_BACKFILL_SLOTS = 10_000
#: A backfill whose last slot would wait longer than this for the catch-up quota is refused.
MAX_PACING_WAIT = timedelta(hours=24)
#: Namespace of manual occurrence ids derived from an idempotency key.
MANUAL_NAMESPACE = uuid.UUID("0b7a3c52-5f0e-4a47-9d0c-6d616e75616c")
_MICROSECOND = timedelta(microseconds=1)


@dataclass
class BackfillResult:
    schedule_id: str
    tenant_id: str
    version: int
    window_from: datetime
    window_to: datetime
    slots: int
    created: int
    refired: int
    present: dict[str, int] = field(default_factory=dict)  # slots left alone, by the state they are in
    first_release: datetime | None = None
    last_release: datetime | None = None
    excluded: int = 0  # slots the schedule's exclusion calendar removes (not fired by a backfill either)

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule_id": self.schedule_id,
            "tenant_id": self.tenant_id,
            "version": self.version,
            "from": instant(self.window_from),
            "to": instant(self.window_to),
            "slots": self.slots,
            "created": self.created,
            "refired": self.refired,
            "present": self.present,
            "excluded": self.excluded,
            "first_release": instant(self.first_release),
            "last_release": instant(self.last_release),
        }


class RequestedOccurrences:
    def __init__(self, pool: asyncpg.Pool, clock: Clock | None = None, meter: metrics.Meter | None = None) -> None:
        self.pool = pool
        self.clock = clock or DatabaseClock()
        meter = meter or obs.get_meter("engine")
        self._backfilled = meter.create_counter(obs.BACKFILLED_OCCURRENCES, unit="1")
        self._manual = meter.create_counter(obs.MANUAL_TRIGGERS, unit="1")

    async def backfill(
        self,
        tenant_id: str,
        schedule_id: uuid.UUID | str,
        window_from: datetime,
        window_to: datetime,
        requested_by: str,
    ) -> BackfillResult:
        """Fire the slots of ``[window_from, window_to]`` (a past window) that never ran."""
        if window_to < window_from:
            raise InvalidInput("to", "must not be before from", instant(window_from + timedelta(hours=1)))
        async with self.pool.acquire() as conn, conn.transaction():
            now: datetime = await conn.fetchval(*QUERIES.current_instant(now=self.clock.now()))
            if window_to > now:
                raise InvalidInput(
                    "to",
                    f"is in the future (now is {instant(now)}); a backfill covers past slots"
                    " only, the schedule fires the future ones itself",
                    instant(now),
                )
            schedule = await self._lock(conn, tenant_id, schedule_id)
            if schedule.state not in ("active", "completed"):
                raise Conflict(
                    f"schedule {schedule.schedule_id} is {schedule.state}: resume it before"
                    " a backfill (its occurrences would be canceled or skipped)"
                )
            # The calendar's current version applies: a backfill fires what the schedule would have, and
            # the slots of listed dates are excluded from it too (counted, not fired).
            calendar = (
                await calendar_by_id(conn, schedule.tenant_id, schedule.calendar_id)
                if schedule.calendar_id is not None
                else None
            )
            spec = dataclasses.replace(schedule.spec, calendar=calendar)
            slots = timing.fire_times(spec, window_from - _MICROSECOND, MAX_BACKFILL_SLOTS + 1, window_to)
            excluded = (
                len(timing.excluded_slots(spec, None, window_from - _MICROSECOND, window_to, MAX_BACKFILL_SLOTS))
                if calendar is not None
                else 0
            )
            if len(slots) > MAX_BACKFILL_SLOTS:
                raise InvalidInput(
                    "to",
                    f"the window holds more than {MAX_BACKFILL_SLOTS} slots; split it into shorter windows",
                    instant(slots[MAX_BACKFILL_SLOTS - 1]),
                )
            # Locked before the read (the history pruner skips them), then read from both tables at once:
            # a slot that ran and was archived is as present as one still hot.
            await conn.execute(*QUERIES.lock_refire_candidates(schedule_id=schedule.schedule_id, slots=slots))
            rows = await conn.fetch(*QUERIES.slot_occurrences(schedule_id=schedule.schedule_id, slots=slots))
            plan = plan_backfill(
                slots,
                [
                    ExistingOccurrence(
                        r["occurrence_id"], r["schedule_version"], r["scheduled_for"], r["state"], r["archived"]
                    )
                    for r in rows
                ],
                schedule.version,
            )
            result = BackfillResult(
                str(schedule.schedule_id),
                schedule.tenant_id,
                schedule.version,
                window_from,
                window_to,
                len(slots),
                len(plan.create),
                len(plan.refire),
                dict(sorted(plan.present.items())),
                excluded=excluded,
            )
            if plan.released:
                release = await self._release(conn, schedule, plan, now, requested_by)
                result.first_release, result.last_release = release[0], release[-1]
        if plan.released:
            self._backfilled.add(plan.released)
        log.info(
            "backfill",
            extra={
                "action": "schedule.backfill",
                "schedule_id": result.schedule_id,
                "tenant_id": result.tenant_id,
                "requested_by": requested_by,
                "slots": result.slots,
                "created": result.created,
                "refired": result.refired,
            },
        )
        return result

    async def _release(
        self, conn: asyncpg.Connection, schedule: Schedule, plan: BackfillPlan, now: datetime, requested_by: str
    ) -> list[datetime]:
        """Write the plan's occurrences, paced by the tenant's catch-up clock; return the release instants."""
        quota = await conn.fetchval(*QUERIES.tenant_catch_up_quota(tenant_id=schedule.tenant_id))
        if not quota:
            raise QuotaExceeded("catch_up_per_minute", quota or 0, plan.released)
        free_at = await conn.fetchval(*QUERIES.lock_catch_up_clock(tenant_id=schedule.tenant_id, now=now))
        pacing = pace(plan.released, quota, now, free_at)
        if pacing.release_at[-1] - now > MAX_PACING_WAIT:
            raise QuotaExceeded("catch_up_per_minute", quota, plan.released)
        await conn.execute(*QUERIES.set_catch_up_clock(tenant_id=schedule.tenant_id, free_at=pacing.free_at))
        targets: list[tuple[datetime, ExistingOccurrence | None]] = sorted(
            [(slot, None) for slot in plan.create] + [(occ.scheduled_for, occ) for occ in plan.refire],
            key=lambda t: t[0],
        )
        new, refire = _Rows(), _Rows()
        bound = (await binding_versions(conn, [schedule.target])).get(schedule.target)
        for (slot, existing), release in zip(targets, pacing.release_at, strict=True):
            if existing is not None:
                transition(existing.state, Event.BACKFILL)  # the state machine's one definition
                refire.add(
                    existing.occurrence_id,
                    slot,
                    release,
                    _message(schedule, existing.occurrence_id, slot, release, bound),
                )
            else:
                oid = slot_occurrence_id(schedule.schedule_id, schedule.version, slot)
                new.add(oid, slot, release, _message(schedule, oid, slot, release, bound))
        common = _common(schedule, "backfill", requested_by, now)
        archived = [occ.occurrence_id for occ in plan.refire if occ.archived]
        if archived:
            restored = await conn.fetchrow(
                *QUERIES.restore_archived_occurrences(
                    occurrence_ids=archived,
                    schedule_id=schedule.schedule_id,
                    version=schedule.version,
                    tenant_id=schedule.tenant_id,
                )
            )
            if restored["occurrences"] != len(archived):  # raised in the transaction: all of it rolls back
                raise Conflict(
                    f"backfill of schedule {schedule.schedule_id}: {len(archived)} archived occurrences to"
                    f" fire again, {restored['occurrences']} could be restored (a slot taken meanwhile);"
                    " nothing was written, read the schedule's timeline and retry the backfill"
                )
        if new.ids:
            await conn.fetchval(*QUERIES.insert_requested_occurrences(**new.columns(), **common))
        if refire.ids:
            await conn.fetchval(*QUERIES.refire_occurrences(**refire.columns(), **common))
        return pacing.release_at

    async def trigger_now(
        self, tenant_id: str, schedule_id: uuid.UUID | str, requested_by: str, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """One manual occurrence due now; the same ``idempotency_key`` returns the same occurrence."""
        async with self.pool.acquire() as conn, conn.transaction():
            now: datetime = await conn.fetchval(*QUERIES.current_instant(now=self.clock.now()))
            schedule = await self._lock(conn, tenant_id, schedule_id)
            if schedule.state == "canceled":
                raise Conflict(f"schedule {schedule.schedule_id} is canceled: consumers skip its occurrences")
            if idempotency_key is not None:
                if not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= 200:
                    raise InvalidInput("Idempotency-Key", "must be 1-200 characters", "run-now-42")
                oid = uuid.uuid5(MANUAL_NAMESPACE, f"{schedule.schedule_id}/{idempotency_key}")
            else:
                oid = uuid.uuid4()
            # Looked up before the insert: the occurrence key includes the instant, so a retry of the same key
            # (asking later) would not conflict with the first. The schedule's lock orders concurrent retries.
            existing = await conn.fetchrow(
                *QUERIES.requested_occurrence(occurrence_id=oid, schedule_id=schedule.schedule_id)
            )
            created = 0
            if existing is None:
                rows = _Rows()
                bound = (await binding_versions(conn, [schedule.target])).get(schedule.target)
                rows.add(oid, now, now, _message(schedule, oid, now, now, bound))
                created = await conn.fetchval(
                    *QUERIES.insert_requested_occurrences(
                        **rows.columns(), **_common(schedule, "manual", requested_by, now)
                    )
                )
                existing = await conn.fetchrow(
                    *QUERIES.requested_occurrence(occurrence_id=oid, schedule_id=schedule.schedule_id)
                )
            occurrence = Occurrence.from_row(existing)
        if created:
            self._manual.add(1)
            log.info(
                "manual trigger",
                extra={
                    "action": "schedule.triggered",
                    "schedule_id": str(schedule.schedule_id),
                    "occurrence_id": str(oid),
                    "tenant_id": schedule.tenant_id,
                    "requested_by": requested_by,
                },
            )
        return {**occurrence_to_json(occurrence), "created": bool(created)}

    async def _lock(self, conn: asyncpg.Connection, tenant_id: str, schedule_id: uuid.UUID | str) -> Schedule:
        return await lock_for_change(conn, tenant_id, schedule_id, self.clock.now())


class _Rows:
    """Column arrays of occurrences to write."""

    def __init__(self) -> None:
        self.ids: list[uuid.UUID] = []
        self.slots: list[datetime] = []
        self.release: list[datetime] = []
        self.messages: list[bytes] = []

    def add(self, oid: uuid.UUID, slot: datetime, release: datetime, message: bytes) -> None:
        self.ids.append(oid)
        self.slots.append(slot)
        self.release.append(release)
        self.messages.append(message)

    def columns(self) -> dict[str, list[Any]]:
        return {"occurrence_ids": self.ids, "slots": self.slots, "releases": self.release, "messages": self.messages}


def _common(schedule: Schedule, origin: str, requested_by: str, now: datetime) -> dict[str, Any]:
    return {
        "schedule_id": schedule.schedule_id,
        "version": schedule.version,
        "tenant_id": schedule.tenant_id,
        "target": schedule.target,
        "origin": origin,
        "requested_by": requested_by,
        "now": now,
        "topic": occurrence_topic(schedule.target),
        "message_key": schedule_key(schedule.schedule_id),
        "held": schedule.gated,
        "gate_token": OVERLAP_GATE_TOKEN,
    }


def _message(
    schedule: Schedule, oid: uuid.UUID, slot: datetime, release: datetime, binding_version: int | None
) -> bytes:
    # The deadline counts from the release: a backfilled slot is hours old by design.
    deadline = schedule.deadline
    return OccurrenceMessage(
        occurrence_id=oid,
        schedule_id=schedule.schedule_id,
        schedule_version=schedule.version,
        tenant_id=schedule.tenant_id,
        target=schedule.target,
        scheduled_for=slot,
        available_at=release,
        attempt=1,
        priority=schedule.priority,
        deadline=release + deadline if deadline else None,
        payload=schedule.payload,
        binding_version=binding_version,
    ).encode()

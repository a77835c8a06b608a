"""The dead-letter list: DEAD occurrences, listed per tenant and replayed by id.

An occurrence goes DEAD when its attempts ran out, its error was permanent,
its deadline passed or its tenant's retry budget was spent; the engine then
also publishes a dead-occurrence record to ``chronoq.dead-letters``
(``schemas/dead_letter_messages.py``). The database is the list of record:
:func:`list_dead_letters` reads it, :func:`replay_dead_letter` re-enqueues
one occurrence — the **same occurrence_id**, so a consumer that had in fact
applied it (its dedupe row exists) acknowledges it without a second effect.

Plain async functions over a pool: the HTTP API and ``chronoq dlq`` call them
with the caller's tenant; another tenant's occurrence is simply not found.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import datetime
from typing import Any

import asyncpg

from engine.control.identifiers import as_uuid
from engine.control.pagination import decode_cursor, key_of, page_size, split_page
from engine.control.views import dead_letter_to_json
from engine.loops.attempt_outcomes import lock_occurrence, original_message
from engine.records import DeadLetter, Occurrence
from engine.rules.occurrence_states import Event, State, transition
from schemas.clock import Clock, DatabaseClock
from schemas.errors import Conflict, NotFound
from schemas.messages import OccurrenceMessage, format_instant
from schemas.queries import QUERIES
from schemas.topics import occurrence_topic, schedule_key

log = logging.getLogger("chronoq.dead_letters")


async def list_dead_letters(
    pool: asyncpg.Pool, tenant_id: str | None, *, limit: int = 100, cursor: str | None = None
) -> dict[str, Any]:
    """A page of DEAD occurrences, oldest death first: ``{"items": [...], "next_cursor": ...}``.

    ``tenant_id`` None lists every tenant (operators only: the CLI without
    ``--tenant``); the API always passes the caller's tenant.
    """
    limit = page_size(limit)
    after, after_id = decode_cursor(cursor)
    rows = await pool.fetch(
        *QUERIES.list_dead_letters(tenant_id=tenant_id, after_at=after, after_id=after_id, limit=limit + 1)
    )
    page, next_cursor = split_page(
        [DeadLetter.from_row(r) for r in rows], limit, key_of("finished_at", "occurrence_id")
    )
    return {"items": [dead_letter_to_json(dead) for dead in page], "next_cursor": next_cursor}


async def replay_dead_letter(
    pool: asyncpg.Pool, tenant_id: str, occurrence_id: uuid.UUID | str, clock: Clock | None = None
) -> dict[str, Any]:
    """Re-enqueue a DEAD occurrence of ``tenant_id`` with the same occurrence_id; return it.

    The occurrence becomes RETRY_WAIT with a new delivery due now (attempt
    number continuing, attempts before the replay no longer counted against
    max_attempts). NotFound for another tenant's or an unknown id; Conflict if
    it is not DEAD, or if its schedule changed since (a newer version or
    canceled: consumers would skip it as obsolete).
    """
    clock = clock or DatabaseClock()
    ident = as_uuid(occurrence_id, "occurrence")
    async with pool.acquire() as conn, conn.transaction():
        now: datetime = await conn.fetchval(*QUERIES.current_instant(now=clock.now()))
        occ = await lock_occurrence(conn, ident)
        if occ is None or occ.tenant_id != tenant_id:
            raise NotFound("occurrence", occurrence_id)
        if occ.state != State.DEAD.value:
            raise Conflict(f"occurrence {ident} is {occ.state}, not DEAD: only dead letters can be replayed")
        if occ.schedule_state == "canceled" or occ.current_version != occ.schedule_version:
            raise Conflict(
                f"occurrence {ident} belongs to version {occ.schedule_version} of its schedule, which is now"
                f" {occ.schedule_state} at version {occ.current_version}: consumers would skip it as"
                " obsolete; fire the current version instead"
            )
        transition(State.DEAD, Event.REPLAY)
        original = await original_message(conn, occ)
        message: OccurrenceMessage = dataclasses.replace(original, attempt=occ.attempt_count + 1, available_at=now)
        await conn.execute(
            *QUERIES.insert_outbox_row(
                occurrence_id=ident,
                tenant_id=tenant_id,
                topic=occurrence_topic(occ.target),
                message_key=schedule_key(occ.schedule_id),
                message=message.encode(),
                due=now,
                now=now,
            )
        )
        replayed = Occurrence.from_row(await conn.fetchrow(*QUERIES.replay_occurrence(occurrence_id=ident, now=now)))
    log.info(
        "dead letter replayed",
        extra={
            "action": "occurrence.replayed",
            "occurrence_id": str(ident),
            "schedule_id": str(replayed.schedule_id),
            "tenant_id": tenant_id,
            "attempt": message.attempt,
        },
    )
    return {
        "occurrence_id": str(ident),
        "schedule_id": str(replayed.schedule_id),
        "tenant_id": tenant_id,
        "state": replayed.state,
        "attempt": message.attempt,
        "replays": replayed.replay_count,
        "available_at": format_instant(now),
    }

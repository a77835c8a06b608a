"""The one row factory of the tests: schedules, due occurrences and their outbox rows, inserted directly.

Direct inserts (test data only; runtime code goes through named queries), so
the relay, the consumer runtime and the attempt side can be tested without the
materializer or the control plane. Schedules take a retry/overlap policy.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import asyncpg

from schemas.identity import occurrence_id
from schemas.messages import OccurrenceMessage
from schemas.topics import occurrence_topic, schedule_key


async def insert_schedule(
    conn: asyncpg.Connection | asyncpg.Pool,
    tenant: str,
    target: str,
    at: datetime,
    *,
    max_attempts: int = 3,
    base: float = 1.0,
    cap: float = 300.0,
    deadline_s: int | None = None,
    overlap: str = "allow",
    kind: str = "once",
    expression: str | None = None,
) -> uuid.UUID:
    schedule_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO schedules (schedule_id, tenant_id, kind, expression, target, next_run_at, shard,"
        " retry_max_attempts, retry_base_s, retry_cap_s, deadline_s, overlap_policy)"
        " VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $8, $9, $10, $11)",
        schedule_id,
        tenant,
        kind,
        expression or at.isoformat(),
        target,
        at,
        max_attempts,
        base,
        cap,
        deadline_s,
        overlap,
    )
    return schedule_id


async def insert_occurrence(
    conn: asyncpg.Connection | asyncpg.Pool,
    schedule_id: uuid.UUID,
    tenant: str,
    target: str,
    at: datetime,
    *,
    version: int = 1,
    deadline_s: int | None = None,
    payload: object = None,
    state: str = "SCHEDULED",
) -> OccurrenceMessage:
    """One occurrence of ``schedule_id`` at ``at`` with its outbox row (attempt 1)."""
    message = OccurrenceMessage(
        occurrence_id=occurrence_id(schedule_id, version, at),
        schedule_id=schedule_id,
        schedule_version=version,
        tenant_id=tenant,
        target=target,
        scheduled_for=at,
        available_at=at,
        deadline=at + timedelta(seconds=deadline_s) if deadline_s else None,
        payload=payload if payload is not None else {"n": 1},
    )
    await conn.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, state) VALUES ($1, $2, $3, $4, $5, $6, $6, $7)",
        message.occurrence_id,
        schedule_id,
        version,
        tenant,
        target,
        at,
        state,
    )
    await conn.execute(
        "INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $6)",
        message.occurrence_id,
        tenant,
        occurrence_topic(target),
        schedule_key(schedule_id),
        message.encode(),
        at,
    )
    return message


async def insert_occurrences(
    conn: asyncpg.Connection | asyncpg.Pool, schedule_id: uuid.UUID, tenant: str, target: str, instants: list[datetime]
) -> list[OccurrenceMessage]:
    """Many occurrences of one schedule (one per instant) with their outbox rows, in two batched inserts."""
    messages = [
        OccurrenceMessage(
            occurrence_id=occurrence_id(schedule_id, 1, at),
            schedule_id=schedule_id,
            schedule_version=1,
            tenant_id=tenant,
            target=target,
            scheduled_for=at,
            available_at=at,
            payload={"n": 1},
        )
        for at in instants
    ]
    await conn.executemany(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, state) VALUES ($1, $2, 1, $3, $4, $5, $5, 'SCHEDULED')",
        [(m.occurrence_id, schedule_id, tenant, target, m.scheduled_for) for m in messages],
    )
    await conn.executemany(
        "INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $6)",
        [
            (m.occurrence_id, tenant, occurrence_topic(target), schedule_key(schedule_id), m.encode(), m.scheduled_for)
            for m in messages
        ],
    )
    return messages


async def due_occurrence(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, target: str, at: datetime, **policy: object
) -> OccurrenceMessage:
    """A schedule with the given policy and one due occurrence of it."""
    deadline_s = policy.get("deadline_s")
    schedule_id = await insert_schedule(conn, tenant, target, at, **policy)  # type: ignore[arg-type]
    return await insert_occurrence(conn, schedule_id, tenant, target, at, deadline_s=deadline_s)  # type: ignore[arg-type]


async def occurrence_row(pool: asyncpg.Pool, ident: uuid.UUID) -> asyncpg.Record:
    return await pool.fetchrow("SELECT * FROM occurrences WHERE occurrence_id = $1", ident)


async def attempt_rows(pool: asyncpg.Pool, ident: uuid.UUID) -> list[asyncpg.Record]:
    return await pool.fetch(
        # claim_order breaks a tie of one batch's instant: a takeover's claim is later than the fenced one's.
        "SELECT * FROM attempts WHERE occurrence_id = $1 ORDER BY started_at, attempt_number, claim_order",
        ident,
    )


async def outbox_rows(pool: asyncpg.Pool, ident: uuid.UUID) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM outbox WHERE occurrence_id = $1 ORDER BY id", ident)

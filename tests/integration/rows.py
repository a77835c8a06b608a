"""Direct inserts of schedule/occurrence/outbox rows, so relay and consumer tests
do not depend on the materializer. Test data only: runtime code goes through
the engine's named queries."""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from schemas.identity import occurrence_id
from schemas.messages import OccurrenceMessage
from schemas.topics import occurrence_topic, partition_key


async def insert_schedule(conn: asyncpg.Connection | asyncpg.Pool, tenant: str, target: str,
                          next_run_at: datetime) -> uuid.UUID:
    schedule_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO schedules (schedule_id, tenant_id, kind, expression, target, next_run_at, shard)"
        " VALUES ($1, $2, 'once', $3, $4, $5, 0)",
        schedule_id, tenant, next_run_at.isoformat(), target, next_run_at,
    )
    return schedule_id


async def insert_due_occurrence(conn: asyncpg.Connection | asyncpg.Pool, tenant: str, target: str,
                                scheduled_for: datetime, available_at: datetime | None = None,
                                payload: object = None) -> OccurrenceMessage:
    """A schedule with one SCHEDULED occurrence and its outbox row; returns the message."""
    schedule_id = await insert_schedule(conn, tenant, target, scheduled_for)
    message = OccurrenceMessage(
        occurrence_id=occurrence_id(schedule_id, 1, scheduled_for), schedule_id=schedule_id, schedule_version=1,
        tenant_id=tenant, target=target, scheduled_for=scheduled_for,
        available_at=available_at or scheduled_for, payload=payload if payload is not None else {"n": 1},
    )
    await conn.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at) VALUES ($1, $2, 1, $3, $4, $5, $6)",
        message.occurrence_id, schedule_id, tenant, target, scheduled_for, message.available_at,
    )
    await conn.execute(
        "INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)",
        message.occurrence_id, tenant, occurrence_topic(target), partition_key(tenant), message.encode(),
        scheduled_for, message.available_at,
    )
    return message

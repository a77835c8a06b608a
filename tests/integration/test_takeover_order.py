"""Takeover by claim order, not arrival order (issue 11, "Takeover by arrival order").

Worker A inserts its dedupe row and stalls before reporting ``started``; PostgreSQL ends A's transaction
(its idle limit); worker B, the redelivery, inserts the row again and starts. Only B can still commit.
Before claim orders, A's late ``started`` took B's lease over (arrival order) and B's success was fenced:
the effect B committed was never recorded as the occurrence's success. Now ``started`` carries the
consumer database's transaction id of the dedupe insert, and only a later claim takes a lease over.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from engine.loops.attempt_ledger import Verdict
from engine.loops.attempt_processor import AttemptProcessor
from schemas.attempt_events import AttemptEvent as Ev
from schemas.messages import OccurrenceMessage
from schemas.migrations import apply_migrations
from schemas.queries import CONSUMER_QUERIES
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row

TTL = 30.0


@pytest.fixture
def processor(pool, clock):
    return AttemptProcessor(pool, clock=clock, rng=random.Random(5))


@pytest.fixture
async def app_db(consumer_db: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(consumer_db, min_size=1, max_size=2)
    async with pool.acquire() as conn:
        await apply_migrations(conn, "consumer")
    yield pool
    await pool.close()


async def claim(conn: asyncpg.Connection, message: OccurrenceMessage, token: uuid.UUID) -> int | None:
    """The consumer runtime's dedupe insert (its own query), in the open transaction: the claim order."""
    row = await conn.fetchrow(
        *CONSUMER_QUERIES.insert_dedupe(
            consumer_group="billing",
            occurrence_id=message.occurrence_id,
            schedule_id=message.schedule_id,
            schedule_version=message.schedule_version,
            tenant_id=message.tenant_id,
            scheduled_for=message.scheduled_for,
            attempt=message.attempt,
            lease_token=token,
            slot=True,
        )
    )
    return None if row is None else row["claim_order"]


async def claims_of_a_stalled_worker_and_its_replacement(
    app_db: asyncpg.Pool, url: str, message: OccurrenceMessage, a: uuid.UUID, b: uuid.UUID
) -> tuple[int, int]:
    """A inserts and its transaction is ended (as its idle limit would), B then inserts and commits."""
    conn_a = await asyncpg.connect(url)  # A's own session, as a worker has
    try:
        await conn_a.execute("BEGIN")
        order_a = await claim(conn_a, message, a)
        assert order_a is not None
        await app_db.execute("SELECT pg_terminate_backend($1)", conn_a.get_server_pid())
    finally:
        conn_a.terminate()  # its transaction is gone: the row is free again
    async with app_db.acquire() as conn_b, conn_b.transaction():
        order_b = await claim(conn_b, message, b)
    assert order_b is not None
    return order_a, order_b


async def test_a_later_claim_is_a_greater_order(pool, clock, target, app_db, consumer_db):
    """The premise, on a real consumer database: the replacement's insert is only possible after A's
    transaction ended, and its transaction id is greater."""
    message = await due_occurrence(pool, "acme", target, clock.now())
    order_a, order_b = await claims_of_a_stalled_worker_and_its_replacement(
        app_db, consumer_db, message, uuid.uuid4(), uuid.uuid4()
    )
    assert order_b > order_a


async def test_a_then_b_the_replacement_takes_the_lease_over(pool, clock, target, processor, app_db, consumer_db):
    """The order the takeover was built for: A started and stalled, B's redelivery takes the lease over."""
    message = await due_occurrence(pool, "acme", target, clock.now())
    a, b = uuid.uuid4(), uuid.uuid4()
    order_a, order_b = await claims_of_a_stalled_worker_and_its_replacement(app_db, consumer_db, message, a, b)
    ident = message.occurrence_id
    assert await processor.apply_events([Ev.started(ident, 1, a, TTL, "billing", claim_order=order_a)]) == [
        Verdict.ACCEPTED
    ]
    assert await processor.apply_events(
        [Ev.started(ident, 1, b, TTL, "billing", claim_order=order_b), Ev.succeeded(ident, 1, b)]
    ) == [Verdict.ACCEPTED, Verdict.ACCEPTED]
    assert await processor.apply_events([Ev.failed(ident, 1, a, "LeaseExpired", "stalled")]) == [Verdict.FENCED]
    assert (await occurrence_row(pool, ident))["state"] == "SUCCEEDED"
    assert [(r["lease_token"], r["result"]) for r in await attempt_rows(pool, ident)] == [
        (a, "fenced"),
        (b, "succeeded"),
    ]


async def test_b_then_a_late_start_of_the_stalled_claim_cannot_fence_the_replacement(
    pool, clock, target, processor, app_db, consumer_db
):
    """A's `started` arrives after B's: it must not take the lease (A can no longer commit); B's success
    counts; A's later reports are fenced."""
    message = await due_occurrence(pool, "acme", target, clock.now())
    a, b = uuid.uuid4(), uuid.uuid4()
    order_a, order_b = await claims_of_a_stalled_worker_and_its_replacement(app_db, consumer_db, message, a, b)
    ident = message.occurrence_id
    assert await processor.apply_events(
        [
            Ev.started(ident, 1, b, TTL, "billing", claim_order=order_b),
            Ev.started(ident, 1, a, TTL, "billing", claim_order=order_a),  # A, late
            Ev.succeeded(ident, 1, b),
            Ev.failed(ident, 1, a, "LeaseExpired", "stalled"),
        ]
    ) == [Verdict.ACCEPTED, Verdict.FENCED, Verdict.ACCEPTED, Verdict.FENCED]
    assert (await occurrence_row(pool, ident))["state"] == "SUCCEEDED"
    assert [(r["lease_token"], r["result"], r["claim_order"]) for r in await attempt_rows(pool, ident)] == [
        (b, "succeeded", order_b)
    ]


async def test_b_then_late_a_in_separate_batches(pool, clock, target, processor):
    """The current lease's claim order is read back from the attempts table, not only from the batch."""
    message = await due_occurrence(pool, "acme", target, clock.now())
    a, b, ident = uuid.uuid4(), uuid.uuid4(), message.occurrence_id
    assert await processor.apply_events([Ev.started(ident, 1, b, TTL, "billing", claim_order=20)]) == [Verdict.ACCEPTED]
    assert await processor.apply_events([Ev.started(ident, 1, a, TTL, "billing", claim_order=10)]) == [Verdict.FENCED]
    row = await occurrence_row(pool, ident)
    assert (row["state"], row["lease_token"]) == ("RUNNING", b)


async def test_starts_without_claim_orders_keep_arrival_order(pool, clock, target, processor):
    """An older runtime sends no claim order: the latest start takes over, as before."""
    message = await due_occurrence(pool, "acme", target, clock.now())
    a, b, ident = uuid.uuid4(), uuid.uuid4(), message.occurrence_id
    assert await processor.apply_events(
        [Ev.started(ident, 1, b, TTL, "billing", claim_order=20), Ev.started(ident, 1, a, TTL, "billing")]
    ) == [Verdict.ACCEPTED, Verdict.ACCEPTED]
    assert (await occurrence_row(pool, ident))["lease_token"] == a

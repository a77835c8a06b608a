"""A batch's dedupe rows against a real app database (consumers/batch_runner.py ``_insert_dedupe_rows``).

The rows go in unchecked first (no speculative insert), under a savepoint; an occurrence applied before, by id
or by its slot, or twice in the batch, refuses that statement, and the rows go in again checked. Either way
the batch's transaction goes on, and what it holds is what ``ON CONFLICT DO NOTHING`` alone would leave.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import asyncpg
import pytest

from consumers.batch_runner import _insert_dedupe_rows
from schemas.connections import json_rows
from schemas.migrations import apply_migrations
from schemas.queries import CONSUMER_QUERIES

GROUP = "billing"
AT = datetime(2026, 12, 7, 20, tzinfo=UTC)


class Recorded:
    """A real connection whose dedupe inserts are noted as checked or not (the statement's own argument)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.checked: list[bool] = []

    def transaction(self) -> Any:
        return self.conn.transaction()

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        query = CONSUMER_QUERIES.insert_dedupe_batch
        if sql == query.sql:
            self.checked.append(args[query.params.index("checked")])
        return await self.conn.fetch(sql, *args)


def row(occurrence_id: uuid.UUID, schedule_id: uuid.UUID | None = None) -> dict[str, Any]:
    """A dedupe row of the slot's own occurrence (slot true), scheduled at AT."""
    return {
        "occurrence_id": occurrence_id,
        "schedule_id": schedule_id or uuid.uuid4(),
        "schedule_version": 1,
        "tenant_id": "acme",
        "scheduled_for": AT,
        "attempt": 1,
        "lease_token": uuid.uuid4(),
        "slot": True,
    }


@pytest.fixture
async def conn(consumer_db: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(consumer_db)
    await apply_migrations(conn, "consumer")
    yield conn
    await conn.close()


async def insert(conn: asyncpg.Connection, rows: list[dict[str, Any]]) -> tuple[set[uuid.UUID], list[bool]]:
    """The rows inserted in a transaction that goes on to one more statement and commits."""
    recorded = Recorded(conn)
    async with conn.transaction():
        inserted = await _insert_dedupe_rows(cast(asyncpg.Connection, recorded), GROUP, json_rows(rows))
        assert await conn.fetchval("SELECT 1") == 1  # the transaction is not aborted
    return {r["occurrence_id"] for r in inserted}, recorded.checked


async def stored(conn: asyncpg.Connection) -> dict[uuid.UUID, uuid.UUID]:
    return {r[0]: r[1] for r in await conn.fetch("SELECT occurrence_id, lease_token FROM chronoq_consumer_dedupe")}


async def test_a_batch_of_new_occurrences_goes_in_once_unchecked(conn):
    rows = [row(uuid.uuid4()) for _ in range(3)]
    assert await insert(conn, rows) == ({r["occurrence_id"] for r in rows}, [False])
    assert await stored(conn) == {r["occurrence_id"]: r["lease_token"] for r in rows}


@pytest.mark.parametrize("earlier", ["the same occurrence", "its slot's other occurrence", "a copy in the batch"])
async def test_an_occurrence_applied_before_refuses_the_unchecked_insert_and_is_left_alone(conn, earlier):
    fresh = [row(uuid.uuid4()) for _ in range(2)]
    first = row(uuid.uuid4())
    if earlier == "a copy in the batch":
        batch = [*fresh, first, {**first, "lease_token": uuid.uuid4()}]
        applied_before: dict[uuid.UUID, uuid.UUID] = {}
    else:
        await insert(conn, [first])
        applied_before = await stored(conn)
        again = first if earlier == "the same occurrence" else row(uuid.uuid4(), first["schedule_id"])
        batch = [fresh[0], {**again, "lease_token": uuid.uuid4()}, fresh[1]]
    expected = {r["occurrence_id"] for r in fresh} | ({first["occurrence_id"]} if not applied_before else set())

    assert await insert(conn, batch) == (expected, [False, True])
    after = await stored(conn)
    assert {k: after[k] for k in applied_before} == applied_before  # the earlier application untouched
    assert set(after) == expected | set(applied_before)

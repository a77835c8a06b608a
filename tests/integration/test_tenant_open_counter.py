"""A tenant's open occurrences are a counter kept by statement triggers on ``occurrences`` (migration 0027),
read by the tenant gate instead of counting the open set on every materializer pass.

Each test attacks one way the counter could part from a count of the open rows — a statement that writes
many tenants at once, an update between open states (which must log nothing), a tenant change, a row moved
between day partitions, a statement that inserts and updates occurrences in two of its parts, a delete, a
fold racing writers, a TRUNCATE, writes that bypass triggers, a database migrated with occurrences already
in it — and compares it with the count. The real writers (materializer, relays, attempt processor, reaper,
day moves) are checked where they are tested: test_tenant_gate.py, test_history_partitions.py.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from engine.control.quotas import open_count_drift, usage_of
from engine.loops.tenant_usage_folds import TenantUsageFolds
from schemas.migrations import apply_migrations
from tests.integration.test_target_migration import apply_up_to
from tests.support.databases import create_database, drop_database

DAY = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
TENANTS = ("acme", "globex", "initech")


async def insert_occurrences(conn: asyncpg.Connection | asyncpg.Pool, rows: list[tuple[str, str]]) -> list[uuid.UUID]:
    """One statement inserting one occurrence per (tenant, state), at DAY."""
    ids = [uuid.uuid4() for _ in rows]
    await conn.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, state)"
        " SELECT i, gen_random_uuid(), 1, t, 'open.t', $4, $4, s FROM unnest($1::uuid[], $2::text[], $3::text[])"
        " AS r(i, t, s)",
        ids,
        [t for t, _ in rows],
        [s for _, s in rows],
        DAY,
    )
    return ids


async def open_changes(pool: asyncpg.Pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM tenant_usage_changes WHERE open_occurrences <> 0")


async def test_every_kind_of_occurrence_write_keeps_the_counter(pool):
    states = ("SCHEDULED", "ENQUEUED", "RUNNING", "RETRY_WAIT", "SUCCEEDED", "DEAD", "MISSED", "CANCELED")
    ids = await insert_occurrences(pool, [(t, s) for t in TENANTS for s in states for _ in range(3)])
    assert await open_count_drift(pool) == {}
    assert [await pool.fetchval("SELECT chronoq_open_occurrences($1)", t) for t in TENANTS] == [12, 12, 12]
    assert await open_changes(pool) == 3  # one row per tenant for the whole statement

    # Open to open (a settle, a `started`): nothing logged.
    logged = await open_changes(pool)
    await pool.execute("UPDATE occurrences SET state = 'RUNNING' WHERE state IN ('SCHEDULED', 'ENQUEUED')")
    assert await open_changes(pool) == logged and await open_count_drift(pool) == {}

    # Open to final and final to open (a replay) in one statement, across tenants.
    await pool.execute(
        "UPDATE occurrences SET state = CASE WHEN state = 'RUNNING' THEN 'SUCCEEDED' ELSE 'SCHEDULED' END"
        " WHERE state IN ('RUNNING', 'DEAD')"
    )
    assert await open_count_drift(pool) == {}

    # A tenant change moves open rows between tenants; a new instant moves rows between day partitions.
    await pool.execute(
        "UPDATE occurrences SET tenant_id = 'globex' WHERE tenant_id = 'initech' AND state = 'SCHEDULED'"
    )
    await pool.execute(
        "SELECT chronoq_ensure_day_partitions($1::date, $2::date)", DAY.date(), DAY.date() + timedelta(days=3)
    )
    await pool.execute(
        "UPDATE occurrences SET scheduled_for = scheduled_for + interval '2 days' WHERE tenant_id = 'acme'"
    )
    assert await pool.fetchval("SELECT count(*) FROM occurrences_p20261201 WHERE tenant_id = 'acme'") == 3 * len(states)
    assert await open_count_drift(pool) == {}

    # Two parts of one statement write occurrences: the triggers see both.
    await pool.execute(
        """
        WITH closed AS (
            UPDATE occurrences SET state = 'CANCELED' WHERE tenant_id = 'globex' AND state = 'RETRY_WAIT' RETURNING 1
        ), added AS (
            INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
                                     available_at)
            SELECT gen_random_uuid(), gen_random_uuid(), 1, 'globex', 'open.t', $1, $1 FROM generate_series(1, 5)
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM closed), (SELECT count(*) FROM added)
        """,
        DAY,
    )
    assert await open_count_drift(pool) == {}

    await pool.execute("DELETE FROM occurrences WHERE occurrence_id = ANY ($1::uuid[])", ids[::2])
    assert await open_count_drift(pool) == {}
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM tenant_usage_changes WHERE open_occurrences = 0"
            " AND schedules = 0 AND fires_per_minute = 0"
        )
        == 0
    )  # nothing logged for nothing


async def test_folds_racing_writers_keep_the_sum(pool, acme):
    await pool.execute(
        "INSERT INTO tenants (tenant_id, api_token_hash, signing_key) VALUES ('globex', '\\x01', '\\x01')"
    )
    folds = TenantUsageFolds(pool, interval=1.0, batch=1)

    async def write(tenant: str) -> None:
        for i in range(20):
            ids = await insert_occurrences(pool, [(tenant, "SCHEDULED")] * 5)
            await pool.execute(
                "UPDATE occurrences SET state = 'SUCCEEDED' WHERE occurrence_id = ANY ($1::uuid[])", ids[: i % 5]
            )

    async def fold() -> None:
        for _ in range(30):
            await folds.run_pass()

    await asyncio.gather(write("acme"), write("globex"), fold(), fold())
    assert await open_count_drift(pool) == {}
    while (await folds.run_pass()).counts["changes"]:
        pass
    assert await open_changes(pool) == 0  # all folded, and the counters alone are right
    assert await open_count_drift(pool) == {}
    assert (await usage_of(pool, "acme"))["usage"]["open_occurrences"] == 100 - sum(i % 5 for i in range(20))


async def test_truncate_leaves_no_tenant_anything_open(pool, acme):
    await insert_occurrences(pool, [("acme", "SCHEDULED")] * 4)
    await TenantUsageFolds(pool).run_pass()
    await insert_occurrences(pool, [("acme", "RUNNING")] * 2)
    assert await pool.fetchval("SELECT chronoq_open_occurrences('acme')") == 6
    await pool.execute("TRUNCATE occurrences")
    assert await pool.fetchval("SELECT chronoq_open_occurrences('acme')") == 0
    assert await open_count_drift(pool) == {}


async def test_a_recount_repairs_writes_that_bypassed_the_triggers(pool, acme):
    await insert_occurrences(pool, [("acme", "ENQUEUED")] * 3)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")  # a restore's --disable-triggers
        await insert_occurrences(conn, [("acme", "SCHEDULED")] * 4)
    assert await open_count_drift(pool) == {"acme": (3, 7)}
    report = await usage_of(pool, "acme", recount=True)
    assert report["usage"]["open_occurrences"] == 7 and report["drift"]["open_occurrences"] == 4
    assert await open_count_drift(pool) == {}
    assert (await usage_of(pool, "acme", recount=True))["drift"]["open_occurrences"] == 0


async def test_the_migration_counts_the_occurrences_already_there(servers):
    name = f"chronoq_open_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(await create_database(servers, name))
    try:
        await apply_up_to(conn, 27)
        await insert_occurrences(
            conn, [("acme", "SCHEDULED"), ("acme", "RETRY_WAIT"), ("acme", "SUCCEEDED"), ("globex", "RUNNING")]
        )
        await apply_migrations(conn, "engine")
        assert await open_count_drift(conn) == {}
        assert await conn.fetchval("SELECT open_occurrences FROM tenant_usage WHERE tenant_id = 'acme'") == 2
        assert await conn.fetchval("SELECT to_regclass('occurrences_tenant_open')") is None
    finally:
        await conn.close()
        await drop_database(servers, name)

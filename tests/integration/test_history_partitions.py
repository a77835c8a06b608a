"""Time-partitioned history on real PostgreSQL (migration 0016).

The engine creates the day partitions of occurrences and attempts ahead; rows land in their day; a prune
moves whole days older than the default retention into the archive with DDL, keeping hot exactly what must
stay (not final, DEAD, in a handoff, a tenant whose retention is longer), and the batches take the rest.
The hot queries that name an instant read one day's partition; the migration keeps every existing row.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, timedelta

import asyncpg
import orjson
import pytest

from engine.control.history_retention import prune, set_retention
from engine.control.quotas import open_count_drift
from engine.control.reconciler import Window, reconcile
from engine.loops.history_partitions import HistoryPartitions
from schemas import observability as obs
from schemas.clock import ManualClock
from schemas.migrations import load_migrations
from tests.integration.test_history_retention import START, expected_to_go, ids, simulated_days


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


async def partitions_of(pool, parent: str) -> list[str]:
    rows = await pool.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = $1::regclass ORDER BY c.relname",
        parent,
    )
    return [r[0] for r in rows]


async def test_the_engine_creates_day_partitions_ahead_and_rows_land_in_their_day(pool, clock, telemetry):
    # A row of a future day written before its partition existed (a clock far off) waits in DEFAULT.
    schedule_id = uuid.uuid4()
    await pool.execute(
        "INSERT INTO schedules (schedule_id, tenant_id, kind, expression, target, shard)"
        " VALUES ($1, 'acme', 'cron', '0 * * * *', 'billing', 0)",
        schedule_id,
    )
    early = START + timedelta(days=2, hours=3)
    await pool.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at) VALUES ($1, $2, 1, 'acme', 'billing', $3, $3)",
        uuid.uuid4(),
        schedule_id,
        early,
    )
    assert await pool.fetchval("SELECT count(*) FROM occurrences_default") == 1

    partitions = HistoryPartitions(pool, clock, days_ahead=2, meter=telemetry.instruments("history")["meter"])
    assert await partitions.run_once() == 6  # today, tomorrow, the day after: occurrences and attempts
    assert await partitions.run_once() == 0  # idempotent
    days = ["20261120", "20261121", "20261122"]
    assert await partitions_of(pool, "occurrences") == ["occurrences_default"] + [f"occurrences_p{d}" for d in days]
    assert await partitions_of(pool, "attempts") == ["attempts_default"] + [f"attempts_p{d}" for d in days]
    # The early row moved into its day; DEFAULT is empty again.
    assert await pool.fetchval("SELECT count(*) FROM occurrences_default") == 0
    assert await pool.fetchval("SELECT count(*) FROM occurrences_p20261122") == 1
    assert sum(p.value for p in telemetry.points(obs.HISTORY_PARTITIONS_CREATED)) == 6

    clock.advance(timedelta(days=1))
    assert await partitions.run_once() == 2  # one new day
    # Anything outside the partitions still has a home: a row is never refused.
    await pool.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at) VALUES ($1, $2, 1, 'acme', 'billing', $3, $3)",
        uuid.uuid4(),
        schedule_id,
        START - timedelta(days=300),
    )
    assert await pool.fetchval("SELECT count(*) FROM occurrences_default") == 1


async def test_a_prune_moves_whole_days_and_keeps_hot_exactly_what_must_stay(pool, clock, target, telemetry):
    partitions = HistoryPartitions(pool, clock)
    await partitions.run_once()
    created = await simulated_days(pool, clock, target, before_each_step=partitions.run_once)
    # Default 2 days; acme keeps 3 (longer: its rows of a moved day stay hot), globex 1 (shorter: batches).
    await set_retention(pool, timedelta(days=2))
    await set_retention(pool, timedelta(days=3), tenant_id="acme")
    await set_retention(pool, timedelta(days=1), tenant_id="globex")
    now = clock.now()
    cutoffs = {"acme": now - timedelta(days=3), "globex": now - timedelta(days=1)}
    going = await expected_to_go(pool, cutoffs)
    all_before = set(await ids(pool, "occurrences"))
    attempts_before = {r[0]: r[1] for r in await pool.fetch("SELECT attempt_id, occurrence_id FROM attempts")}
    attempts_going = {a for a, o in attempts_before.items() if o in going}
    assert await pool.fetchval("SELECT count(*) FROM occurrences_default") == 0  # every row is in its day
    before = await reconcile(pool, Window(START, now), clock=clock, record=False)

    # Days 11-20 and 11-21 end at or before now - 2 days; 11-22 and later do not.
    dry = await prune(pool, clock=clock, dry_run=True)
    assert [d.day for d in dry.days] == [date(2026, 11, 20), date(2026, 11, 21)]
    assert dry.occurrences == len(going) and dry.attempts == len(attempts_going)
    kept_20 = dry.days[0].kept
    assert {"DEAD": 1, "ENQUEUED": 1, "RETRY_WAIT": 1, "RUNNING": 1, "SUCCEEDED": 1}.items() <= kept_20.items()
    assert set(await ids(pool, "occurrences")) == all_before and await ids(pool, "archive.occurrences") == []

    report = await prune(pool, clock=clock, batch_size=50, **telemetry.instruments("history"))
    assert [d.day for d in report.days] == [date(2026, 11, 20), date(2026, 11, 21)]
    assert report.occurrences == len(going) and report.complete
    hot, archived = set(await ids(pool, "occurrences")), await ids(pool, "archive.occurrences")
    assert set(archived) == going and len(archived) == len(going)
    assert hot == all_before - going
    hot_attempts = {r[0] for r in await pool.fetch("SELECT attempt_id FROM attempts")}
    archived_attempts = {r[0] for r in await pool.fetch("SELECT attempt_id FROM archive.attempts")}
    assert archived_attempts == attempts_going and hot_attempts == set(attempts_before) - attempts_going
    # The days are archive partitions now, with the archive's indexes only; the hot days are the rest.
    assert await partitions_of(pool, "archive.occurrences") == [
        "occurrences_default",
        "occurrences_p20261120",
        "occurrences_p20261121",
    ]
    assert "occurrences_p20261120" not in await partitions_of(pool, "occurrences")
    indexes = {
        r[0] for r in await pool.fetch("SELECT indexdef FROM pg_indexes WHERE tablename = 'occurrences_p20261120'")
    }
    assert len(indexes) == 3 and not any(" WHERE " in d for d in indexes)
    # What stayed hot of a moved day sits in the DEFAULT partition, attempts with their occurrence.
    kept_default = await pool.fetch("SELECT occurrence_id, tenant_id, state FROM occurrences_default")
    assert {r["state"] for r in kept_default if r["tenant_id"] == "globex"} <= {"SCHEDULED"}
    assert {"RUNNING", "RETRY_WAIT", "ENQUEUED", "DEAD"} <= {r["state"] for r in kept_default}
    assert any(r["tenant_id"] == "acme" and r["state"] == "SUCCEEDED" for r in kept_default)  # acme keeps 3 days
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM attempts_default a WHERE NOT EXISTS"
            " (SELECT 1 FROM occurrences_default o WHERE o.occurrence_id = a.occurrence_id)"
        )
        == 0
    )
    # No attempt lost its occurrence, hot or archived (the foreign keys are gone; the moves keep this).
    orphans = await pool.fetchval(
        "SELECT count(*) FROM (SELECT occurrence_id FROM attempts UNION ALL SELECT occurrence_id FROM archive.attempts)"
        " a WHERE NOT EXISTS (SELECT 1 FROM occurrences o WHERE o.occurrence_id = a.occurrence_id)"
        " AND NOT EXISTS (SELECT 1 FROM archive.occurrences o WHERE o.occurrence_id = a.occurrence_id)"
    )
    assert orphans == 0
    assert await open_count_drift(pool) == {}  # the open rows kept hot are counted once (migration 0027)
    days_points = telemetry.points(obs.HISTORY_DAYS_ARCHIVED)
    assert sum(p.value for p in days_points) == 2

    # Again: nothing left; the next day moves when it is old enough; partitions never come back.
    again = await prune(pool, clock=clock)
    assert again.occurrences == 0 and again.days == []
    clock.advance(timedelta(days=1))
    await partitions.run_once()
    assert "occurrences_p20261120" not in await partitions_of(pool, "occurrences")

    # The reconciler still sees the whole window and says that part of it is archived.
    after = await reconcile(pool, Window(START, now), clock=clock, record=False)
    for name in ("expected", "present", "missing", "unexpected", "duplicate_slots", "pending"):
        assert after.counts[name] == before.counts[name], name
    assert after.counts["archived"] == len(going)
    assert after.archived_before is not None and after.archived_before >= datetime(2026, 11, 22, tzinfo=UTC)
    acme_only = await reconcile(pool, Window(START, now), tenant_id="acme", clock=clock, record=False)
    assert acme_only.archived_before == datetime(2026, 11, 22, tzinfo=UTC)
    shown = await pool.fetchval(
        "SELECT count(*) FROM archive.occurrences WHERE schedule_id = $1", uuid.UUID(created["acme"][0])
    )
    assert shown > 0


async def test_hot_queries_that_name_an_instant_read_one_day(pool, clock):
    partitions = HistoryPartitions(pool, clock, days_ahead=9)
    await partitions.run_once()
    occurrence_id = uuid.uuid4()
    at = START + timedelta(days=4, hours=5)
    plan = await explain(
        pool, "SELECT * FROM occurrences WHERE occurrence_id = $1 AND scheduled_for = $2", occurrence_id, at
    )
    scanned = _relations(plan)
    assert scanned == {"occurrences_p20261124"}
    window = await explain(
        pool,
        "SELECT count(*) FROM occurrences WHERE scheduled_for >= $1 AND scheduled_for < $2",
        at,
        at + timedelta(hours=1),
    )
    assert _relations(window) == {"occurrences_p20261124"}


async def explain(pool, sql: str, *args: object) -> object:
    plan = await pool.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    return orjson.loads(plan) if isinstance(plan, str | bytes) else plan


def _relations(plan: object) -> set[str]:
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "Relation Name" in node:
                found.add(node["Relation Name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    return found


async def test_the_migration_keeps_every_row_of_an_unpartitioned_database(consumer_db):
    """Build the schema as of migration 0015, write rows, apply 0016: every row is there, in DEFAULT."""
    migrations = load_migrations("engine")
    conn = await asyncpg.connect(consumer_db)
    try:
        for migration in migrations[:15]:
            await conn.execute(migration.sql)
        schedule_id = uuid.uuid4()
        await conn.execute(
            "INSERT INTO schedules (schedule_id, tenant_id, kind, expression, target, shard)"
            " VALUES ($1, 'acme', 'cron', '0 * * * *', 'billing', 0)",
            schedule_id,
        )
        occurrence_ids = [uuid.uuid4() for _ in range(5)]
        for n, occurrence_id in enumerate(occurrence_ids):
            at = START + timedelta(days=n)
            await conn.execute(
                "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target,"
                " scheduled_for, available_at, state) VALUES ($1, $2, 1, 'acme', 'billing', $3, $3, 'SUCCEEDED')",
                occurrence_id,
                schedule_id,
                at,
            )
            await conn.execute(
                "INSERT INTO attempts (attempt_id, occurrence_id, attempt_number, lease_token, started_at)"
                " VALUES ($1, $2, 1, $3, $4)",
                uuid.uuid4(),
                occurrence_id,
                uuid.uuid4(),
                at + timedelta(seconds=1),
            )
        await conn.execute(
            "INSERT INTO archive.occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target,"
            " scheduled_for, available_at, state) VALUES ($1, $2, 1, 'acme', 'billing', $3, $3, 'SUCCEEDED')",
            uuid.uuid4(),
            schedule_id,
            START - timedelta(days=40),
        )
        await conn.execute(migrations[15].sql)
        rows = await conn.fetch(
            "SELECT o.occurrence_id, a.scheduled_for AS attempt_day, o.scheduled_for,"
            " o.tableoid::regclass::text AS part"
            " FROM occurrences o JOIN attempts a USING (occurrence_id) ORDER BY o.scheduled_for"
        )
        assert [r["occurrence_id"] for r in rows] == occurrence_ids
        assert all(r["attempt_day"] == r["scheduled_for"] and r["part"] == "occurrences_default" for r in rows)
        assert await conn.fetchval("SELECT count(*) FROM archive.occurrences") == 1
        assert await conn.fetchval("SELECT count(*) FROM pg_class WHERE relname LIKE '%unpartitioned'") == 0
    finally:
        await conn.close()


async def test_a_day_move_killed_midway_leaves_the_day_where_it_was(pool, clock, target):
    """The backend moving a day is terminated while it waits in the middle of chronoq_archive_day (after the
    detach and the kept rows' move, before the attach): everything is back as before; the next prune moves it."""
    partitions = HistoryPartitions(pool, clock)
    await partitions.run_once()
    await simulated_days(pool, clock, target, before_each_step=partitions.run_once)
    await set_retention(pool, timedelta(days=2))
    snapshot = "SELECT occurrence_id, state, tableoid::regclass::text FROM occurrences ORDER BY occurrence_id"
    before = await pool.fetch(snapshot)
    attempts_before = await pool.fetchval("SELECT count(*) FROM attempts")

    blocker = await pool.acquire()
    mover = await pool.acquire()
    try:
        blocking = blocker.transaction()
        await blocking.start()
        # The move reaches the archive's DEFAULT partition after detaching and re-inserting: it waits here.
        await blocker.execute("LOCK TABLE archive.occurrences_default IN ACCESS EXCLUSIVE MODE")
        pid = await mover.fetchval("SELECT pg_backend_pid()")
        moving = asyncio.ensure_future(
            mover.fetch("SELECT * FROM chronoq_archive_day('2026-11-20', 172800, $1)", clock.now())
        )
        for _ in range(200):
            waiting = await pool.fetchval("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid)
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting, "the move never reached the archive's DEFAULT partition"
        await pool.execute("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError)):
            await moving
        await blocking.rollback()
    finally:
        await pool.release(blocker)
        await pool.release(mover)

    assert await pool.fetch(snapshot) == before
    assert await pool.fetchval("SELECT count(*) FROM attempts") == attempts_before
    assert "occurrences_p20261120" in await partitions_of(pool, "occurrences")
    assert await pool.fetchval("SELECT count(*) FROM archive.occurrences") == 0
    report = await prune(pool, clock=clock)
    assert [d.day for d in report.days] == [date(2026, 11, 20), date(2026, 11, 21)]
    assert "occurrences_p20261120" in await partitions_of(pool, "archive.occurrences")

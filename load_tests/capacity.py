"""Capacity model, measured: bytes per schedule, occurrence and attempt, WAL per occurrence, the hot queries'
plans and times as history grows, and what a retention run does.

    python -m load_tests.capacity [--schedules 200000] [--per-day 400000] [--days 8] [--keep-days 2]
                                  [--measure-at 1,8] [--json PATH] [--keep]

Fills a database (the embedded PostgreSQL, or CHRONOQ_DATABASE_URL) in bulk, server-side (INSERT ...
SELECT generate_series: test data, not the API): N schedules with their first version across 20
tenants, then one simulated day at a time ``--per-day`` occurrences spread over the day (97 % SUCCEEDED,
1 % each MISSED, CANCELED, DEAD), each with its delivered outbox row (a real encoded occurrence message)
and its attempts (one; every 20th two; DEAD three). The newest hour is still in flight (SCHEDULED with
an unsent outbox row, ENQUEUED, RUNNING with a lease, some expired). After the days in ``--measure-at``
it VACUUM ANALYZEs and records every table's and index's size, and EXPLAIN (ANALYZE, BUFFERS) of the hot
queries, run as the engine runs them (its named queries, in a rolled-back transaction). It then measures
the WAL of a whole lifecycle (materialize, publish, start, succeed) on a sample of fresh occurrences, and
finally runs a retention prune (``--keep-days``) and records its rate, its WAL, sizes, dead tuples and
the hot queries again. docs/capacity.md reads these figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from engine.cli.embedded.postgres import EmbeddedPostgres
from engine.control.history_retention import prune, set_retention
from schemas.clock import ManualClock
from schemas.connections import create_pool
from schemas.messages import OccurrenceMessage
from schemas.migrations import apply_migrations
from schemas.queries import QUERIES

TENANTS = 20
SHARDS = 256
TABLES = ("schedules", "schedule_versions", "occurrences", "attempts", "outbox")


def sample_message() -> bytes:
    """A real encoded occurrence message (the outbox row's body), with a small payload."""
    return OccurrenceMessage(
        occurrence_id=uuid.uuid4(),
        schedule_id=uuid.uuid4(),
        schedule_version=1,
        tenant_id="bench-7",
        target="bench.target-3",
        scheduled_for=datetime(2026, 12, 1, tzinfo=UTC),
        available_at=datetime(2026, 12, 1, tzinfo=UTC),
        payload={"report": "daily", "customer": 12345},
    ).encode()


async def wal_lsn(conn: asyncpg.Connection | asyncpg.Pool) -> int:
    """The current WAL position, in bytes."""
    return int(await conn.fetchval("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint"))


async def wal_since(conn: asyncpg.Connection | asyncpg.Pool, lsn: int) -> int:
    return await wal_lsn(conn) - lsn


async def seed_schedules(pool: asyncpg.Pool, schedules: int, origin: datetime) -> dict[str, float]:
    began, lsn = time.perf_counter(), await wal_lsn(pool)
    await pool.execute(
        "INSERT INTO tenants (tenant_id, api_token_hash, signing_key)"
        " SELECT 'bench-' || t, sha256(('bench-' || t)::bytea), sha256(('key-' || t)::bytea)"
        " FROM generate_series(0, $1::int - 1) t ON CONFLICT DO NOTHING",
        TENANTS,
    )
    # Hourly cron schedules, cursors in the future (the materializer's due query finds a horizon's worth).
    await pool.execute(
        """
        INSERT INTO schedules (schedule_id, tenant_id, kind, expression, next_run_at, target, shard, payload,
                               created_at, updated_at, fires_per_minute)
        SELECT md5('schedule-' || i)::uuid, 'bench-' || (i % $3::int), 'cron', (i % 60) || ' * * * *',
               $2::timestamptz + make_interval(secs => (i % 3600)::int), 'bench.target-' || (i % 8), i % $4::int,
               '{"report": "daily", "customer": 12345}', $2::timestamptz, $2::timestamptz, 1.0 / 60
        FROM generate_series(1::bigint, $1::bigint) i""",
        schedules,
        origin,
        TENANTS,
        SHARDS,
    )
    await pool.execute(
        """
        INSERT INTO schedule_versions (schedule_id, version, tenant_id, change, state, definition, next_run_at,
                                       changed_at)
        SELECT schedule_id, 1, tenant_id, 'create', 'active',
               jsonb_build_object('kind', kind, 'expression', expression, 'time_zone', time_zone,
                                  'target', target, 'payload', payload),
               next_run_at, created_at
        FROM schedules"""
    )
    return {"seconds": time.perf_counter() - began, "wal_bytes": await wal_since(pool, lsn)}


async def fill_day(
    pool: asyncpg.Pool, day: datetime, per_day: int, schedules: int, message: bytes, in_flight_from: datetime | None
) -> dict[str, float]:
    """One simulated day: occurrences, their outbox rows and attempts. Occurrences at or after
    ``in_flight_from`` (the newest hour of the last day) are not finished yet."""
    began, lsn = time.perf_counter(), await wal_lsn(pool)
    step_us = 86_400_000_000 // per_day
    async with pool.acquire() as conn:
        await conn.execute("SET work_mem = '256MB'")
        await conn.execute(
            """
            INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
                                     available_at, state, attempt_count, enqueued_at, created_at, updated_at,
                                     dispatched_at, finished_at, lease_token, lease_expires_at, dead_reason)
            SELECT md5($1::text || i)::uuid, md5('schedule-' || (1 + i % $3::bigint))::uuid, 1,
                   'bench-' || ((1 + i % $3::bigint) % $6::int), 'bench.target-' || ((1 + i % $3::bigint) % 8),
                   at, at, st, CASE WHEN st IN ('SCHEDULED', 'MISSED', 'CANCELED') THEN 0 ELSE 1 END,
                   CASE WHEN st NOT IN ('SCHEDULED', 'MISSED', 'CANCELED') THEN at + interval '50 ms' END,
                   at - interval '30 s',
                   CASE WHEN st = 'SCHEDULED' THEN at - interval '30 s' ELSE at + interval '2 s' END,
                   CASE WHEN st NOT IN ('SCHEDULED', 'MISSED', 'CANCELED') THEN at + interval '50 ms' END,
                   CASE WHEN st IN ('SUCCEEDED', 'DEAD', 'MISSED', 'CANCELED') THEN at + interval '2 s' END,
                   CASE WHEN st = 'RUNNING' THEN md5('lease' || $1::text || i)::uuid END,
                   CASE WHEN st = 'RUNNING' THEN at + CASE WHEN i % 50 = 0 THEN interval '-1 minute'
                                                           ELSE interval '1 hour' END END,
                   CASE WHEN st = 'DEAD' THEN 'max_attempts' END
            FROM (SELECT i, $2::timestamptz + make_interval(secs => (i * $4::bigint) / 1e6) AS at
                  FROM generate_series(0::bigint, $5::bigint - 1) i) g
            CROSS JOIN LATERAL (SELECT CASE
                WHEN $7::timestamptz IS NOT NULL AND g.at >= $7::timestamptz THEN
                    (ARRAY['SCHEDULED', 'ENQUEUED', 'RUNNING', 'SUCCEEDED'])[1 + i % 4]
                WHEN i % 100 = 1 THEN 'MISSED' WHEN i % 100 = 2 THEN 'CANCELED' WHEN i % 100 = 3 THEN 'DEAD'
                ELSE 'SUCCEEDED' END AS st) s""",
            day.isoformat(),
            day,
            schedules,
            step_us,
            per_day,
            TENANTS,
            in_flight_from,
        )
        occurrences_s = time.perf_counter() - began
        await conn.execute(
            """
            INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at,
                                sent_at, publish_attempts, created_at)
            SELECT occurrence_id, tenant_id, 'chronoq.occurrences.' || target, convert_to(schedule_id::text, 'UTF8'),
                   $3::bytea, scheduled_for, available_at,
                   CASE WHEN state <> 'SCHEDULED' THEN scheduled_for + interval '50 ms' END, 1, created_at
            FROM occurrences
            WHERE scheduled_for >= $1 AND scheduled_for < $2 AND state NOT IN ('MISSED', 'CANCELED')""",
            day,
            day + timedelta(days=1),
            message,
        )
        await conn.execute(
            """
            INSERT INTO attempts (attempt_id, occurrence_id, attempt_number, lease_token, consumer_group, started_at,
                                  heartbeat_at, lease_expires_at, finished_at, result, error_class, error_message,
                                  worker, permanent, scheduled_for)
            SELECT md5('attempt' || o.occurrence_id::text || n)::uuid, o.occurrence_id, n,
                   coalesce(CASE WHEN o.state = 'RUNNING' AND n = a.k THEN o.lease_token END,
                            md5('lease' || o.occurrence_id::text || n)::uuid),
                   'bench-app', o.scheduled_for + make_interval(secs => n), o.scheduled_for + make_interval(secs => n),
                   o.scheduled_for + make_interval(secs => n + 60),
                   CASE WHEN o.state <> 'RUNNING' THEN o.scheduled_for + make_interval(secs => n + 1) END,
                   CASE WHEN o.state = 'RUNNING' THEN NULL
                        WHEN n < k OR o.state = 'DEAD' THEN 'failed' ELSE 'succeeded' END,
                   CASE WHEN n < k OR o.state = 'DEAD' THEN 'TimeoutError' END,
                   CASE WHEN n < k OR o.state = 'DEAD' THEN 'upstream timed out after 30 s' END,
                   'worker-' || (hashtext(o.occurrence_id::text) & 63), false, o.scheduled_for
            FROM occurrences o
            CROSS JOIN LATERAL (SELECT CASE WHEN o.state = 'DEAD' THEN 3
                                            WHEN hashtext(o.occurrence_id::text) % 20 = 0 THEN 2 ELSE 1 END AS k) a
            CROSS JOIN LATERAL generate_series(1, a.k) n
            WHERE o.scheduled_for >= $1 AND o.scheduled_for < $2 AND o.state IN ('SUCCEEDED', 'DEAD', 'RUNNING')""",
            day,
            day + timedelta(days=1),
        )
    return {
        "seconds": time.perf_counter() - began,
        "occurrences_s": occurrences_s,
        "wal_bytes": await wal_since(pool, lsn),
    }


async def sizes(pool: asyncpg.Pool) -> dict[str, Any]:
    """Per table: rows, heap+TOAST bytes, each index's bytes, total; and bytes per row."""
    out: dict[str, Any] = {}
    for schema, table in [("public", t) for t in TABLES] + [("archive", "occurrences"), ("archive", "attempts")]:
        name = f"{schema}.{table}"
        rows = await pool.fetchval(f"SELECT count(*) FROM {name}")  # fixed names of this module
        # A partitioned table (migration 0016) has no storage of its own: sum its partitions, and each
        # partitioned index over its partitions' indexes.
        heap = await pool.fetchval(
            "SELECT CASE WHEN c.relkind = 'p'"
            " THEN (SELECT coalesce(sum(pg_table_size(t.relid)), 0) FROM pg_partition_tree(c.oid) t)"
            " ELSE pg_table_size(c.oid) END FROM pg_class c WHERE c.oid = $1::regclass",
            name,
        )
        indexes = {
            r["name"]: r["bytes"]
            for r in await pool.fetch(
                "SELECT i.indexrelid::regclass::text AS name, CASE WHEN c.relkind = 'I'"
                " THEN (SELECT coalesce(sum(pg_relation_size(t.relid)), 0) FROM pg_partition_tree(c.oid) t)"
                " ELSE pg_relation_size(c.oid) END AS bytes"
                " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass ORDER BY 1",
                name,
            )
        }
        total = heap + sum(indexes.values())
        out[name] = {
            "rows": rows,
            "heap_bytes": heap,
            "index_bytes": sum(indexes.values()),
            "indexes": indexes,
            "total_bytes": total,
            "bytes_per_row": round(total / rows, 1) if rows else None,
            "heap_bytes_per_row": round(heap / rows, 1) if rows else None,
        }
    out["database_bytes"] = await pool.fetchval("SELECT pg_database_size(current_database())")
    return out


async def explain(conn: asyncpg.Connection, query: tuple[Any, ...]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one named query as the engine runs it, rolled back (claims write)."""
    sql, *arguments = query
    tr = conn.transaction()
    await tr.start()
    try:
        if "rc_occ" in sql:  # the reconciler's copy of the window: a temporary table of its transaction
            await conn.execute(*QUERIES.create_run_occurrences())
        plan = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, VERBOSE, FORMAT JSON) {sql}", *arguments)
    finally:
        await tr.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]  # the pool may decode json itself
    nodes: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        label = node["Node Type"]
        if "Index Name" in node:
            label += f" {node['Index Name']}"
        if "Relation Name" in node:
            label += f" {node.get('Schema', 'public')}.{node['Relation Name']}"
        nodes.append(label)
        for child in node.get("Plans", []):
            walk(child)

    walk(top["Plan"])
    shared = top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0)
    return {
        "ms": round(top["Execution Time"], 3),
        "planning_ms": round(top["Planning Time"], 3),
        "rows": top["Plan"]["Actual Rows"],
        "buffers": shared,
        "plan": nodes,
    }


async def hot_queries(pool: asyncpg.Pool, now: datetime, repeat: int = 3) -> dict[str, Any]:
    """The hot queries at ``now``: the best of ``repeat`` runs each (warm cache, as in steady state)."""
    async with pool.acquire() as conn:
        recent = await conn.fetchrow(
            "SELECT occurrence_id, schedule_id, tenant_id, scheduled_for FROM occurrences WHERE scheduled_for < $1"
            " ORDER BY scheduled_for DESC LIMIT 1",
            now - timedelta(minutes=10),
        )
        queries: dict[str, tuple[Any, ...]] = {
            "materializer_due": QUERIES.due_schedules_of_shards(
                shards=list(range(SHARDS)), now=now, horizon_s=30.0, per_shard=20
            ),
            "dispatch_claim_outbox": QUERIES.claim_due_outbox(now=now, limit=500, token=uuid.uuid4(), claim_ttl_s=60.0),
            "reaper_expired_leases": QUERIES.expired_leases(now=now, limit=500),
            "stuck_claim": QUERIES.claim_stuck_occurrences(now=now, timeout_s=600.0, limit=500),
            # By id alone (a failure's retry decision; events without scheduled_for): a probe of every day's key.
            "attempt_lock_occurrence": QUERIES.lock_occurrence(
                default_retry_budget=1000, occurrence_id=recent["occurrence_id"]
            ),
            # The attempt processor's batch lock with the events' scheduled_for: that day's partition only.
            "attempt_lock_occurrences_of_days": QUERIES.lock_occurrences_of_days(
                occurrence_ids=[recent["occurrence_id"]], days=[recent["scheduled_for"]]
            ),
            # The processor's read of the leases its answers to `started` report: that day's partition only.
            "attempt_answer_leases_of_days": QUERIES.occurrence_leases_of_days(
                occurrence_ids=[recent["occurrence_id"]], days=[recent["scheduled_for"]]
            ),
            # A failure's and a reaper's writes of the locked occurrence and its attempt: its partition only.
            "outcome_wait_for_retry": QUERIES.wait_for_retry(
                occurrence_id=recent["occurrence_id"],
                scheduled_for=recent["scheduled_for"],
                error_class="E",
                error_message="",
                now=now,
            ),
            "outcome_finish_occurrence": QUERIES.finish_occurrence(
                occurrence_id=recent["occurrence_id"],
                scheduled_for=recent["scheduled_for"],
                state="DEAD",
                error_class=None,
                error_message=None,
                dead_reason="max_attempts",
                now=now,
            ),
            "outcome_finish_attempt": QUERIES.finish_attempt(
                lease_token=uuid.uuid4(),
                scheduled_for=recent["scheduled_for"],
                result="timed_out",
                error_class=None,
                error_message=None,
                permanent=None,
                now=now,
            ),
            "listing_schedule_occurrences": QUERIES.list_schedule_occurrences(
                schedule_id=recent["schedule_id"], tenant_id=recent["tenant_id"], after_at=None, after_id=None, limit=51
            ),
            "get_occurrence": QUERIES.get_occurrence(
                occurrence_id=recent["occurrence_id"], tenant_id=recent["tenant_id"]
            ),
            "dead_letters_page": QUERIES.list_dead_letters(
                tenant_id=recent["tenant_id"], after_at=None, after_id=None, limit=101
            ),
            "reconciler_collect_last_hour": QUERIES.collect_occurrences(
                window_from=now - timedelta(hours=1), window_to=now, tenant_id=None
            ),
        }
        out: dict[str, Any] = {}
        for name, query in queries.items():
            runs = [await explain(conn, query) for _ in range(repeat)]
            out[name] = min(runs, key=lambda r: r["ms"])
    return out


async def lifecycle_wal(pool: asyncpg.Pool, at: datetime, count: int, message: bytes, schedules: int) -> dict[str, Any]:
    """WAL of a whole lifecycle of ``count`` fresh occurrences, one step at a time as the engine takes it
    (materialize with the outbox row; published; attempt started; succeeded), in batches of 500 rows."""
    steps = {
        "materialize": (
            "WITH o AS (INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target,"
            " scheduled_for, available_at) SELECT md5('life' || i)::uuid, md5('schedule-' || (1 + i % $5::int))::uuid,"
            " 1, 'bench-' || ((1 + i % $5::int) % 20), 'bench.target-' || ((1 + i % $5::int) % 8),"
            " $1::timestamptz + make_interval(secs => i), $1::timestamptz + make_interval(secs => i)"
            " FROM generate_series($2::int, $3::int) i RETURNING *)"
            " INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at)"
            " SELECT occurrence_id, tenant_id, 'chronoq.occurrences.' || target,"
            " convert_to(schedule_id::text, 'UTF8'), $4::bytea, scheduled_for, available_at FROM o"
        ),
        "published": (
            "WITH b AS (UPDATE outbox SET sent_at = $1::timestamptz, publish_attempts = 1"
            " WHERE occurrence_id IN (SELECT md5('life' || i)::uuid FROM generate_series($2::int, $3::int) i)"
            " RETURNING occurrence_id)"
            " UPDATE occurrences o SET state = 'ENQUEUED', enqueued_at = $1::timestamptz, updated_at = $1::timestamptz"
            " FROM b WHERE o.occurrence_id = b.occurrence_id AND $4::bytea IS NOT NULL AND $5::int > 0"
        ),
        "started": (
            "WITH a AS (INSERT INTO attempts (attempt_id, occurrence_id, attempt_number, lease_token, started_at,"
            " lease_expires_at, consumer_group, worker, scheduled_for) SELECT md5('life-a' || i)::uuid,"
            " md5('life' || i)::uuid, 1, md5('life-l' || i)::uuid, $1::timestamptz,"
            " $1::timestamptz + interval '1 minute', 'bench-app', 'worker-1',"
            " $1::timestamptz + make_interval(secs => i)"
            " FROM generate_series($2::int, $3::int) i RETURNING occurrence_id, lease_token)"
            " UPDATE occurrences o SET state = 'RUNNING', attempt_count = 1, lease_token = a.lease_token,"
            " lease_expires_at = $1::timestamptz + interval '1 minute', updated_at = $1::timestamptz"
            " FROM a WHERE o.occurrence_id = a.occurrence_id AND $4::bytea IS NOT NULL AND $5::int > 0"
        ),
        "succeeded": (
            "WITH a AS (UPDATE attempts SET finished_at = $1::timestamptz, result = 'succeeded'"
            " WHERE attempt_id IN (SELECT md5('life-a' || i)::uuid FROM generate_series($2::int, $3::int) i)"
            " RETURNING occurrence_id)"
            " UPDATE occurrences o SET state = 'SUCCEEDED', finished_at = $1::timestamptz, lease_token = NULL,"
            " lease_expires_at = NULL, updated_at = $1::timestamptz"
            " FROM a WHERE o.occurrence_id = a.occurrence_id AND $4::bytea IS NOT NULL AND $5::int > 0"
        ),
    }
    out: dict[str, Any] = {}
    async with pool.acquire() as conn:
        await conn.execute("CHECKPOINT")  # full-page images after a checkpoint are part of the steady state
        for step, sql in steps.items():
            lsn = await wal_lsn(conn)
            for first in range(0, count, 500):
                await conn.execute(sql, at, first, min(first + 500, count) - 1, message, schedules)
            out[f"{step}_bytes_per_occurrence"] = round(await wal_since(conn, lsn) / count, 1)
    out["total_bytes_per_occurrence"] = round(sum(v for v in out.values()), 1)
    # The sample leaves no trace in the figures after it (test data of this benchmark).
    async with pool.acquire() as conn, conn.transaction():
        sample = "(SELECT md5('life' || i)::uuid FROM generate_series(0, $1::int - 1) i)"
        for table in ("attempts", "outbox", "occurrences"):
            await conn.execute(f"DELETE FROM {table} WHERE occurrence_id IN {sample}", count)
    return out


async def lifecycle_wal_records_only(
    pool: asyncpg.Pool, at: datetime, count: int, message: bytes, schedules: int
) -> dict[str, Any]:
    """The same lifecycle with full_page_writes off: the WAL records alone, without the full-page images
    that the first change of each page after a checkpoint adds (their share depends on the checkpoint
    interval and on how often the same pages are touched within it). Changes the server's configuration:
    only on a server this benchmark owns."""
    await pool.execute("ALTER SYSTEM SET full_page_writes = off")
    await pool.execute("SELECT pg_reload_conf()")
    try:
        await asyncio.sleep(1)  # the reload reaches the backends at their next command
        return await lifecycle_wal(pool, at, count, message, schedules)
    finally:
        await pool.execute("ALTER SYSTEM RESET full_page_writes")
        await pool.execute("SELECT pg_reload_conf()")


async def autovacuum_state(pool: asyncpg.Pool) -> dict[str, Any]:
    rows = await pool.fetch(
        "SELECT schemaname || '.' || relname AS name, n_live_tup, n_dead_tup, autovacuum_count,"
        " last_autovacuum::text FROM pg_stat_user_tables"
        " WHERE relname ~ '^(occurrences|attempts|outbox)(_p[0-9]{8}|_default)?$' ORDER BY 1",
    )
    return {r["name"]: {k: r[k] for k in r.keys() if k != "name"} for r in rows}


async def run_capacity(
    database_url: str,
    *,
    schedules: int,
    per_day: int,
    days: int,
    keep_days: int,
    measure_at: tuple[int, ...],
    lifecycle_sample: int = 20_000,
    own_server: bool = False,
    log: Any = print,
) -> dict[str, Any]:
    """Fill, measure, prune, measure; return every figure (see the module docstring)."""
    # synchronous_commit off: the bulk seed does not wait for fsync (the WAL written is the same).
    pool = await create_pool(database_url, min_size=1, max_size=4, server_settings={"synchronous_commit": "off"})
    try:
        async with pool.acquire() as conn:
            await apply_migrations(conn, "engine")
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        now = today  # the simulated "now": the end of the last filled day
        message = sample_message()
        result: dict[str, Any] = {
            "parameters": {
                "schedules": schedules,
                "occurrences_per_day": per_day,
                "days": days,
                "keep_days": keep_days,
                "message_bytes": len(message),
            },
            "fill": {},
            "measured": {},
        }
        # The day partitions of every simulated day (the engine creates them ahead; history_partitions.py).
        await pool.fetchval(
            *QUERIES.ensure_day_partitions(
                from_day=(now - timedelta(days=days)).date(), to_day=(now + timedelta(days=2)).date()
            )
        )
        result["fill"]["schedules"] = await seed_schedules(pool, schedules, now)
        log(f"seeded {schedules:,} schedules in {result['fill']['schedules']['seconds']:.1f} s")
        # The newest day first (its last hour still in flight), then older and older days: "now" stays at the end
        # of the newest day while history grows behind it, so 1x and Nx measure the same hot work.
        for k in range(days):
            day = now - timedelta(days=k + 1)
            filled = await fill_day(
                pool, day, per_day, schedules, message, now - timedelta(hours=1) if k == 0 else None
            )
            result["fill"][f"day_{k + 1}"] = filled
            log(
                f"day {k + 1} ({day.date()}): {per_day:,} occurrences in {filled['seconds']:.1f} s,"
                f" WAL {filled['wal_bytes'] / per_day:.0f} B per occurrence (bulk)"
            )
            if k + 1 in measure_at or k == days - 1:
                await pool.execute("VACUUM ANALYZE")
                measured = {
                    "days_of_history": k + 1,
                    "sizes": await sizes(pool),
                    "hot_queries": await hot_queries(pool, now),
                }
                result["measured"][f"{k + 1}x"] = measured
                log(f"measured at {k + 1} days: " + _summary(measured))
        result["lifecycle_wal"] = await lifecycle_wal(
            pool, now + timedelta(minutes=5), lifecycle_sample, message, schedules
        )
        log(f"lifecycle WAL per occurrence: {result['lifecycle_wal']}")
        if own_server:
            result["lifecycle_wal_records_only"] = await lifecycle_wal_records_only(
                pool, now + timedelta(minutes=5), lifecycle_sample, message, schedules
            )
            log(f"lifecycle WAL per occurrence without full-page images: {result['lifecycle_wal_records_only']}")

        # Retention: keep the last keep_days days, as of the simulated now.
        await set_retention(pool, timedelta(days=keep_days))
        clock = ManualClock(now)
        dry = await prune(pool, clock=clock, dry_run=True)
        lsn, began = await wal_lsn(pool), time.perf_counter()
        report = await prune(pool, clock=clock, batch_size=5000)
        seconds = time.perf_counter() - began
        prune_wal = await wal_since(pool, lsn)
        result["retention"] = {
            "days_moved_whole": [d.to_json() for d in report.days],
            "would_archive": dry.occurrences,
            "archived_occurrences": report.occurrences,
            "archived_attempts": report.attempts,
            "batches": report.batches,
            "seconds": round(seconds, 1),
            "occurrences_per_s": round(report.occurrences / seconds) if seconds else None,
            "wal_bytes": prune_wal,
            "wal_bytes_per_occurrence": round(prune_wal / report.occurrences, 1) if report.occurrences else None,
            "kept_not_final": {t.tenant_id: t.kept for t in report.tenants if t.kept},
            "dead_tuples_before_vacuum": await autovacuum_state(pool),
            "sizes_before_vacuum": await sizes(pool),
        }
        log(
            f"prune: {report.occurrences:,} occurrences, {report.attempts:,} attempts in {seconds:.1f} s"
            f" ({result['retention']['occurrences_per_s']}/s), WAL {prune_wal / max(report.occurrences, 1):.0f} B each"
        )
        began = time.perf_counter()
        await pool.execute("VACUUM ANALYZE")
        result["retention"]["vacuum_seconds"] = round(time.perf_counter() - began, 1)
        result["retention"]["after"] = {"sizes": await sizes(pool), "hot_queries": await hot_queries(pool, now)}
        log("after the prune and VACUUM: " + _summary(result["retention"]["after"]))
        return result
    finally:
        await pool.close()


def _summary(measured: dict[str, Any]) -> str:
    s = measured["sizes"]
    parts = [
        f"{name.split('.')[-1] if name.startswith('public') else name} {s[name]['rows']:,} rows"
        f" {s[name]['bytes_per_row']} B/row"
        for name in (
            "public.occurrences",
            "public.attempts",
            "public.outbox",
            "public.schedules",
            "archive.occurrences",
        )
        if s[name]["rows"]
    ]
    q = measured["hot_queries"]
    return "; ".join(parts) + " | " + ", ".join(f"{k} {v['ms']} ms" for k, v in q.items())


async def main(args: argparse.Namespace) -> dict[str, Any]:
    database_url = os.environ.get("CHRONOQ_DATABASE_URL")
    postgres: EmbeddedPostgres | None = None
    if database_url is None:
        postgres = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="chronoq-capacity-")) / "postgres")
        try:
            postgres.start()
        except BaseException:
            shutil.rmtree(postgres.data_dir.parent, ignore_errors=True)
            raise
        admin = await asyncpg.connect(postgres.url("postgres"))
        await admin.execute("CREATE DATABASE capacity")
        await admin.close()
        database_url = postgres.url("capacity")
    try:
        return await run_capacity(
            database_url,
            schedules=args.schedules,
            per_day=args.per_day,
            days=args.days,
            keep_days=args.keep_days,
            measure_at=tuple(int(x) for x in args.measure_at.split(",")),
            own_server=postgres is not None,
        )
    finally:
        if postgres is not None and not args.keep:
            postgres.stop()
            shutil.rmtree(postgres.data_dir.parent, ignore_errors=True)
        elif postgres is not None:
            print(f"kept: {database_url} (stop it: kill -INT {postgres.pid})", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=200_000)
    parser.add_argument("--per-day", type=int, default=400_000, help="occurrences per simulated day")
    parser.add_argument("--days", type=int, default=8)
    parser.add_argument("--keep-days", type=int, default=2, help="the retention of the prune at the end")
    parser.add_argument("--measure-at", default="1", help="also measure after these days (always after the last)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="leave the embedded PostgreSQL running (prints its URL)")
    arguments = parser.parse_args()
    figures = asyncio.run(main(arguments))
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2, default=str))

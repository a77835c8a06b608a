"""Benchmark: `chronoq reconcile` over the last hour of N schedules (default 1,000,000).

    python -m load_tests.reconcile_benchmark [--schedules 1000000] [--runs 2] [--json PATH]

Seeds a database (the embedded PostgreSQL, or CHRONOQ_DATABASE_URL) with N
schedules across 20 tenants: 40 % cron over 22 expressions x 16 zones, 50 %
rate over 8 periods with their own anchors, 10 % one-time; 5 % of them were
updated half an hour ago (a second version with another rule, whose
materialized-ahead slots of the first version are CANCELED). Occurrences for
every slot of the last 65 minutes are written in one statement per table
(state mix of a healthy system), then faults are planted: lost occurrences,
duplicate slots and occurrences at instants no rule fires. The reconciler then
runs over the last hour, as an operator's cron job would, and must report
exactly the planted faults. Prints the seed and reconcile timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg

from engine.cli.embedded.postgres import EmbeddedPostgres
from engine.control.reconciler import Window, reconcile
from engine.control.reconciler.slots import build_expected_slots
from schemas.clock import ManualClock
from schemas.connections import create_pool
from schemas.migrations import apply_migrations

CRON = [
    "*/5 * * * *",
    "0 * * * *",
    "*/15 * * * *",
    "30 * * * *",
    "*/10 * * * *",
    "0,30 * * * *",
    "15 */2 * * *",
    "0 9 * * *",
    "*/20 8-18 * * MON-FRI",
    "45 * * * *",
    "0 */6 * * *",
    "5,35 * * * *",
    "*/30 * * * *",
    "0 0 * * *",
    "12 * * * *",
    "0 12 * * MON",
    "*/6 * * * *",
    "50 * * * *",
    "*/12 * * * *",
    "25 */3 * * *",
    "0 8-20 * * *",
    "20 4 * * *",
]
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
    "America/Havana",
    "Europe/London",
    "Asia/Tokyo",
    "America/Los_Angeles",
    "America/Sao_Paulo",
    "Africa/Cairo",
    "Asia/Kathmandu",
    "Pacific/Auckland",
    "America/Santiago",
    "Asia/Beirut",
    "Europe/Moscow",
]
RATES = ["5m", "15m", "30m", "1h", "2h", "10m", "45m", "6h"]
PLANTED_LOST, PLANTED_DUPLICATES, PLANTED_ODD = 100, 50, 25


async def seed(pool: asyncpg.Pool, schedules: int) -> tuple[datetime, dict[str, float]]:
    """Seed the database; return the instant the seed is "now" for and how long each part took."""
    timings: dict[str, float] = {}
    began = time.perf_counter()
    await pool.execute("""
        INSERT INTO tenants (tenant_id, api_token_hash, signing_key)
        SELECT 'bench-' || t, sha256(('bench-' || t)::bytea), sha256(('key-' || t)::bytea)
        FROM generate_series(0, 19) t""")
    # One statement for schedules and one for their first version. Kinds by i % 10: 0-3 cron, 4-8 rate, 9 once.
    await pool.execute(
        """
        INSERT INTO schedules (schedule_id, tenant_id, kind, expression, time_zone, anchor, next_run_at, target,
                               shard, created_at, updated_at)
        SELECT md5('schedule-' || i)::uuid, 'bench-' || (i % 20),
               CASE WHEN i % 10 < 4 THEN 'cron' WHEN i % 10 < 9 THEN 'rate' ELSE 'once' END,
               CASE WHEN i % 10 < 4 THEN ($2::text[])[1 + (i / 10) % array_length($2, 1)]
                    WHEN i % 10 < 9 THEN ($4::text[])[1 + (i / 10) % array_length($4, 1)]
                    ELSE to_char((now() - interval '70 minutes' + ((i * 7919) % 7200) * interval '1 second')
                                 AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') END,
               CASE WHEN i % 10 < 4 THEN ($3::text[])[1 + (i / 100) % array_length($3, 1)] ELSE 'UTC' END,
               CASE WHEN i % 10 BETWEEN 4 AND 8
                    THEN date_trunc('second', now()) - interval '1 day' + ((i * 104729) % 86400) * interval '1 second'
               END,
               now() + interval '30 seconds', 'bench.target-' || (i % 8), i % 256,
               now() - interval '1 day', now() - interval '1 day'
        FROM generate_series(1::bigint, $1) AS i""",
        schedules,
        CRON,
        ZONES,
        RATES,
    )
    await pool.execute("""
        INSERT INTO schedule_versions (schedule_id, version, tenant_id, change, state, definition, next_run_at,
                                       changed_at)
        SELECT schedule_id, 1, tenant_id, 'create', 'active',
               jsonb_strip_nulls(jsonb_build_object(
                   'kind', kind, 'expression', expression, 'time_zone', time_zone, 'dst_repeat', dst_repeat,
                   'dst_gap', dst_gap, 'target', target, 'misfire_policy', misfire_policy,
                   'max_lateness', max_lateness_s,
                   'anchor', to_char(anchor AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))),
               CASE WHEN kind = 'once' THEN expression::timestamptz ELSE created_at END, created_at
        FROM schedules""")
    # 5 %: updated 30 minutes ago to another rule (version 2).
    await pool.execute("""
        WITH changed AS (
            UPDATE schedules SET version = 2, expression = CASE kind WHEN 'cron' THEN '*/7 * * * *'
                                                                     WHEN 'rate' THEN '20m' ELSE expression END,
                                 updated_at = now() - interval '30 minutes'
            WHERE kind <> 'once' AND hashtext(schedule_id::text) % 20 = 0
            RETURNING *)
        INSERT INTO schedule_versions (schedule_id, version, tenant_id, change, state, definition, next_run_at,
                                       changed_at)
        SELECT schedule_id, 2, tenant_id, 'update', 'active',
               jsonb_strip_nulls(jsonb_build_object(
                   'kind', kind, 'expression', expression, 'time_zone', time_zone, 'dst_repeat', dst_repeat,
                   'dst_gap', dst_gap, 'target', target, 'misfire_policy', misfire_policy,
                   'max_lateness', max_lateness_s,
                   'anchor', to_char(anchor AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))),
               updated_at + interval '1 second', updated_at
        FROM changed""")
    timings["seed_schedules_s"] = time.perf_counter() - began

    # Occurrences: every slot of the last 65 minutes (what a healthy materializer wrote), computed by the
    # reconciler's own slot builder (the benchmark measures speed; tests/integration prove the slots right).
    began = time.perf_counter()
    async with pool.acquire() as conn:
        await conn.execute("SET work_mem = '256MB'")
        async with conn.transaction():
            now = await conn.fetchval("SELECT now()")
            window = Window(now - timedelta(minutes=65), now + timedelta(seconds=30))
            await build_expected_slots(conn, window, None)
            await conn.execute(
                """
                INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target,
                                         scheduled_for, available_at, state, attempt_count, created_at, updated_at)
                SELECT md5(s.schedule_id::text || s.version || s.scheduled_for::text)::uuid, s.schedule_id,
                       s.version, v.tenant_id, v.definition ->> 'target', s.scheduled_for, s.scheduled_for,
                       CASE WHEN NOT s.required THEN 'CANCELED'
                            WHEN s.scheduled_for > $1::timestamptz - interval '5 seconds' THEN 'ENQUEUED'
                            WHEN hashtext(s.schedule_id::text) % 100 = 0 THEN 'MISSED'
                            WHEN hashtext(s.schedule_id::text) % 97 = 0 THEN 'DEAD'
                            ELSE 'SUCCEEDED' END,
                       1, s.scheduled_for - interval '30 seconds',
                       least(s.scheduled_for + interval '2 seconds', $1::timestamptz)
                FROM rc_slots s JOIN rc_versions v USING (schedule_id, version)
                ORDER BY s.scheduled_for""",
                now,
            )
    timings["seed_occurrences_s"] = time.perf_counter() - began
    began = time.perf_counter()
    await plant_faults(pool)
    await pool.execute("VACUUM ANALYZE occurrences")
    await pool.execute("VACUUM ANALYZE schedule_versions")
    await pool.execute("VACUUM ANALYZE schedules")
    timings["plant_and_vacuum_s"] = time.perf_counter() - began
    return now, timings


async def plant_faults(pool: asyncpg.Pool) -> None:
    window = "scheduled_for BETWEEN now() - interval '50 minutes' AND now() - interval '10 minutes'"
    await pool.execute(
        f"""
        DELETE FROM occurrences WHERE occurrence_id IN (
            SELECT occurrence_id FROM occurrences WHERE {window} AND state = 'SUCCEEDED'
            ORDER BY md5(occurrence_id::text) LIMIT $1)""",
        PLANTED_LOST,
    )
    await pool.execute(
        f"""
        INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
                                 available_at, state)
        SELECT md5('dup' || occurrence_id::text)::uuid, schedule_id, schedule_version + 100, tenant_id, target,
               scheduled_for, available_at, 'SUCCEEDED'
        FROM (SELECT * FROM occurrences WHERE {window} AND state = 'SUCCEEDED'
              ORDER BY md5('d' || occurrence_id::text) LIMIT $1) picked""",
        PLANTED_DUPLICATES,
    )
    await pool.execute(
        f"""
        INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
                                 available_at, state)
        SELECT md5('odd' || occurrence_id::text)::uuid, schedule_id, schedule_version, tenant_id, target,
               scheduled_for + interval '17 seconds', available_at, 'SUCCEEDED'
        FROM (SELECT * FROM occurrences WHERE {window} AND state = 'SUCCEEDED'
              ORDER BY md5('o' || occurrence_id::text) LIMIT $1) picked""",
        PLANTED_ODD,
    )


async def main(args: argparse.Namespace) -> dict[str, object]:
    database_url = os.environ.get("CHRONOQ_DATABASE_URL")
    postgres: EmbeddedPostgres | None = None
    if database_url is None:
        postgres = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="chronoq-reconcile-bench-")) / "postgres")
        try:
            postgres.start()
        except BaseException:
            shutil.rmtree(postgres.data_dir.parent, ignore_errors=True)
            raise
        admin = await asyncpg.connect(postgres.url("postgres"))
        await admin.execute("CREATE DATABASE reconcile_bench")
        await admin.close()
        database_url = postgres.url("reconcile_bench")
    try:
        # temp_buffers holds the run's temporary tables in memory; it must be set before a session uses one.
        pool = await create_pool(database_url, min_size=1, max_size=2, server_settings={"temp_buffers": "1GB"})
        async with pool.acquire() as conn:
            await apply_migrations(conn, "engine")
        seeded_at, timings = await seed(pool, args.schedules)
        print(
            f"seeded {args.schedules:,} schedules: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()), flush=True
        )
        occurrences = await pool.fetchval("SELECT count(*) FROM occurrences")
        runs = []
        for run in range(args.runs):
            # "The last hour" as of the seed (seeding takes minutes; its cursors are the seed's, 30 s ahead).
            report = await reconcile(
                pool, Window(seeded_at - timedelta(hours=1), seeded_at), clock=ManualClock(seeded_at), record=True
            )
            c = report.counts
            runs.append(
                {
                    "run": run + 1,
                    "seconds": round(report.duration_s, 2),
                    "expected": c["expected"],
                    "present": c["present"],
                    "missing": c["missing"],
                    "unexpected": c["unexpected"],
                    "duplicate_slots": c["duplicate_slots"],
                    "versions": c["versions"],
                    "reasons": report.reasons,
                }
            )
            print(
                f"reconcile run {run + 1}: {report.duration_s:.2f} s for {c['versions']:,} versions,"
                f" {c['expected']:,} expected slots, {sum(report.states.values()):,} occurrences in the window;"
                f" missing {c['missing']} unexpected {c['unexpected']} duplicates {c['duplicate_slots']}",
                flush=True,
            )
            found = (c["missing"], c["duplicate_slots"], report.reasons["unexpected"])
            wanted = (
                PLANTED_LOST,
                PLANTED_DUPLICATES,
                {"unknown_version": PLANTED_DUPLICATES, "not_a_fire_time": PLANTED_ODD},
            )
            if found != wanted:
                print(f"  planted {wanted}, found {found}", file=sys.stderr, flush=True)
        await pool.close()
        return {"schedules": args.schedules, "occurrences_total": occurrences, "seed": timings, "runs": runs}
    finally:
        if postgres is not None and not args.keep:
            postgres.stop()
            shutil.rmtree(postgres.data_dir.parent, ignore_errors=True)  # gigabytes at 1M schedules
        elif postgres is not None:
            print(f"kept: {database_url} (stop it: kill -INT {postgres.pid})", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="leave the embedded PostgreSQL running (prints its URL)")
    arguments = parser.parse_args()
    result = asyncio.run(main(arguments))
    if arguments.json:
        arguments.json.write_text(json.dumps(result, indent=2, default=str))

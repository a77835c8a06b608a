"""Benchmark: the cost of one schedule create (and update) as its tenant grows.

    python -m load_tests.create_cost [--sizes 1000,10000,100000,1000000] [--creates 40] [--json PATH]

Starts PostgreSQL (embedded, or CHRONOQ_DATABASE_URL's server) and a fresh
engine database, and grows one tenant to each size in turn (copies of one
hourly schedule, inserted in one statement). At each size it times
``--creates`` creates and as many updates through ``ControlPlane`` (the
API's path: tenant lock, validation, quota check, insert), and, for
comparison in the same run, the quota check the engine made before migration
0024: a count and rate sum over the tenant's live schedules. Prints p50 / p95
milliseconds per size; the last line is one JSON object.

What it shows: with the usage counter, a create's cost does not grow with the
tenant; the former count grew by ~0.35 µs per live schedule (docs/benchmarks.md,
stop 42 and stop 44).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from engine.cli.embedded.postgres import EmbeddedPostgres
from engine.control.quotas import TenantQuotas
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from load_tests.hour_top_figures import percentiles
from schemas.connections import create_pool
from schemas.migrations import apply_migrations

TENANT = "big"
SCHEDULE = {"kind": "cron", "expression": "0 * * * *", "time_zone": "UTC", "target": "cost.t", "payload": {"n": 1}}

# The quota check before migration 0024, kept here only to compare against.
FORMER_USAGE = """
SELECT count(*) AS schedules, coalesce(sum(fires_per_minute), 0)::double precision AS fires_per_minute
FROM schedules WHERE tenant_id = $1 AND state IN ('active', 'paused')
"""

# Copies of a template schedule with fresh ids (and their shards), in one statement.
GROW = """
INSERT INTO schedules
SELECT (jsonb_populate_record(s, jsonb_build_object('schedule_id', g.id, 'shard', g.shard,
                                                   'created_by_key', NULL))).*
FROM schedules s,
     LATERAL (SELECT gen_random_uuid() AS id, (random() * 255)::int AS shard FROM generate_series(1, $2)) g
WHERE s.schedule_id = $1
"""


def _ms(samples: list[float]) -> dict[str, float]:
    """p50 and p95 in milliseconds (nearest rank, as every figure of ``hour_top``)."""
    figures = percentiles(samples)
    return {"p50_ms": round(figures["p50"] * 1000, 2), "p95_ms": round(figures["p95"] * 1000, 2)}


async def _timed(count: int, call) -> list[float]:
    samples = []
    for i in range(count):
        began = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - began)
    return samples


async def measure_size(pool: asyncpg.Pool, control: ControlPlane, size: int, creates: int) -> dict[str, object]:
    """Creates, updates of the schedules just created, and the former count, ``creates`` times each."""
    created: list[str] = []

    async def create(i: int) -> None:
        created.append((await control.create_schedule(TENANT, {**SCHEDULE, "payload": {"n": i}}))["schedule_id"])

    async def update(i: int) -> None:
        await control.update_schedule(TENANT, created[i], {"expression": f"{1 + i % 58} * * * *"})

    async def former(i: int) -> None:
        async with pool.acquire() as conn:
            await conn.fetchrow(FORMER_USAGE, TENANT)

    row: dict[str, object] = {"live_schedules": size}
    for name, call in (("create", create), ("update", update), ("former_count", former)):
        row[name] = _ms(await _timed(creates, call))
    return row


async def measure(pool: asyncpg.Pool, sizes: list[int], creates: int) -> list[dict[str, object]]:
    await create_tenant(pool, TENANT, TenantQuotas(max_active_schedules=10**9, max_fires_per_minute=1e15))
    control = ControlPlane(pool)
    template = (await control.create_schedule(TENANT, SCHEDULE))["schedule_id"]
    rows = []
    for size in sizes:
        live = await pool.fetchval("SELECT count(*) FROM schedules WHERE tenant_id = $1", TENANT)
        if size > live:
            await pool.execute(GROW, template, size - live)
            await pool.execute("VACUUM ANALYZE schedules")
        row = await measure_size(pool, control, size, creates)
        rows.append(row)
        print(
            f"{size:>9,} live: create {row['create']['p50_ms']:.2f} / {row['create']['p95_ms']:.2f} ms,"  # type: ignore[index]
            f" update {row['update']['p50_ms']:.2f} / {row['update']['p95_ms']:.2f} ms,"  # type: ignore[index]
            f" the former count alone {row['former_count']['p50_ms']:.2f} ms (p50 / p95)",  # type: ignore[index]
            flush=True,
        )
    return rows


async def main(args: argparse.Namespace) -> dict[str, object]:
    database_url = os.environ.get("CHRONOQ_DATABASE_URL")
    postgres: EmbeddedPostgres | None = None
    home = Path(tempfile.mkdtemp(prefix="chronoq-create-cost-"))
    try:
        if database_url is None:
            postgres = EmbeddedPostgres(home / "postgres")
            postgres.start()
            database_url = postgres.url("postgres")
        admin = await asyncpg.connect(database_url)
        database = f"create_cost_{os.getpid()}"
        await admin.execute(f'CREATE DATABASE "{database}"')
        url = urlunsplit(urlsplit(database_url)._replace(path=f"/{database}"))
        try:
            pool = await create_pool(url, min_size=1, max_size=2)
            try:
                async with pool.acquire() as conn:
                    await apply_migrations(conn, "engine")
                rows = await measure(pool, args.sizes, args.creates)
            finally:
                await pool.close()
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            await admin.close()
    finally:
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(home, ignore_errors=True)
    return {"creates_per_size": args.creates, "sizes": rows}


def _sizes(text: str) -> list[int]:
    return sorted(int(part) for part in text.split(","))


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_sizes, default=[1000, 10000, 100000, 1000000])
    parser.add_argument("--creates", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = asyncio.run(main(args))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report))


if __name__ == "__main__":
    cli()

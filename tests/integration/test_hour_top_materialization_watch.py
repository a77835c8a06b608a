"""hour_top's watch of the materialization: each role's CPU is divided by the occurrences written between the
poll that first saw some and the poll that saw them all, not by the whole burst (the rows already there at
the first poll were written before the first CPU reading)."""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from load_tests.hour_top import watch_materialization

DAY = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)


async def _write(conn: asyncpg.Connection, count: int) -> None:
    await conn.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at) SELECT gen_random_uuid(), gen_random_uuid(), 1, 'acme', 'billing', $1, $1"
        " FROM generate_series(1, $2)",
        DAY,
        count,
    )


async def test_materialization_cpu_is_per_occurrence_written_between_the_two_polls(engine_db: str, tmp_path: Path):
    conn = await asyncpg.connect(engine_db)
    watcher = await asyncpg.connect(engine_db)
    try:
        await _write(conn, 100)
        readings = iter([{"nodes": 10.0, "postgres": 20.0}, {"nodes": 10.0004, "postgres": 20.0008}])
        first_read = asyncio.Event()

        def cpu_of() -> dict[str, float]:
            first_read.set()
            return next(readings)

        report: dict[str, object] = {}
        args = argparse.Namespace(schedules=300)
        top = await conn.fetchval("SELECT now()") + timedelta(hours=1)
        watch = asyncio.create_task(watch_materialization(watcher, args, [], top, report, tmp_path, cpu_of))
        await asyncio.wait_for(first_read.wait(), 10)
        await _write(conn, 200)
        await asyncio.wait_for(watch, 20)
    finally:
        await conn.close()
        await watcher.close()
    assert report["materialized"] == {"count": 300, "ahead": 0, "late": 0}
    # 0.4 ms and 0.8 ms of CPU over the 200 occurrences written after the first reading
    assert report["materialize_cpu_us_per_row"] == {"nodes": 2.0, "postgres": 4.0}


async def test_a_counter_ahead_of_the_table_does_not_end_the_watch(engine_db: str, tmp_path: Path):
    """The watch polls the open counter (cheap) but ends only when a count of the table agrees."""
    conn = await asyncpg.connect(engine_db)
    watcher = await asyncpg.connect(engine_db)
    try:
        # a counter that parted from the table: it says 300 open before any row exists
        await conn.execute("INSERT INTO tenant_usage_changes (tenant_id, open_occurrences) VALUES ('acme', 300)")
        report: dict[str, object] = {}
        args = argparse.Namespace(schedules=300)
        top = await conn.fetchval("SELECT now()") + timedelta(hours=1)
        watch = asyncio.create_task(watch_materialization(watcher, args, [], top, report, tmp_path))
        await asyncio.sleep(0.5)
        assert not watch.done()
        await _write(conn, 300)
        await asyncio.wait_for(watch, 20)
    finally:
        await conn.close()
        await watcher.close()
    materialized = report["materialized"]
    assert isinstance(materialized, dict) and materialized["count"] >= 300

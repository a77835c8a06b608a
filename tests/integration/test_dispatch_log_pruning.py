"""The settled dispatch log is forgotten after keep_log: bounded statements, oldest first, never an unsettled
entry (the settle pass still needs those, and the API derives ENQUEUED from them)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg

from engine.loops.dispatch_settler import DispatchSettler, SettlerConfig
from schemas import observability as obs
from schemas.clock import ManualClock
from schemas.queries import QUERIES
from tests.support.telemetry import Telemetry
from tests.support.waiting import wait_for

KEEP = 600.0


async def log_entries(pool: asyncpg.Pool, clock: ManualClock, settled_ago: list[float | None]) -> list[int]:
    """One log entry per item: settled that many seconds before the clock's instant, or unsettled (None)."""
    now = clock.now()
    key = uuid.uuid4()
    return [
        await pool.fetchval(
            "INSERT INTO dispatch_log (shard, lane, epoch, from_bucket, from_round, from_id, to_bucket, to_round,"
            " to_id, rows, acked_at, settled_at) VALUES ($1, 'flexible', 1, $2, 0, $3, $2, 0, $3, 1, $2, $4)"
            " RETURNING id",
            n,
            now - timedelta(seconds=ago if ago is not None else 3 * KEEP),
            key,
            None if ago is None else now - timedelta(seconds=ago),
        )
        for n, ago in enumerate(settled_ago)
    ]


async def remaining(pool: asyncpg.Pool) -> list[int]:
    return [r["id"] for r in await pool.fetch("SELECT id FROM dispatch_log ORDER BY id")]


async def test_prune_forgets_only_entries_settled_longer_ago_than_keep_log(pool, clock, telemetry: Telemetry):
    # 12 settled long ago, 3 settled within the keep, 2 never settled (acked long before the others).
    ids = await log_entries(pool, clock, [KEEP + 1 + k for k in range(12)] + [1.0, 10.0, KEEP - 1] + [None, None])
    config = SettlerConfig(keep_log=KEEP, prune_batch=5, prune_statements=2)
    settler = DispatchSettler(pool, config, clock, meter=telemetry.instruments("engine")["meter"])
    # One prune runs at most two statements of five: ten go, the two oldest-settled first.
    assert await settler.prune() == 10
    left = await remaining(pool)
    assert len(left) == 7 and set(left) >= set(ids[12:])
    assert set(ids[:12]) - set(left) == set(ids[2:12]), "the longest-settled entries go first"
    assert await settler.prune() == 2
    assert await remaining(pool) == ids[12:]
    assert await settler.prune() == 0
    # Time passes: the recently settled ones age out, the unsettled ones stay whatever their age.
    clock.advance(timedelta(seconds=KEEP))
    assert await settler.prune() == 3
    assert await remaining(pool) == ids[15:]
    assert sum(p.value for p in telemetry.points(obs.DISPATCH_LOG_PRUNED)) == 15


async def test_the_running_settler_prunes_on_its_cadence(pool, clock):
    await log_entries(pool, clock, [KEEP + 5] * 30 + [None])
    settler = DispatchSettler(pool, SettlerConfig(keep_log=KEEP, prune_every=0.05, prune_batch=7), clock)
    stop = asyncio.Event()
    task = asyncio.create_task(settler.run(stop))
    try:
        # The unsettled entry has no queue rows: the settle pass marks it settled now, the prune keeps it.
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 1 FROM dispatch_log WHERE settled_at IS NOT NULL"))
        clock.advance(timedelta(seconds=KEEP + 1))
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 0 FROM dispatch_log"))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_the_prune_reads_only_what_it_deletes(pool, clock):
    """With most of the log inside the keep, the prune reaches its few old entries through the settled_at
    index, not by reading every kept entry (an hour's keep of flexible traffic was a million entries)."""
    await pool.execute(
        "INSERT INTO dispatch_log (shard, lane, epoch, from_bucket, from_round, from_id, to_bucket, to_round,"
        " to_id, rows, acked_at, settled_at)"
        " SELECT n % 256, 'flexible', 1, $1, 0, $2, $1, 0, $2, 1, $1, $1::timestamptz - make_interval(secs => n % 300)"
        " FROM generate_series(1, 20000) n",
        clock.now(),
        uuid.uuid4(),
    )
    await pool.execute("ANALYZE dispatch_log")
    sql, *args = QUERIES.prune_settled_log(keep_s=KEEP, limit=5000, now=clock.now())
    plan = await pool.fetchval("EXPLAIN (FORMAT JSON) " + sql, *args)  # planned, not run
    assert "dispatch_log_settled" in str(plan), plan

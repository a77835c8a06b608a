"""One ahead-lane relay against a seeded burst: where a node's dispatch time goes, per step.

    python -m load_tests.dispatch_burst [--rows 250000] [--shards 128] [--explain] [--consumer --due-in 20]

Seeds ``--rows`` ahead-lane rows (hour-top shaped: one bucket, one big tenant
owning 80 %, weighted rounds, ~300-byte messages) over ``--shards`` shards
leased to one node, then runs one :class:`relay.ahead_relay.AheadRelay` pass
from the moment they are due and reports the rate and the time spent in each
store call and in the publisher (wall time inside each awaited call; they
overlap, pages are pipelined). ``--explain`` prints EXPLAIN (ANALYZE, BUFFERS)
of the page read, the seal and the cursor move at the start of the burst and
halfway through it. No materializer, no background schedules: the relay's own
cost, quickly, so that a change can be measured in seconds. CPU per row is
reported for the relay (this process), the broker and PostgreSQL, and with
``--consumer`` for the hour-top run's no-op consumer group reading beside the
burst (give it ``--due-in`` of 20 s or so to join its group first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg

from schemas.migrations import apply_migrations

BIG_SHARE = 0.8
CONSUMER_DRAIN = 2.0  # seconds the no-op consumer gets after the burst before CPU is read
TENANTS = 200
TOPICS = 4


async def seed(conn: asyncpg.Connection, rows: int, shards: int, node: str, due_in: float) -> Any:
    """Lease ``shards`` to ``node`` and write ``rows`` due ahead-lane rows; returns the due instant."""
    await conn.execute(
        "UPDATE shard_leases SET owner = $1, epoch = 1, expires_at = now() + interval '1 hour' WHERE shard < $2",
        node,
        shards,
    )
    top = await conn.fetchval(
        "SELECT date_trunc('second', now() + make_interval(secs => $1)) + interval '1 second'", due_in
    )
    # Round = the row's index among its tenant's rows in its shard (weight 1), as the materializer writes it.
    await conn.execute(
        """
        INSERT INTO dispatch_queue (shard, lane, bucket, wrr_round, occurrence_id, tenant_id, topic, message_key,
                                    message, scheduled_for, available_at, late_after, misfire_policy)
        SELECT shard, 'strict', $2::timestamptz, (row_number() OVER (PARTITION BY shard, tenant ORDER BY i))::int - 1,
               gen_random_uuid(), tenant, 'chronoq.occurrences.load.target-' || (i % $4),
               convert_to(md5(i::text), 'UTF8'), convert_to(repeat('x', 300), 'UTF8'), $2::timestamptz,
               $2::timestamptz, $2::timestamptz + interval '60 seconds', 'fire_once'
        FROM (
            SELECT i, i % $3 AS shard,
                   CASE WHEN i % 10 < $5 THEN 'big' ELSE 'small-' || (i % $6) END AS tenant
            FROM generate_series(0, $1::int - 1) AS i
        ) s
        """,
        rows, top, shards, TOPICS, round(BIG_SHARE * 10), TENANTS - 1,
    )  # fmt: skip
    await conn.execute("ANALYZE dispatch_queue")
    return top


EXPLAINED = {
    "read_ahead_page": "page read",
    "seal_lanes": "seal",
    "advance_cursors": "cursor move + log",
    "ahead_backlog": "backlog gauge",
}


class _Timed:
    """Wraps an object's coroutine methods; accumulates the wall time and calls of each."""

    def __init__(self, target: Any, names: list[str], totals: dict[str, list[float]]) -> None:
        for name in names:
            original = getattr(target, name)

            async def timed(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await _original(*args, **kwargs)
                finally:
                    entry = totals[_name]
                    entry[0] += time.perf_counter() - started
                    entry[1] += 1

            setattr(target, name, timed)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.loops.service import DATA_PLANE_SERVER_SETTINGS
    from load_tests.process_cpu import cpu_seconds, per_row
    from load_tests.stack_for_load import load_stack
    from relay.ahead_lane import AheadLaneStore
    from relay.ahead_relay import AheadRelay, AheadRelayConfig
    from relay.librdkafka_publisher import LibrdkafkaConfig, LibrdkafkaPublisher
    from schemas.clock import DatabaseClock
    from schemas.garbage_collection import tune_for_throughput
    from schemas.queries import QUERIES
    from schemas.shard_ownership import ShardOwnership
    from schemas.topics import create_missing_topics

    tune_for_throughput()  # as an engine node's run_services does
    node = "bench-node"
    report: dict[str, Any] = {"rows": args.rows, "shards": args.shards, "rows_per_shard": args.rows_per_shard}
    async with load_stack("dispatchburst", args.broker) as (url, bootstrap):
        conn = await asyncpg.connect(url)
        pool = await asyncpg.create_pool(url, min_size=2, max_size=6, server_settings=DATA_PLANE_SERVER_SETTINGS)
        publisher = LibrdkafkaPublisher(LibrdkafkaConfig(bootstrap, partitions=8, linger=args.linger))
        scratch = tempfile.TemporaryDirectory(prefix="dispatch-burst-")  # the no-op consumer's report
        try:
            await apply_migrations(conn, "engine")
            topics = [f"chronoq.occurrences.load.target-{i}" for i in range(TOPICS)]
            await create_missing_topics(bootstrap, topics, 8)
            await publisher.start()
            await publisher.ensure_topics(topics)
            # The hour-top run's no-op consumer group, reading beside the burst: its CPU and the broker's
            # share of serving it are what a burst costs on a machine that also consumes.
            consumer = None
            if args.consumer:
                received = Path(scratch.name) / "received.json"
                command = [sys.executable, "-m", "load_tests.hour_top", "--consume", "--bootstrap", bootstrap]
                consumer = subprocess.Popen([*command, "--out", str(received)], stdout=subprocess.DEVNULL)
            started = time.perf_counter()
            top = await seed(conn, args.rows, args.shards, node, args.due_in)
            report["seed_s"] = round(time.perf_counter() - started, 1)
            ownership = ShardOwnership(node)
            ownership.replace({s: 1 for s in range(args.shards)})
            store = AheadLaneStore(pool, DatabaseClock(), node)
            totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
            _Timed(store, ["seal", "read_page", "advance", "judge_late", "positions", "now"], totals)
            _Timed(publisher, ["send"], totals)
            config = AheadRelayConfig(rows_per_shard=args.rows_per_shard, pages_in_flight=args.pages_in_flight)
            relay = AheadRelay(store, publisher, ownership, config)
            _Timed(relay, ["_complete", "_read", "_seal_if_due"], totals)
            if args.explain:
                report["explain_start"] = await explain(conn, QUERIES, node, args, top, halfway=False)
            wait = (top - await conn.fetchval("SELECT now()")).total_seconds()
            await asyncio.sleep(max(0.0, wait - 0.8))  # the relay reads up to read_ahead (1 s) early
            roles = {"relay": [os.getpid()], "consumer": [consumer.pid] if consumer else []}
            cpu_before = cpu_seconds(roles, bootstrap, url)
            started = time.perf_counter()
            published = 0
            while published < args.rows:
                result = await relay.run_once()
                published += result.published
                if not result.read:
                    await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - started
            if consumer is not None:
                await asyncio.sleep(CONSUMER_DRAIN)  # its share of the burst includes catching up
            cpu_after = cpu_seconds(roles, bootstrap, url)
            report["cpu_us_per_row"] = per_row(cpu_before, cpu_after, args.rows)
            if consumer is not None:
                consumer.send_signal(signal.SIGTERM)
                consumer.wait(90)
                report["consumer_received"] = len(json.loads(received.read_text()))
            first_ack, last_ack = await conn.fetchrow("SELECT min(acked_at), max(acked_at) FROM dispatch_log")
            report["first_ack_after_due_s"] = round((first_ack - top).total_seconds(), 3)
            report["published"] = published
            report["pages"] = await conn.fetchval("SELECT count(DISTINCT acked_at) FROM dispatch_log")
            report["last_ack_after_due_s"] = round((last_ack - top).total_seconds(), 3)
            report["rows_per_s_from_due"] = round(args.rows / max((last_ack - top).total_seconds(), 1e-3))
            report["pass_s"] = round(elapsed, 3)
            report["calls"] = {k: {"s": round(v[0], 3), "n": v[1]} for k, v in sorted(totals.items())}
            if args.explain:
                report["explain_halfway"] = await explain(conn, QUERIES, node, args, top, halfway=True)
        finally:
            await publisher.stop()
            await pool.close()
            await conn.close()
            scratch.cleanup()
    return report


async def explain(conn: asyncpg.Connection, queries: Any, node: str, args: argparse.Namespace, top: Any,
                  halfway: bool) -> dict[str, list[str]]:  # fmt: skip
    """EXPLAIN (ANALYZE, BUFFERS) of the hot statements for all shards, at the cursors as they stand (or,
    ``halfway``, as if half of each shard had been sent), rolled back."""
    from engine.loops.service import DATA_PLANE_SERVER_SETTINGS

    await conn.execute(f"SET work_mem = '{DATA_PLANE_SERVER_SETTINGS['work_mem']}'")  # as the relay's pool has it
    shards = list(range(args.shards))
    positions = await conn.fetch(
        """
        SELECT shard, bucket, wrr_round, occurrence_id FROM (
            SELECT shard, bucket, wrr_round, occurrence_id,
                   row_number() OVER (PARTITION BY shard ORDER BY bucket, wrr_round, occurrence_id) AS n,
                   count(*) OVER (PARTITION BY shard) AS total
            FROM dispatch_queue) q
        WHERE n = greatest(1, total / 2) ORDER BY shard
        """
    )
    if halfway:
        keys = [(p["bucket"], p["wrr_round"], p["occurrence_id"]) for p in positions]
    else:
        keys = [(top - timedelta(days=1), 0, uuid.UUID(int=0))] * len(shards)
    out: dict[str, list[str]] = {}
    statements = {
        "read_ahead_page": queries.read_ahead_page(
            shards=shards, buckets=[k[0] for k in keys], rounds=[k[1] for k in keys], ids=[k[2] for k in keys],
            seals=[top + timedelta(seconds=1)] * len(shards), lane="strict", per_shard=args.rows_per_shard,
        ),
        "seal_lanes": queries.seal_lanes(
            shards=shards, epochs=[1] * len(shards), until=top + timedelta(seconds=1), node=node, lane="strict",
            now=None,
        ),
        "advance_cursors": queries.advance_cursors(
            shards=shards, epochs=[1] * len(shards), from_buckets=[k[0] for k in keys],
            from_rounds=[k[1] for k in keys], from_ids=[k[2] for k in keys], to_buckets=[k[0] for k in keys],
            to_rounds=[k[1] + 1 for k in keys], to_ids=[k[2] for k in keys], rows=[64] * len(shards), now=None,
            node=node, lane="strict", acked_at=None,
        ),
        "ahead_backlog": queries.ahead_backlog(now=top + timedelta(seconds=1)),
    }  # fmt: skip
    for name, (sql, *params) in statements.items():
        tr = conn.transaction()
        await tr.start()
        try:
            rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", *params)
            out[EXPLAINED[name]] = [r[0] for r in rows]
        finally:
            await tr.rollback()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--shards", type=int, default=128, help="shards leased to the one node")
    parser.add_argument("--rows-per-shard", type=int, default=64)
    parser.add_argument("--pages-in-flight", type=int, default=3)
    parser.add_argument("--due-in", type=float, default=2.0, help="seconds from the end of seeding to the due time")
    parser.add_argument("--broker", choices=("tansu", "apache"), default="tansu")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--consumer", action="store_true", help="a no-op consumer group reads beside the burst")
    parser.add_argument("--linger", type=float, default=0.005, help="librdkafka linger (s)")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    explains = {k: report.pop(k) for k in ("explain_start", "explain_halfway") if k in report}
    print(json.dumps(report, indent=2, default=str))
    for when, plans in explains.items():
        for name, lines in plans.items():
            print(f"\n== {name} ({when})")
            print("\n".join(lines))


if __name__ == "__main__":
    main()

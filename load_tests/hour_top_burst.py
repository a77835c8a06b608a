"""Benchmark: an hour-top burst — N strict occurrences due at one instant, into Kafka.

    python -m load_tests.hour_top_burst [--schedules 100000] [--relays 2] [--broker tansu|apache] [--json PATH]

The target (docs/benchmarks.md): 500,000 strict triggers at the top of an hour reach
Kafka within 5 s (p99 of enqueued_at - scheduled_for), about 100,000
dispatches/s. This run measures the two halves separately, on the embedded
stack (or CHRONOQ_DATABASE_URL / CHRONOQ_KAFKA_BOOTSTRAP); ``--broker`` picks
the embedded broker, tansu (default) or Apache Kafka (its relays then use the
idempotent producer, as in production):

1. materialization: N schedules due at T are turned into occurrences and
   outbox rows ahead of time (the materializer's horizon), reported as rows/s;
2. dispatch: at T (a manual clock flips to T), the relays publish every due
   row and mark it sent; reported as rows/s and the lag distribution from T to
   the moment each batch was marked sent (wall clock).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from engine.cli.embedded import EmbeddedPostgres
from engine.cli.embedded.brokers import BROKER_KINDS, Broker, start_broker
from engine.loops.materializer import Materializer, MaterializerConfig
from relay.dispatcher import Relay, RelayConfig
from relay.outbox import OutboxStore
from relay.publisher import KafkaPublisher, PublisherConfig
from schemas.clock import ManualClock
from schemas.connections import create_pool
from schemas.migrations import apply_migrations

TOP = datetime(2027, 1, 4, 9, 0, tzinfo=UTC)


async def seed(pool: asyncpg.Pool, schedules: int, tenants: int, targets: int) -> None:
    """N hourly schedules whose cursor is the top of the hour, over tenants and targets (one statement)."""
    await pool.execute(
        """
        INSERT INTO schedules (schedule_id, tenant_id, kind, expression, time_zone, next_run_at, target, payload,
                               shard, fires_per_minute)
        SELECT gen_random_uuid(), 'load-' || (i % $2), 'cron', '0 * * * *', 'UTC', $4,
               'load.target-' || (i % $3), jsonb_build_object('n', i), i % 256, 1.0 / 60
        FROM generate_series(1, $1) AS i
        """,
        schedules,
        tenants,
        targets,
        TOP,
    )


async def materialize(pool: asyncpg.Pool, clock: ManualClock, batch: int) -> float:
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(minutes=2), batch_size=batch), clock)
    started = time.perf_counter()
    while (await materializer.run_once()).schedules:
        pass
    return time.perf_counter() - started


async def dispatch(
    pool: asyncpg.Pool, bootstrap: str, clock: ManualClock, relays: int, batch: int, idempotent: bool
) -> tuple[float, list[tuple[float, int]]]:
    publishers = [KafkaPublisher(PublisherConfig(bootstrap, idempotent=idempotent)) for _ in range(relays)]
    for publisher in publishers:
        await publisher.start()
    # Topics exist before the burst, as they do for any target that has fired before.
    await publishers[0].ensure_topics(await pool.fetchval("SELECT array_agg(DISTINCT topic) FROM outbox"))
    marks: list[tuple[float, int]] = []
    clock.set(TOP)
    started = time.perf_counter()

    async def drain(relay: Relay) -> None:
        while True:
            report = await relay.run_once()
            if report.published:
                marks.append((time.perf_counter() - started, report.published))
            if not report.claimed:
                return

    try:
        await asyncio.gather(
            *(drain(Relay(OutboxStore(pool, clock), p, RelayConfig(batch_size=batch))) for p in publishers)
        )
    finally:
        for publisher in publishers:
            await publisher.stop()
    return time.perf_counter() - started, marks


def lag_percentiles(marks: list[tuple[float, int]]) -> dict[str, float]:
    """Per-row lag: every row of a batch counts with the batch's mark time."""
    lags = sorted(t for t, n in marks for _ in range(n))
    if not lags:
        return {}
    q = statistics.quantiles(lags, n=100, method="inclusive")
    return {"p50": q[49], "p95": q[94], "p99": q[98], "max": lags[-1]}


async def main(args: argparse.Namespace) -> dict:
    home = Path(tempfile.mkdtemp(prefix="chronoq-burst-"))
    postgres: EmbeddedPostgres | None = None
    kafka: Broker | None = None
    admin_url = os.environ.get("CHRONOQ_DATABASE_URL")
    bootstrap = os.environ.get("CHRONOQ_KAFKA_BOOTSTRAP")
    if not (admin_url and bootstrap):
        postgres = EmbeddedPostgres(home / "postgres")
        postgres.start()
        kafka = start_broker(args.broker, home / "kafka")  # this (main) thread outlives the broker
        bootstrap = kafka.bootstrap
        admin_url = await postgres.ensure_database("burst")
    assert bootstrap is not None
    database = f"burst_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{database}"')
    url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{database}"))
    try:
        pool = await create_pool(url, min_size=2, max_size=args.relays * 2 + 4)
        async with pool.acquire() as conn:
            await apply_migrations(conn, "engine")
        clock = ManualClock(TOP - timedelta(seconds=90))
        t = time.perf_counter()
        await seed(pool, args.schedules, args.tenants, args.targets)
        seeded = time.perf_counter() - t
        materialized = await materialize(pool, clock, args.materialize_batch)
        elapsed, marks = await dispatch(
            pool, bootstrap, clock, args.relays, args.relay_batch, idempotent=args.broker == "apache"
        )
        sent = await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL")
        await pool.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()
        if kafka:
            kafka.stop()
        if postgres:
            postgres.stop()
        shutil.rmtree(home, ignore_errors=True)
    return {
        "broker": args.broker if kafka else "external",
        "schedules": args.schedules,
        "tenants": args.tenants,
        "targets": args.targets,
        "relays": args.relays,
        "relay_batch": args.relay_batch,
        "seed_s": round(seeded, 2),
        "materialize_s": round(materialized, 2),
        "materialize_rows_per_s": round(args.schedules / materialized),
        "dispatch_s": round(elapsed, 2),
        "dispatched": sent,
        "dispatch_rows_per_s": round(sent / elapsed),
        "lag_s": {k: round(v, 3) for k, v in lag_percentiles(marks).items()},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--targets", type=int, default=4)
    parser.add_argument("--relays", type=int, default=2, help="relay loops in this process")
    parser.add_argument("--relay-batch", type=int, default=5000)
    parser.add_argument("--materialize-batch", type=int, default=2000)
    parser.add_argument(
        "--broker",
        choices=BROKER_KINDS,
        default="tansu",
        help="the embedded broker (default tansu; apache needs java and `chronoq kafka fetch`)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    figures = asyncio.run(main(parser.parse_args()))
    print(json.dumps(figures, indent=2))
    if parser.parse_args().json:
        parser.parse_args().json.write_text(json.dumps(figures, indent=2))
    sys.exit(0)

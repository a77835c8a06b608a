"""Benchmark: an hour-top burst measured to the handler — consumer apps and the engine's attempt processor.

    python -m load_tests.consumer_burst [--occurrences 500000] [--consumer batch|single] [--processes 1]
                                        [--batch 500] [--concurrency 4] [--json PATH]

N occurrences due at one instant: their rows are in the engine database (ENQUEUED, as the relay leaves
them after publishing; ``--engine-state SCHEDULED`` for a relay that settles later) and their messages,
in the real wire format, are published at the burst instant by the relay's publisher. Consumer app
processes (no-op handler, real dedupe rows in their own database; batch or single handlers) apply them
and report every attempt; an engine process runs the attempt processor and the lease reaper. Printed:

* ``handler_start_p50/p95/p99/max`` — seconds from the burst instant (everything due) to the start of
  the handler call that received each occurrence;
* ``consumer_rows_per_s`` — occurrences applied per second by the consumer processes together, from
  the first handler start to the last one applied;
* ``attempt_events_per_s`` — attempt events the engine applied per second while it had any to apply;
* ``settle_s`` — from the burst instant until every occurrence is SUCCEEDED in the engine database;
* ``reaper_timeouts`` — attempts the reaper timed out (every attempt here is healthy: should be 0).

The last stdout line is one JSON object with those keys. :class:`ConsumerSide` is the same measurement
for a caller that publishes the burst itself (``load_tests/hour_top.py --consumer batch|single``):
``start()`` before the burst, ``settle(expected, due)`` after it, ``stop()``.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from load_tests import pg_statements
from load_tests.process_cpu import cpu_seconds, per_row
from load_tests.stack_for_load import add_pg_setting_option

ROOT = Path(__file__).resolve().parents[1]
TOP = datetime(2027, 1, 4, 9, 0, tzinfo=UTC)
FIGURE_KEYS = (
    "handler_start_p50",
    "handler_start_p95",
    "handler_start_p99",
    "consumer_rows_per_s",
    "attempt_events_per_s",
    "settle_s",
    "reaper_timeouts",
)


# -- worker processes -------------------------------------------------------------------------------


def _say(*words: object) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


async def consumer_worker(args: argparse.Namespace) -> None:
    """One consumer app process: a no-op handler that records when each occurrence reached it."""
    from consumers import ConsumerApp, ConsumerConfig, Occurrence

    starts = array.array("d")
    waits = _GrantWaits()
    app = ConsumerApp(
        ConsumerConfig(
            args.group,
            args.bootstrap,
            args.database_url,
            max_poll_records=args.max_poll_records,
            max_in_flight=max(args.concurrency, 1) * max(len(args.target_names), 1),
            lease_ttl=args.lease_ttl,
            session_timeout=args.session_timeout,
            heartbeat_interval=args.session_timeout / 5,
            state_catch_up_timeout=2.0,
            shutdown_grace=5.0,
        ),
        meter=waits.meter,
    )

    for target in args.target_names:
        if args.consumer == "batch":

            @app.handler(target, batch=args.batch, concurrency=args.concurrency)
            async def apply_batch(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
                now = time.time()
                starts.extend(now for _ in occurrences)
        else:

            @app.handler(target, concurrency=args.concurrency)
            async def apply_one(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
                starts.append(time.time())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    run = asyncio.create_task(app.run(stop))
    reported = -1
    busy = _BusyCpu()
    while not run.done():
        assigned = app.assigned_partitions
        if assigned != reported:
            _say("ASSIGNED", assigned)
            reported = assigned
        busy.saw(app.stats.applied)
        _say("APPLIED", app.stats.applied)
        await asyncio.wait({run}, timeout=0.25)
    run.result()
    Path(args.out).write_bytes(starts.tobytes())
    _say(
        "DONE",
        json.dumps(
            {
                "applied": app.stats.applied,
                "cpu_s": busy.cpu_s,
                "duplicates": app.stats.duplicates,
                "failures": app.stats.failures,
                "abandoned": app.stats.abandoned,
                "grant_timeouts": app.stats.grant_timeouts,
                "grants_asked_again": app.stats.grants_asked_again,
                "leases_lost": app.stats.leases_lost,
                "retried_in_place": app.stats.infrastructure_errors,
                "grant_wait_buckets": waits.buckets(),
            }
        ),
    )


class _GrantWaits:
    """The app's own ``chronoq.attempt_grant_wait`` histogram, read in process: how long deliveries waited for
    the engine's answer to ``started`` (how close they came to a lease ttl, and to the grant timeout)."""

    BOUNDS = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 60.0)

    def __init__(self) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

        from schemas import observability as obs

        self.name = obs.ATTEMPT_GRANT_WAIT
        self.reader = InMemoryMetricReader()
        view = View(instrument_name=self.name, aggregation=ExplicitBucketHistogramAggregation(self.BOUNDS))
        self.meter = MeterProvider(metric_readers=[self.reader], views=[view]).get_meter("consumer-burst")

    def buckets(self) -> dict[str, int]:
        """Waits (one per delivery or batch) by upper bound in seconds, ``inf`` for the rest."""
        from opentelemetry.sdk.metrics.export import HistogramDataPoint

        counts = [0] * (len(self.BOUNDS) + 1)
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != self.name:
                        continue
                    for point in metric.data.data_points:
                        if isinstance(point, HistogramDataPoint):
                            counts = [a + b for a, b in zip(counts, point.bucket_counts, strict=True)]
        return {f"{bound:g}": n for bound, n in zip((*self.BOUNDS, float("inf")), counts, strict=True)}


class _BusyCpu:
    """This process's CPU seconds from its first unit of work to its last (what the work cost, whatever the
    machine's load; the wall-clock rates depend on what else runs on it)."""

    def __init__(self) -> None:
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None

    def saw(self, count: int) -> None:
        if count > self.count:
            now = time.process_time()
            if self.first is None:
                self.first = now
            self.last, self.count = now, count

    @property
    def cpu_s(self) -> float | None:
        return round(self.last - self.first, 3) if self.first is not None and self.last is not None else None


async def engine_worker(args: argparse.Namespace) -> None:
    """The engine's attempt side: the attempt processor and the lease reaper, on the database clock."""
    from engine.loops.attempt_processor import AttemptProcessor, AttemptProcessorConfig
    from engine.loops.reaper import Reaper
    from schemas.connections import create_pool

    pool = await create_pool(args.database_url, min_size=2, max_size=6)
    processor = AttemptProcessor(
        pool,
        args.bootstrap,
        AttemptProcessorConfig(session_timeout=args.session_timeout, heartbeat_interval=args.session_timeout / 5),
    )
    reaper = Reaper(pool)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(processor.run(stop)), asyncio.create_task(reaper.run(stop))]
    first = last = None
    applied = 0
    ready = False
    busy = _BusyCpu()
    # The outcome hold (engine.rules.outcome_hold), sampled: its peak, and each stretch it held events
    # (seconds from the first event applied): when outcomes waited behind the starts, and when they were let go.
    held_max = 0
    holds: list[list[float]] = []
    while not all(t.done() for t in tasks):
        if not ready and processor.assigned_partitions:
            _say("READY")
            ready = True
        total = processor.events_applied
        busy.saw(total)
        held = processor.hold.held
        held_max = max(held_max, held)
        if first is not None and held and (not holds or len(holds[-1]) == 2):
            holds.append([round(time.time() - first, 2)])
        elif holds and not held and len(holds[-1]) == 1:
            holds[-1].append(round(time.time() - first, 2) if first else 0.0)
        if total > applied:
            now = time.time()
            first = first or now
            last, applied = now, total
        await asyncio.wait(tasks, timeout=0.05, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and task.exception():
                raise task.exception()  # type: ignore[misc]
    await pool.close()
    busy_s = (last - first) if first and last and last > first else None
    _say(
        "DONE",
        json.dumps(
            {
                "events": applied,
                "first": first,
                "last": last,
                "busy_s": busy_s,
                "cpu_s": busy.cpu_s,
                "verdicts": processor.stats.verdicts,
                "lease_timeouts": reaper.stats.retries + reaper.stats.dead,
                "held_max": held_max,
                "holds": holds,
            }
        ),
    )


# -- the orchestrating side -------------------------------------------------------------------------


class Worker:
    """A worker process, read line by line."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, log: Path) -> None:
        self.name, self.process, self.log = name, process, log
        self.last: dict[str, list[str]] = {}
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, name: str, log: Path, *args: str) -> Worker:
        with log.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "load_tests.consumer_burst",
                *args,
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return cls(name, process, log)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while True:
            raw = await self.process.stdout.readline()
            if not raw:
                return
            words = raw.decode().strip().split(" ", 1)
            self.last[words[0]] = words[1:]

    def value(self, key: str) -> str | None:
        words = self.last.get(key)
        return words[0] if words else None

    def check_alive(self) -> None:
        if self.process.returncode is not None and "DONE" not in self.last:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")

    async def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(self.process.wait(), timeout)
        await self.reader
        if "DONE" not in self.last:
            raise RuntimeError(f"{self.name} ended without a report:\n{self.log.read_text()[-3000:]}")
        return json.loads(self.last["DONE"][0])


@dataclass
class ConsumerSide:
    """Consumer app processes and the engine's attempt side, for a burst someone else publishes.

    bootstrap / engine_url / consumer_url: the broker, the engine database, the consumer apps' database.
    targets: the targets whose topics the burst fills. consumer: ``batch`` or ``single`` handlers.
    processes: consumer app processes in the group. batch: occurrences per handler call (batch mode).
    concurrency: handler calls in flight per target and process. run_engine: also run the attempt
    processor and the reaper here (False if the caller runs them). engine_after_consumers: start them only once
    the consumers applied everything, so each side is measured alone (the processor on the whole backlog of
    attempt events; settle_s then includes the engine's start).
    """

    bootstrap: str
    engine_url: str
    consumer_url: str
    targets: list[str]
    consumer: str = "batch"
    processes: int = 1
    batch: int = 500
    concurrency: int = 4
    partitions: int = 8
    lease_ttl: float = 30.0
    session_timeout: float = 6.0
    run_engine: bool = True
    engine_after_consumers: bool = False
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="chronoq-consumer-burst-")))
    consumers: list[Worker] = field(default_factory=list)
    engine: Worker | None = None

    async def start(self, timeout: float = 120.0) -> None:
        """Start every process and wait until the group owns every partition (no join inside the burst)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        group = f"burst-{uuid.uuid4().hex[:8]}"
        common = ["--bootstrap", self.bootstrap, "--session-timeout", str(self.session_timeout)]
        if self.run_engine and not self.engine_after_consumers:
            await self._start_engine()
        for n in range(self.processes):
            self.consumers.append(
                await Worker.start(
                    f"consumer-{n}",
                    self.work_dir / f"consumer-{n}.log",
                    "--role",
                    "consumer",
                    *common,
                    "--database-url",
                    self.consumer_url,
                    "--group",
                    group,
                    "--target-names",
                    *self.targets,
                    "--consumer",
                    self.consumer,
                    "--batch",
                    str(self.batch),
                    "--concurrency",
                    str(self.concurrency),
                    "--lease-ttl",
                    str(self.lease_ttl),
                    "--max-poll-records",
                    str(max(self.batch * 2, 1000)),
                    "--out",
                    str(self.work_dir / f"starts-{n}.bin"),
                )
            )
        wanted = self.partitions * len(self.targets)
        deadline = time.monotonic() + timeout
        stable_since = None
        while True:
            for worker in self._workers():
                worker.check_alive()
            assigned = sum(int(w.value("ASSIGNED") or 0) for w in self.consumers)
            ready = assigned == wanted and (self.engine is None or "READY" in self.engine.last)
            if ready:
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since > 2 * self.session_timeout / 5 + 1:
                    return
            else:
                stable_since = None
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumers own {assigned} of {wanted} partitions after {timeout} s")
            await asyncio.sleep(0.1)

    async def _start_engine(self) -> None:
        self.engine = await Worker.start(
            "engine",
            self.work_dir / "engine.log",
            "--role",
            "engine",
            "--database-url",
            self.engine_url,
            "--bootstrap",
            self.bootstrap,
            "--session-timeout",
            str(self.session_timeout),
        )

    def _workers(self) -> list[Worker]:
        return self.consumers + ([self.engine] if self.engine else [])

    def stack_cpu(self) -> dict[str, float]:
        """CPU seconds so far of every part of the stack: the consumer apps, the engine process, PostgreSQL
        (both databases: one server), the broker and this process (``load_tests.process_cpu``)."""
        pids = {
            "consumer": [w.process.pid for w in self.consumers],
            "engine": [self.engine.process.pid] if self.engine else [],
        }
        return cpu_seconds(pids, self.bootstrap, self.engine_url)

    def applied(self) -> int:
        return sum(int(w.value("APPLIED") or 0) for w in self.consumers)

    async def settle(
        self,
        expected: int,
        due: float,
        engine_pool: asyncpg.Pool,
        timeout: float = 1800.0,
        scheduled_for: datetime | None = None,
        cpu_before: dict[str, float] | None = None,
    ) -> dict:
        """Wait until ``expected`` occurrences are applied and SUCCEEDED in the engine; return the figures.

        due: the burst instant (``time.time()`` when everything became due). scheduled_for: count only the
        occurrences of this instant as open (the database holds others), instead of every occurrence.
        cpu_before: a :meth:`stack_cpu` reading at ``due``: the figures then split the whole stack's CPU
        until everything settled per occurrence and part (``burst_cpu_us_per_occurrence``).
        """
        deadline = time.monotonic() + timeout
        settled_at = applied_at = None
        cpu_after: dict[str, float] | None = None
        while settled_at is None:
            for worker in self._workers():
                worker.check_alive()
            if self.applied() >= expected and applied_at is None:
                applied_at = time.time()
                if self.run_engine and self.engine is None:
                    await self._start_engine()
            if applied_at is not None:
                open_rows = await engine_pool.fetchval(
                    "SELECT count(*) FROM occurrences WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')"
                    " AND ($1::timestamptz IS NULL OR scheduled_for = $1)",
                    scheduled_for,
                )
                if open_rows == 0:
                    settled_at = time.time()
                    cpu_after = self.stack_cpu() if cpu_before is not None else None
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.applied()} of {expected} applied after {timeout} s")
            await asyncio.sleep(0.25)
        reports = [await w.finish() for w in self.consumers]
        engine_report = await self.engine.finish() if self.engine else {}
        starts = array.array("d")
        for n in range(self.processes):
            starts.frombytes((self.work_dir / f"starts-{n}.bin").read_bytes())
        lags = sorted(t - due for t in starts)
        timed_out = await engine_pool.fetchval("SELECT count(*) FROM attempts WHERE result = 'timed_out'")
        figures: dict[str, Any] = dict(
            zip(("handler_start_p50", "handler_start_p95", "handler_start_p99"), _percentiles(lags), strict=True)
        )
        first = min(starts) if starts else due
        last = max(starts) if starts else due
        figures.update(
            {
                "handler_start_max": round(lags[-1], 3) if lags else None,
                "consumer_rows_per_s": round(len(starts) / (last - first)) if last > first else None,
                "consumer_cpu_us_per_occurrence": _per(sum(r.get("cpu_s") or 0 for r in reports), len(starts)),
                "engine_cpu_us_per_event": _per(engine_report.get("cpu_s"), engine_report.get("events")),
                "attempt_events_per_s": (
                    round(engine_report["events"] / engine_report["busy_s"]) if engine_report.get("busy_s") else None
                ),
                "settle_s": round(settled_at - due, 2),
                "applied_s": round((applied_at or settled_at) - due, 2),
                "reaper_timeouts": timed_out,
                "applied": sum(r["applied"] for r in reports),
                "handler_calls_recorded": len(starts),
                "duplicates": sum(r["duplicates"] for r in reports),
                # Why deliveries went round again: no answer after asking three times, leases run out by
                # the worker's clock, and every infrastructure error retried in place (those included);
                # and how often an answer later than the grant timeout was asked for again.
                "grant_timeouts": sum(r.get("grant_timeouts", 0) for r in reports),
                "grants_asked_again": sum(r.get("grants_asked_again", 0) for r in reports),
                "leases_lost": sum(r.get("leases_lost", 0) for r in reports),
                "retried_in_place": sum(r.get("retried_in_place", 0) for r in reports),
                "grant_wait_buckets": _summed([r.get("grant_wait_buckets") or {} for r in reports]),
                "attempt_events": engine_report.get("events"),
                "attempt_verdicts": engine_report.get("verdicts"),
                # Outcomes held behind starts: the most at once, and each stretch (s after the first event).
                "outcomes_held_max": engine_report.get("held_max"),
                "outcome_holds": engine_report.get("holds"),
            }
        )
        if cpu_before is not None and cpu_after is not None:
            # Every part shares the two cores: the split says which part to make cheaper.
            split = per_row(cpu_before, cpu_after, expected)
            figures["burst_cpu_us_per_occurrence"] = split | {"total": round(sum(split.values()), 1)}
            used = sum(cpu_after.values()) - sum(cpu_before.values())
            figures["cores_busy"] = round(used / max(settled_at - due, 1e-9), 2)
        return figures

    async def stop(self) -> None:
        for worker in self._workers():
            if worker.process.returncode is None:
                worker.process.kill()
                await worker.process.wait()


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for key, n in one.items():
            total[key] = total.get(key, 0) + n
    return total


def _per(cpu_s: float | None, count: int | None) -> float | None:
    """Microseconds of CPU per unit of work."""
    return round(cpu_s * 1e6 / count, 1) if cpu_s and count else None


def _percentiles(values: list[float]) -> tuple[float | None, ...]:
    if len(values) < 2:
        return (None, None, None)
    q = statistics.quantiles(values, n=100, method="inclusive")
    return (round(q[49], 3), round(q[94], 3), round(q[98], 3))


async def seed(pool: asyncpg.Pool, occurrences: int, tenants: int, targets: int, state: str) -> None:
    """Schedules with one due occurrence each at TOP, published (ENQUEUED) or not yet settled (SCHEDULED)."""
    await pool.execute(
        """
        INSERT INTO schedules (schedule_id, tenant_id, kind, expression, time_zone, next_run_at, target, payload,
                               shard)
        SELECT gen_random_uuid(), 'load-' || (i % $2), 'cron', '0 * * * *', 'UTC', $4::timestamptz + interval '1 hour',
               'load.target-' || (i % $3), jsonb_build_object('n', i), i % 256
        FROM generate_series(1, $1) AS i
        """,
        occurrences,
        tenants,
        targets,
        TOP,
    )
    await pool.execute(
        """
        INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
                                 available_at, state, enqueued_at)
        SELECT gen_random_uuid(), schedule_id, 1, tenant_id, target, $1::timestamptz, $1::timestamptz, $2::text,
               CASE WHEN $2::text = 'ENQUEUED' THEN $1::timestamptz END
        FROM schedules
        """,
        TOP,
        state,
    )
    await pool.execute("VACUUM ANALYZE")


async def encoded_burst(pool: asyncpg.Pool) -> list[Any]:
    """Every occurrence's message in the wire format, as the relay publishes it (pre-encoded)."""
    from relay.publisher import OutgoingRecord
    from schemas.messages import OccurrenceMessage
    from schemas.topics import occurrence_topic, schedule_key

    rows = await pool.fetch(
        "SELECT o.occurrence_id, o.schedule_id, o.tenant_id, o.target, s.payload"
        " FROM occurrences o JOIN schedules s USING (schedule_id)"
    )
    return [
        OutgoingRecord(
            n,
            occurrence_topic(r["target"]),
            schedule_key(r["schedule_id"]),
            OccurrenceMessage(
                r["occurrence_id"], r["schedule_id"], 1, r["tenant_id"], r["target"], TOP, TOP, payload=r["payload"]
            ).encode(),
        )
        for n, r in enumerate(rows)
    ]


async def main(args: argparse.Namespace) -> dict:
    from engine.cli.embedded import EmbeddedKafka, EmbeddedPostgres
    from relay.publisher import KafkaPublisher, PublisherConfig
    from schemas.connections import create_pool
    from schemas.migrations import apply_migrations
    from schemas.topics import ATTEMPTS_TOPIC, create_missing_topics

    home = Path(tempfile.mkdtemp(prefix="chronoq-consumer-burst-"))
    postgres = kafka = None
    admin_url = os.environ.get("CHRONOQ_DATABASE_URL")
    bootstrap = os.environ.get("CHRONOQ_KAFKA_BOOTSTRAP")
    if not (admin_url and bootstrap):
        postgres = EmbeddedPostgres(home / "postgres", dict(args.pg_setting))
        kafka = EmbeddedKafka(home / "kafka.log")
        postgres.start()
        if args.pg_statements:
            await pg_statements.preload(postgres)
        bootstrap = kafka.start()
        admin_url = postgres.url("postgres")
    suffix = uuid.uuid4().hex[:8]
    admin = await asyncpg.connect(admin_url)
    shared_buffers = await admin.fetchval("SHOW shared_buffers")  # the run's cache: figures depend on it
    names = {"engine": f"burst_engine_{suffix}", "consumer": f"burst_consumer_{suffix}"}
    for name in names.values():
        await admin.execute(f'CREATE DATABASE "{name}"')
    urls = {k: urlunsplit(urlsplit(admin_url)._replace(path=f"/{v}")) for k, v in names.items()}
    side = None
    try:
        pool = await create_pool(urls["engine"], min_size=1, max_size=4)
        async with pool.acquire() as conn:
            await apply_migrations(conn, "engine")
        t = time.perf_counter()
        await seed(pool, args.occurrences, args.tenants, args.targets, args.engine_state)
        records = await encoded_burst(pool)
        prepared_s = time.perf_counter() - t
        publisher = KafkaPublisher(PublisherConfig(bootstrap, partitions=args.partitions))
        await publisher.start()
        await publisher.ensure_topics({r.topic for r in records})
        await create_missing_topics(bootstrap, [ATTEMPTS_TOPIC], args.partitions)
        targets = sorted({r.topic.removeprefix("chronoq.occurrences.") for r in records})
        side = ConsumerSide(
            bootstrap,
            urls["engine"],
            urls["consumer"],
            targets,
            args.consumer,
            args.processes,
            args.batch,
            args.concurrency,
            args.partitions,
            args.lease_ttl,
            engine_after_consumers=args.engine_after_consumers,
            work_dir=home / "workers",
        )
        await side.start()
        if args.pg_statements:
            await pg_statements.reset(admin)
        cpu_before = side.stack_cpu()
        due = time.time()
        for start in range(0, len(records), args.publish_chunk):
            failed = [e for e in (await publisher.publish(records[start : start + args.publish_chunk])).values() if e]
            if failed:
                raise RuntimeError(f"{len(failed)} records not acknowledged: {failed[0]!r}")
        published_s = time.time() - due
        await publisher.stop()
        figures = await side.settle(args.occurrences, due, pool, cpu_before=cpu_before)
        if args.pg_statements:
            figures["pg_statements"] = await pg_statements.top(admin, args.pg_statements, list(names.values()))
        await pool.close()
    finally:
        if side:
            await side.stop()
        for name in names.values():
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        if kafka:
            kafka.stop()
        if postgres:
            postgres.stop()
            shutil.rmtree(home, ignore_errors=True)  # a 500,000 run leaves about 1 GB of data files
    return {
        "occurrences": args.occurrences,
        "consumer": args.consumer,
        "processes": args.processes,
        "batch": args.batch if args.consumer == "batch" else 1,
        "concurrency": args.concurrency,
        "targets": args.targets,
        "engine_state": args.engine_state,
        "pg_shared_buffers": shared_buffers,
        "prepare_s": round(prepared_s, 1),
        "publish_s": round(published_s, 2),
        **figures,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--occurrences", type=int, default=500_000)
    parser.add_argument("--consumer", choices=("batch", "single"), default="batch")
    parser.add_argument("--processes", type=int, default=1, help="consumer app processes in the group")
    parser.add_argument("--batch", type=int, default=500, help="occurrences per batch handler call")
    parser.add_argument("--concurrency", type=int, default=4, help="handler calls in flight per target and process")
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--targets", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    parser.add_argument("--engine-state", choices=("ENQUEUED", "SCHEDULED"), default="ENQUEUED")
    parser.add_argument(
        "--engine-after-consumers",
        action="store_true",
        help="start the attempt processor once the consumers are done: each side measured alone",
    )
    parser.add_argument("--publish-chunk", type=int, default=20_000)
    parser.add_argument(
        "--pg-statements",
        type=int,
        default=0,
        metavar="N",
        help="report the N statements that took PostgreSQL the most time during the burst (pg_stat_statements;"
        " preloaded on the embedded server, an external one must preload it)",
    )
    add_pg_setting_option(parser)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    # Worker processes (started by the benchmark itself).
    parser.add_argument("--role", choices=("main", "consumer", "engine"), default="main", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--session-timeout", type=float, default=6.0, help=argparse.SUPPRESS)
    parser.add_argument("--max-poll-records", type=int, default=1000, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--target-names", nargs="+", default=[], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_worker(args: argparse.Namespace) -> None:
    """A worker process; CHRONOQ_BURST_PROFILE=DIR writes its cProfile statistics there.

    The collector is set as the production entry points set it (``chronoq consume``, ``run_services``:
    ``schemas/garbage_collection.py``), so the benchmark measures the processes users run."""
    from schemas.garbage_collection import freeze_start_up_heap, tune_for_throughput

    tune_for_throughput()
    freeze_start_up_heap()
    work = consumer_worker(args) if args.role == "consumer" else engine_worker(args)
    folder = os.environ.get("CHRONOQ_BURST_PROFILE")
    if not folder:
        asyncio.run(work)
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        asyncio.run(work)
    finally:
        profile.disable()
        profile.dump_stats(str(Path(folder) / f"{args.role}-{os.getpid()}.prof"))


if __name__ == "__main__":
    arguments = parse()
    if arguments.role in ("consumer", "engine"):
        run_worker(arguments)
    else:
        result = asyncio.run(main(arguments))
        if arguments.json:
            arguments.json.write_text(json.dumps(result, indent=2))
        print(json.dumps(result))

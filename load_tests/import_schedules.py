"""Benchmark: importing N schedules through the HTTP API's batch create, then importing them again.

    python -m load_tests.import_schedules [--schedules 100000] [--batch 1000] [--clients 2] [--json PATH]

Starts PostgreSQL (embedded, or CHRONOQ_DATABASE_URL's server), a fresh engine
database and a ``chronoq api`` process, creates a tenant whose quotas fit N
schedules, and POSTs ``/v1/schedules/batch`` requests of ``--batch`` items
(each with its own idempotency key) from ``--clients`` keep-alive
connections. The schedules are a mix of daily and hourly cron in several
zones and rates. Then it imports the same items again: every item must come
back 200 (replayed) and the schedule count must not change. Prints seconds,
schedules/s and the per-request latency of both passes.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import orjson

from engine.cli.embedded import EmbeddedPostgres
from engine.control.quotas import TenantQuotas
from engine.control.tenants import create_tenant
from schemas.connections import create_pool
from schemas.migrations import apply_migrations

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney")


def schedule(i: int) -> dict:
    if i % 5 == 4:
        return {"kind": "rate", "expression": f"{5 + i % 55}m", "target": f"import.t{i % 8}", "payload": {"n": i}}
    expression = f"{i % 60} {i % 24} * * *" if i % 2 else f"{i % 60} * * * MON-FRI"
    return {
        "kind": "cron",
        "expression": expression,
        "time_zone": ZONES[i % len(ZONES)],
        "target": f"import.t{i % 8}",
        "payload": {"n": i, "customer": f"c-{i:07d}"},
    }


def batches(count: int, size: int) -> list[bytes]:
    return [
        orjson.dumps(
            {
                "items": [
                    {"idempotency_key": f"import-{i}", "schedule": schedule(i)}
                    for i in range(start, min(start + size, count))
                ]
            }
        )
        for start in range(0, count, size)
    ]


def post_all(api: str, token: str, bodies: list[bytes], clients: int) -> tuple[float, list[float], dict[str, int]]:
    """POST every body from ``clients`` threads; return (seconds, request latencies, item statuses)."""
    parts = urlsplit(api)
    pending = list(reversed(range(len(bodies))))
    lock = threading.Lock()
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    failures: list[str] = []

    def worker() -> None:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while True:
            with lock:
                if not pending:
                    break
                index = pending.pop()
            started = time.perf_counter()
            conn.request("POST", "/v1/schedules/batch", body=bodies[index], headers=headers)
            response = conn.getresponse()
            payload = response.read()
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed)
                if response.status != 200:
                    failures.append(f"{response.status}: {payload[:300]!r}")
                    continue
                for status, n in orjson.loads(payload)["statuses"].items():
                    statuses[status] = statuses.get(status, 0) + n
        conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{len(failures)} requests failed, first: {failures[0]}")
    return time.perf_counter() - started, latencies, statuses


def summary(seconds: float, latencies: list[float], statuses: dict[str, int], count: int) -> dict:
    ordered = sorted(latencies)
    return {
        "seconds": round(seconds, 2),
        "schedules_per_s": round(count / seconds),
        "statuses": statuses,
        "request_s": {
            "p50": round(statistics.median(ordered), 3),
            "p99": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 3),
            "max": round(ordered[-1], 3),
        },
    }


def start_api(database_url: str) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")}
    env["CHRONOQ_DATABASE_URL"] = database_url
    api = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "api", "--api-port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert api.stdout is not None
    line = api.stdout.readline()
    if "http://" not in line:
        api.kill()
        raise SystemExit(f"chronoq api did not start: {line}{api.stdout.read()}")
    return api, line.strip().rsplit(" ", 1)[1]


async def main(args: argparse.Namespace) -> dict:
    home = Path(tempfile.mkdtemp(prefix="chronoq-import-"))
    postgres = None
    admin_url = os.environ.get("CHRONOQ_DATABASE_URL")
    if not admin_url:
        postgres = EmbeddedPostgres(home / "postgres")
        postgres.start()
        admin_url = await postgres.ensure_database("imports")
    database = f"import_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{database}"')
    url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{database}"))
    api = None
    try:
        pool = await create_pool(url, min_size=1, max_size=2)
        async with pool.acquire() as conn:
            await apply_migrations(conn, "engine")
        tenant = await create_tenant(
            pool, "bulk", TenantQuotas(max_active_schedules=args.schedules * 2, max_fires_per_minute=1e9)
        )
        bodies = batches(args.schedules, args.batch)
        api, api_url = start_api(url)
        first = summary(*post_all(api_url, tenant.api_token, bodies, args.clients), args.schedules)
        stored_first = await pool.fetchval("SELECT count(*) FROM schedules")
        again = summary(*post_all(api_url, tenant.api_token, bodies, args.clients), args.schedules)
        stored_again = await pool.fetchval("SELECT count(*) FROM schedules")
        versions = await pool.fetchval("SELECT count(*) FROM schedule_versions")
        await pool.close()
    finally:
        if api is not None:
            api.terminate()
            api.wait(30)
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()
        if postgres:
            postgres.stop()
    if stored_again != stored_first or first["statuses"].get("201") != args.schedules:
        raise SystemExit(f"import is not idempotent: {first} then {again}, {stored_first} -> {stored_again}")
    return {
        "schedules": args.schedules,
        "batch": args.batch,
        "clients": args.clients,
        "import": first,
        "import_again": again,
        "stored": stored_again,
        "versions": versions,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=2, help="concurrent keep-alive connections")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    arguments = parser.parse_args()
    figures = asyncio.run(main(arguments))
    print(json.dumps(figures, indent=2))
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2))

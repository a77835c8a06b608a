"""schemathesis against a real `chronoq api` with a real budget: no response may be a 5xx.

    python -m load_tests.api_fuzz [--examples 500] [--json PATH]

On the embedded stack (or CHRONOQ_DATABASE_URL / CHRONOQ_KAFKA_BOOTSTRAP): a
fresh engine database, a tenant with quotas large enough for the run, and a
`chronoq api` process on a free port. Then the schemathesis CLI runs every
phase — the schema's examples, coverage, fuzzing (positive and negative
generation, ``--examples`` per operation) and stateful scenarios along the
document's links — with the ``not_a_server_error`` check. Schedule paths
point at schedules created for the run four times in five
(``load_tests/api_fuzz_hooks.py``), so that the bodies of PATCH, pause,
resume, trigger and backfill are judged against live schedules instead of
being answered 404 before they are read; occurrence paths point at DEAD
occurrences planted for the run, so replay meets dead letters. The figures: the number of requests
per operation and status class, and every 5xx (the run fails, exit 1, if
there is one, and also if schemathesis reports an error of its own: an
operation it could not fuzz). schemathesis's own warnings (e.g. "most generated inputs are
rejected") are printed as it gives them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from engine.cli.embedded import EmbeddedKafka, EmbeddedPostgres
from engine.control.quotas import TenantQuotas
from engine.control.requested_occurrences import RequestedOccurrences
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from schemas.connections import create_pool
from schemas.migrations import apply_migrations

ROOT = Path(__file__).resolve().parents[1]
HOOKS = Path(__file__).with_name("api_fuzz_hooks.py")
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


def summarize(ndjson: Path) -> dict[str, Any]:
    """Per operation: requests by status class, and how many generated-valid (positive) requests were
    accepted; plus every 5xx, and every error of the tool itself (schemathesis's NonFatalError: a hook or
    a generator that raised, so the operation was not fuzzed). Read from schemathesis's event stream (one
    ScenarioFinished per scenario)."""
    statuses: dict[str, Counter[str]] = defaultdict(Counter)
    positive: dict[str, Counter[str]] = defaultdict(Counter)
    server_errors: list[str] = []
    tool_errors: list[str] = []
    for line in ndjson.read_text().splitlines():
        event = json.loads(line)
        error = event.get("NonFatalError")
        if error is not None:
            value = error.get("value") or {}
            where = f"{error.get('label')} ({error.get('phase')})"
            tool_errors.append(f"{where}: {value.get('type')}: {value.get('message')}")
        finished = event.get("ScenarioFinished")
        recorder = (finished or {}).get("recorder") or {}
        for case_id, interaction in (recorder.get("interactions") or {}).items():
            case = (recorder.get("cases") or {}).get(case_id, {}).get("value", {})
            response = interaction.get("response") or {}
            status = response.get("status_code")
            if status is None:
                continue
            label = f"{case.get('method')} {case.get('path')}"
            statuses[label][f"{status // 100}xx"] += 1
            if case.get("meta", {}).get("generation", {}).get("mode") == "positive":
                positive[label]["accepted" if status < 300 else str(status)] += 1
            if status >= 500:
                body = base64.b64decode((response.get("content") or {}).get("$base64", "")).decode("utf-8", "replace")
                server_errors.append(f"{label} -> {status}: {body[:200]}")
    return {
        "requests": {label: dict(counts) for label, counts in sorted(statuses.items())},
        "positive_outcomes": {label: dict(counts) for label, counts in sorted(positive.items())},
        "total_requests": sum(sum(c.values()) for c in statuses.values()),
        "server_errors": server_errors,
        "tool_errors": tool_errors,
    }


#: Definitions the existing schedules are made of: every kind, and the policies a change or a pause acts on.
FUZZ_DEFINITIONS: tuple[dict[str, Any], ...] = (
    {"kind": "cron", "expression": "0 9 * * 1-5", "time_zone": "Europe/Berlin", "target": "fuzz.cron"},
    {"kind": "cron", "expression": "*/5 * * * *", "target": "fuzz.every5", "misfire_policy": "catch_up:3"},
    {"kind": "rate", "expression": "90s", "target": "fuzz.rate", "overlap_policy": "skip_if_running"},
    {"kind": "rate", "expression": "1h", "target": "fuzz.hourly", "priority": "flexible", "flexible_window": "10m"},
    {"kind": "once", "expression": "2127-03-01T09:00:00Z", "target": "fuzz.once"},
)


async def existing_schedules(pool: asyncpg.Pool, count: int) -> tuple[list[str], list[str]]:
    """``count`` schedules of the fuzz tenant for every operation on a schedule but cancel, and half as many
    for cancel (``load_tests/api_fuzz_hooks.py`` points generated paths at them)."""
    control = ControlPlane(pool)
    made = [
        str((await control.create_schedule("fuzz", FUZZ_DEFINITIONS[n % len(FUZZ_DEFINITIONS)]))["schedule_id"])
        for n in range(count + count // 2)
    ]
    return made[:count], made[count:]


async def dead_occurrences(pool: asyncpg.Pool, schedule_ids: list[str]) -> list[str]:
    """One DEAD occurrence for each of ``schedule_ids`` (a manual run whose attempt failed for good, as the
    attempt processor leaves it), so occurrence reads and replay meet dead letters that exist."""
    requested = RequestedOccurrences(pool)
    made = [
        (await requested.trigger_now("fuzz", schedule_id, "tenant:fuzz"))["occurrence_id"]
        for schedule_id in schedule_ids
    ]
    await pool.execute(
        "UPDATE occurrences SET state = 'DEAD', dead_reason = 'permanent_error', attempt_count = 1,"
        " finished_at = now(), last_error_class = 'FuzzError', last_error_message = 'planted'"
        " WHERE occurrence_id = ANY($1::uuid[])",
        made,
    )
    return made


async def run(args: argparse.Namespace, admin_url: str, bootstrap: str) -> dict:
    database = f"apifuzz_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{database}"')
    url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{database}"))
    out = Path(tempfile.mkdtemp(prefix="chronoq-api-fuzz-"))
    try:
        pool = await create_pool(url, min_size=1, max_size=2)
        async with pool.acquire() as conn:
            await apply_migrations(conn, "engine")
        token = (
            await create_tenant(pool, "fuzz", TenantQuotas(max_active_schedules=10_000_000, max_fires_per_minute=1e15))
        ).api_token
        live, doomed = await existing_schedules(pool, args.live_schedules)
        dead = await dead_occurrences(pool, live[: len(doomed)])
        await pool.close()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")}
        env.update(CHRONOQ_DATABASE_URL=url, CHRONOQ_KAFKA_BOOTSTRAP=bootstrap)
        api = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "api", "--api-port", "0"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            line = await asyncio.to_thread(api.stdout.readline)  # type: ignore[union-attr]
            base = line.split(" on ", 1)[1].strip()
            command = [
                str(SCHEMATHESIS),
                "run",
                f"{base}/openapi.json",
                "-H",
                f"Authorization: Bearer {token}",
                "--max-examples",
                str(args.examples),
                "--checks",
                "not_a_server_error",
                "--mode",
                "all",
                "--phases",
                args.phases,
                "--workers",
                "1",
                "--suppress-health-check",
                "all",
                "--report",
                "ndjson",
                "--report-ndjson-path",
                str(out / "events.ndjson"),
                "--no-color",
            ]
            if args.seed is not None:
                command += ["--seed", str(args.seed)]
            fuzz_env = dict(
                os.environ,
                SCHEMATHESIS_HOOKS=str(HOOKS),
                CHRONOQ_FUZZ_LIVE=",".join(live),
                CHRONOQ_FUZZ_DOOMED=",".join(doomed),
                CHRONOQ_FUZZ_DEAD=",".join(dead),
            )
            finished = await asyncio.to_thread(
                subprocess.run, command, cwd=out, capture_output=True, text=True, env=fuzz_env
            )
        finally:
            api.terminate()
            await asyncio.to_thread(api.wait, 30)
        print(finished.stdout[-6000:])
        figures = summarize(out / "events.ndjson") if (out / "events.ndjson").exists() else {}
        shutil.rmtree(out, ignore_errors=True)
        return {"examples_per_operation": args.examples, "schemathesis_exit": finished.returncode, **figures}
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()


async def main(args: argparse.Namespace) -> dict:
    admin_url = os.environ.get("CHRONOQ_DATABASE_URL")
    bootstrap = os.environ.get("CHRONOQ_KAFKA_BOOTSTRAP")
    if admin_url and bootstrap:
        return await run(args, admin_url, bootstrap)
    home = Path(tempfile.mkdtemp(prefix="chronoq-api-fuzz-stack-"))
    postgres, kafka = EmbeddedPostgres(home / "postgres"), EmbeddedKafka(home / "kafka.log")
    postgres.start()
    try:
        bootstrap = kafka.start()
        try:
            return await run(args, await postgres.ensure_database("apifuzz"), bootstrap)
        finally:
            kafka.stop()
    finally:
        postgres.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=500, help="examples per operation and phase")
    parser.add_argument("--seed", type=int, help="schemathesis seed (reproducible runs)")
    parser.add_argument(
        "--phases",
        default="examples,coverage,fuzzing,stateful",
        help="schemathesis phases (coverage alone takes tens of minutes on two cores)",
    )
    parser.add_argument(
        "--live-schedules",
        type=int,
        default=200,
        help="existing schedules that generated schedule paths point at (0: random ids only)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    arguments = parser.parse_args()
    figures = asyncio.run(main(arguments))
    print(json.dumps({k: v for k, v in figures.items() if k not in ("server_errors", "tool_errors")}, indent=2))
    for error in figures.get("server_errors", [])[:50]:
        print("5xx:", error)
    for error in figures.get("tool_errors", [])[:50]:
        print("not fuzzed:", error)
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2))
    clean = figures.get("total_requests") and not figures.get("server_errors") and not figures.get("tool_errors")
    sys.exit(0 if clean else 1)

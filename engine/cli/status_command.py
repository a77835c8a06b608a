"""``chronoq status``: where this command's configuration points, whether the database and Kafka answer,
and what the engine is doing right now (read-only).

It prints the database URL without its password and the Kafka bootstrap with
its security (protocol, SASL mechanism and user, CA and certificate files;
never the password), then connects to each. A refused credential or
certificate is reported at once with what to fix (``KafkaSecurityError``),
not retried. When the database answers, the engine's status follows (nodes
and shards, backlogs, relay rates, attempts, DLQ, last reconcile; consumer
lag per group when Kafka answers too). Exit status 0 when everything
configured answers, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from engine.cli import print_json
from engine.cli.endpoints import kafka_security_setting, redacted_url, resolve_database_url, resolve_kafka
from engine.cli.stack_commands import DEFAULT_HORIZON
from engine.control.status import engine_status, status_lines
from engine.rules.timing import parse_duration
from schemas.connections import create_pool
from schemas.error_classification import DATABASE_ERRORS
from schemas.errors import ChronoqError, StackError
from schemas.kafka_security import KafkaSecurity, start_client

#: Seconds each check may take before it counts as unreachable.
CHECK_TIMEOUT = 10.0


async def check_database(url: str) -> str | None:
    """None when the database answers ``SELECT 1``, else why not (without the URL: it may hold a password)."""
    try:
        conn = await asyncpg.connect(url, timeout=CHECK_TIMEOUT)
    except DATABASE_ERRORS as err:
        return f"{type(err).__name__}: {err}"
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()
    return None


async def check_kafka(bootstrap: str, security: KafkaSecurity) -> str | None:
    """None when the broker answers a metadata request through the configured security, else why not."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(CHECK_TIMEOUT * 1000), **security.client_options()
    )
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):  # not wait_for: it can swallow a cancellation (3.11)
            await start_client(admin, bootstrap, security)
        async with asyncio.timeout(CHECK_TIMEOUT):
            await admin.list_topics()
    except ChronoqError as err:
        return str(err)
    except Exception as err:  # noqa: BLE001 - any failure is the answer to "does Kafka answer?"
        return f"{type(err).__name__}: {err}"
    finally:
        await admin.close()
    return None


def _kafka() -> tuple[str | None, KafkaSecurity]:
    """The broker and its security, if one is configured (an external one, or the running stack's)."""
    try:
        return resolve_kafka()
    except StackError:
        return None, kafka_security_setting()


async def _report(horizon_text: str) -> dict[str, Any]:
    horizon = parse_duration(horizon_text, "horizon")
    database_url = resolve_database_url()
    bootstrap, security = _kafka()
    database_problem = await check_database(database_url)
    kafka_problem = await check_kafka(bootstrap, security) if bootstrap else None
    report: dict[str, Any] = {
        "database": {"url": redacted_url(database_url), "ok": database_problem is None},
        "kafka": {"bootstrap": bootstrap, "security": security.describe(), "ok": bool(bootstrap) and not kafka_problem},
    }
    if database_problem:
        report["database"]["problem"] = database_problem
    if kafka_problem:
        report["kafka"]["problem"] = kafka_problem
    elif not bootstrap:
        report["kafka"]["problem"] = "no broker configured"
    if database_problem is None:
        pool = await create_pool(database_url, min_size=1, max_size=1)
        try:
            report.update(
                await engine_status(pool, None if kafka_problem else bootstrap, horizon=horizon, security=security)
            )
        finally:
            await pool.close()
    return report


def cmd_status(args: argparse.Namespace) -> int:
    report = asyncio.run(_report(args.horizon))
    if args.json:
        print_json(report, True)
    else:
        database, kafka = report["database"], report["kafka"]
        print(f"{'database:':10} {database['url']}  {'ok' if database['ok'] else 'FAILED: ' + database['problem']}")
        where = f"{kafka['bootstrap']}  ({kafka['security']})" if kafka["bootstrap"] else "-"
        print(f"{'kafka:':10} {where}  {'ok' if kafka['ok'] else kafka['problem']}", flush=True)
        if "as_of" in report:
            print("\n".join(status_lines(report)), flush=True)
    broker_failed = report["kafka"]["bootstrap"] is not None and not report["kafka"]["ok"]
    return 1 if not report["database"]["ok"] or broker_failed else 0


def register(commands: argparse._SubParsersAction) -> None:
    command = commands.add_parser(
        "status",
        help="where the database and Kafka are (no secrets) and whether they answer; engine nodes, shards,"
        " backlogs, relay rates, consumer lag, DLQ, last reconcile",
    )
    command.add_argument("--json", action="store_true", help="one JSON object")
    command.add_argument(
        "--horizon",
        default=DEFAULT_HORIZON,
        metavar="DURATION",
        help=f"count schedules due within this much ahead (the engine's --horizon, default {DEFAULT_HORIZON})",
    )
    command.set_defaults(func=cmd_status)

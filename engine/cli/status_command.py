"""``chronoq status``: where this command's configuration points, and whether the database and Kafka answer.

It prints the database URL without its password, the Kafka bootstrap with
its security (protocol, SASL mechanism and user, CA and certificate files;
never the password), then connects to each. A refused credential or
certificate is reported at once with what to fix (``KafkaSecurityError``),
not retried. Exit status 0 when both answer, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from engine.cli import print_json
from engine.cli.endpoints import Endpoints, redacted_url, resolve_endpoints
from schemas.errors import ChronoqError
from schemas.kafka_security import start_client

#: Seconds each check may take before it counts as unreachable.
CHECK_TIMEOUT = 10.0


async def check_database(url: str) -> str | None:
    """None when the database answers ``SELECT 1``, else why not (without the URL: it may hold a password)."""
    try:
        conn = await asyncpg.connect(url, timeout=CHECK_TIMEOUT)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:
        return f"{type(err).__name__}: {err}"
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()
    return None


async def check_kafka(endpoints: Endpoints) -> str | None:
    """None when the broker answers a metadata request through the configured security, else why not."""
    security = endpoints.kafka_security
    admin = AIOKafkaAdminClient(
        bootstrap_servers=endpoints.kafka_bootstrap,
        request_timeout_ms=int(CHECK_TIMEOUT * 1000),
        **security.client_options(),
    )
    try:
        await asyncio.wait_for(start_client(admin, endpoints.kafka_bootstrap, security), CHECK_TIMEOUT)
        await asyncio.wait_for(admin.list_topics(), CHECK_TIMEOUT)
    except ChronoqError as err:
        return str(err)
    except Exception as err:  # noqa: BLE001 - any failure is the answer to "does Kafka answer?"
        return f"{type(err).__name__}: {err}"
    finally:
        await admin.close()
    return None


def cmd_status(args: argparse.Namespace) -> int:
    endpoints = resolve_endpoints()

    async def main() -> tuple[str | None, str | None]:
        return await check_database(endpoints.database_url), await check_kafka(endpoints)

    database_problem, kafka_problem = asyncio.run(main())
    report = {
        "database": {"url": redacted_url(endpoints.database_url), "ok": database_problem is None},
        "kafka": {
            "bootstrap": endpoints.kafka_bootstrap,
            "security": endpoints.kafka_security.describe(),
            "ok": kafka_problem is None,
        },
    }
    if database_problem:
        report["database"]["problem"] = database_problem
    if kafka_problem:
        report["kafka"]["problem"] = kafka_problem
    if args.json:
        print_json(report, True)
    else:
        for name, part in report.items():
            state = "ok" if part["ok"] else f"FAILED: {part.get('problem')}"
            where = part.get("url") or f"{part['bootstrap']}  ({part['security']})"
            print(f"{name + ':':10} {where}  {state}", flush=True)
    return 0 if database_problem is None and kafka_problem is None else 1


def register(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser(
        "status", help="where the database and Kafka are (no secrets), and whether they answer"
    )
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.set_defaults(func=cmd_status)

"""``chronoq status``: what the engine is doing right now (read-only)."""

from __future__ import annotations

import argparse
import asyncio
import os

from engine.cli import print_json
from engine.cli.endpoints import resolve_database_url, resolve_endpoints
from engine.control.status import engine_status, status_lines
from engine.rules.timing import parse_duration
from schemas.connections import create_pool
from schemas.errors import StackError


def _bootstrap() -> str | None:
    """The broker, if one is configured: consumer lag is shown only then."""
    if os.environ.get("CHRONOQ_KAFKA_BOOTSTRAP"):
        return os.environ["CHRONOQ_KAFKA_BOOTSTRAP"]
    try:
        return resolve_endpoints().kafka_bootstrap
    except StackError:
        return None


async def _status(args: argparse.Namespace) -> dict:
    horizon = parse_duration(args.horizon, "horizon")
    pool = await create_pool(resolve_database_url(), min_size=1, max_size=1)
    try:
        return await engine_status(pool, _bootstrap(), horizon=horizon)
    finally:
        await pool.close()


def cmd_status(args: argparse.Namespace) -> int:
    status = asyncio.run(_status(args))
    if args.json:
        print_json(status, compact=True)
    else:
        print("\n".join(status_lines(status)))
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    command = commands.add_parser(
        "status", help="engine nodes, shards, backlogs, relay rates, consumer lag, DLQ, last reconcile"
    )
    command.add_argument("--json", action="store_true", help="one JSON object")
    command.add_argument(
        "--horizon",
        default="30s",
        metavar="DURATION",
        help="count schedules due within this much ahead (the materializer's horizon, default 30s)",
    )
    command.set_defaults(func=cmd_status)

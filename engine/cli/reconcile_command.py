"""``chronoq reconcile``: prove (or disprove) that every occurrence of a window exists exactly once.

Exit status: 0 clean, 3 not clean (something missing, unexpected, duplicated,
violating its misfire policy, or an effect problem), 2 invalid input, 1 any
other error. See docs/operations.md ("Reconcile").
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import datetime, timedelta

from engine.cli import print_json
from engine.cli.endpoints import resolve_database_url
from engine.control.reconciler import ConsumerCheck, ReconcileOptions, ReconcileReport, Window, reconcile
from engine.control.reconciler.run import open_pool
from engine.rules.timing import parse_duration, parse_instant
from schemas.errors import InvalidInput
from schemas.observability import configure_telemetry, flush_telemetry
from schemas.queries import QUERIES

NOT_CLEAN = 3


def window_of(args: argparse.Namespace, now: datetime) -> Window:
    """The window the flags name: --from/--to, or --last DURATION ending now."""
    if args.last is not None:
        if args.start is not None or args.end is not None:
            raise InvalidInput("last", "give either --last or --from/--to, not both", "--last 1h")
        span = parse_duration(args.last, "last")
        if span <= timedelta(0):
            raise InvalidInput("last", "must be at least 1s", "--last 1h")
        return Window(now - span, now)
    if args.start is None or args.end is None:
        missing = "from" if args.start is None else "to"
        raise InvalidInput(
            missing,
            f"is required (or give --last DURATION): --{missing} ISO-8601 instant",
            "--from 2026-12-01T08:00:00Z --to 2026-12-01T09:00:00Z",
        )
    start, end = parse_instant(args.start, "from"), parse_instant(args.end, "to")
    if end <= start:
        raise InvalidInput("to", f"{args.end} is not after --from {args.start}", "--to 2026-12-01T09:00:00Z")
    return Window(start, end)


def options_of(args: argparse.Namespace) -> ReconcileOptions:
    if args.offenders < 0:
        raise InvalidInput("offenders", "must not be negative", "--offenders 20")
    return ReconcileOptions(
        offenders=args.offenders,
        stuck_after=parse_duration(args.stuck_after, "stuck-after"),
        on_time_limit=parse_duration(args.on_time_limit, "on-time-limit") if args.on_time_limit else None,
    )


async def _run(args: argparse.Namespace) -> ReconcileReport:
    options = options_of(args)
    consumer = None
    if args.consumer_database:
        targets = (
            tuple(t.strip() for t in args.consumer_targets.split(",") if t.strip()) if args.consumer_targets else None
        )
        consumer = ConsumerCheck(args.consumer_database, args.consumer_group, targets)
    pool = await open_pool(resolve_database_url())
    try:
        window = window_of(args, await pool.fetchval(*QUERIES.current_instant(now=None)))
        return await reconcile(
            pool, window, tenant_id=args.tenant, options=options, consumer=consumer, record=not args.no_record
        )
    finally:
        await pool.close()


def cmd_reconcile(args: argparse.Namespace) -> int:
    configure_telemetry("chronoq-reconcile")
    try:
        report = asyncio.run(_run(args))
    finally:
        flush_telemetry()
    if args.json:
        print_json(report.to_json(), compact=True)
    else:
        print("\n".join(report.lines()))
    return 0 if report.clean else NOT_CLEAN


def register(commands: argparse._SubParsersAction) -> None:
    command = commands.add_parser(
        "reconcile",
        help="recompute every occurrence a window should have and compare (exit 3 if not clean)",
        description="Recomputes, from the schedule version history and the time contract, every occurrence"
        " that should exist in [--from, --to) and compares it with the database (and, with"
        " --consumer-database, with a consumer app's applied effects). Exit status 0 clean,"
        " 3 not clean.",
    )
    command.add_argument("--from", dest="start", metavar="ISO", help="window start (inclusive), ISO-8601 with offset")
    command.add_argument("--to", dest="end", metavar="ISO", help="window end (exclusive), ISO-8601 with offset")
    command.add_argument("--last", metavar="DURATION", help="instead of --from/--to: the last DURATION (e.g. 1h)")
    command.add_argument("--tenant", help="only this tenant's schedules")
    command.add_argument("--json", action="store_true", help="one JSON object: counts, states, offenders")
    command.add_argument(
        "--consumer-database",
        metavar="URL",
        help="also check this consumer app's database for effects applied twice or never",
    )
    command.add_argument("--consumer-group", help="only this consumer group's effects (default: every group)")
    command.add_argument(
        "--consumer-targets",
        metavar="T1,T2",
        help="targets that consumer handles (default: every target it applied something of)",
    )
    command.add_argument("--offenders", type=int, default=20, help="offenders listed per kind (default 20)")
    command.add_argument(
        "--stuck-after",
        default="10m",
        metavar="DURATION",
        help="an occurrence not final and unchanged this long is stuck (default 10m)",
    )
    command.add_argument(
        "--on-time-limit",
        metavar="DURATION",
        help="the engine's cap on max_lateness (MaterializerConfig.on_time_limit, 5m by default), for the misfire"
        " policy check (default: none, max_lateness alone: more lenient, never a false violation)",
    )
    command.add_argument("--no-record", action="store_true", help="do not store the result in reconcile_runs")
    command.set_defaults(func=cmd_reconcile)

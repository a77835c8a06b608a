"""``chronoq history prune | retention``: move finished occurrences past retention into the archive.

See engine/control/history_retention.py for what may go and the crash-safety guarantee, and
docs/capacity.md for why the archive is a schema of the same database.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from engine.cli import print_json
from engine.cli.endpoints import with_engine_pool
from engine.control.history_retention import prune, retention_policy, set_retention
from engine.rules.timing import parse_duration
from schemas.errors import InvalidInput
from schemas.observability import configure_telemetry, flush_telemetry


def _progress(tenant_id: str, occurrences: int, attempts: int) -> None:
    print(f"batch committed: tenant={tenant_id} occurrences={occurrences} attempts={attempts}", file=sys.stderr)
    sys.stderr.flush()


def cmd_prune(args: argparse.Namespace) -> int:
    configure_telemetry("chronoq-history")
    try:
        report = asyncio.run(
            with_engine_pool(
                lambda pool: prune(
                    pool,
                    dry_run=args.dry_run,
                    batch_size=args.batch,
                    max_batches=args.max_batches,
                    tenant_id=args.tenant,
                    on_batch=_progress if args.progress else None,
                ),
                max_size=2,
            )
        )
    finally:
        flush_telemetry()
    if args.json:
        print_json(report.to_json(), compact=True)
    else:
        print("\n".join(report.lines()))
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    if args.clear and args.keep:
        raise InvalidInput("clear", "give either --keep or --clear, not both", "--tenant acme --clear")
    if args.clear and not args.tenant:
        raise InvalidInput("tenant", "--clear removes a tenant's override: name the tenant", "--tenant acme --clear")
    if args.keep or args.clear:
        keep = parse_duration(args.keep, "keep") if args.keep else None
        print_json(
            asyncio.run(with_engine_pool(lambda pool: set_retention(pool, keep, tenant_id=args.tenant), max_size=2)),
            args.json,
        )
    else:
        print_json(asyncio.run(with_engine_pool(retention_policy, max_size=2)), args.json)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    history = commands.add_parser("history", help="retention: move finished occurrences into the archive")
    actions = history.add_subparsers(dest="history_command", required=True, metavar="ACTION")

    pruning = actions.add_parser(
        "prune",
        help="archive finished occurrences older than their tenant's retention (--dry-run: only show them)",
        description="Moves finished occurrences (SUCCEEDED, MISSED, CANCELED, SKIPPED_OVERLAP) scheduled before"
        " now - retention, with their attempts, into the archive schema, in bounded batches of one transaction"
        " each: safe to kill and run again. Not-final and DEAD occurrences stay.",
    )
    pruning.add_argument("--dry-run", action="store_true", help="count what would go (and what stays), move nothing")
    pruning.add_argument("--tenant", help="only this tenant's occurrences")
    pruning.add_argument("--batch", type=int, default=1000, help="occurrences per transaction (default 1000)")
    pruning.add_argument("--max-batches", type=int, help="stop after this many batches (default: until done)")
    pruning.add_argument("--progress", action="store_true", help="a line on stderr per committed batch")
    pruning.add_argument("--json", action="store_true", help="one JSON object")
    pruning.set_defaults(func=cmd_prune)

    retention = actions.add_parser(
        "retention",
        help="show the retention policy, or set the default (--keep) or a tenant's override (--tenant --keep|--clear)",
    )
    retention.add_argument("--keep", metavar="DURATION", help="retention, at least 1h (e.g. 30d)")
    retention.add_argument("--tenant", help="set this tenant's override instead of the global default")
    retention.add_argument("--clear", action="store_true", help="remove the tenant's override")
    retention.add_argument("--json", action="store_true", help="one JSON line")
    retention.set_defaults(func=cmd_retention)

"""``chronoq dlq list | replay``: the dead-letter list from a terminal."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from engine.cli import print_json
from engine.cli.endpoints import with_engine_pool
from engine.control.dead_letters import list_dead_letters, replay_dead_letter
from schemas.errors import InvalidInput


def _line(item: dict[str, Any]) -> str:
    return (
        f"{item['died_at']}  {item['occurrence_id']}  tenant={item['tenant_id']} target={item['target']}"
        f" attempts={item['attempts']} reason={item['reason']}"
        f" error={item['error_class']}: {(item['error_message'] or '')[:120]}"
    )


def cmd_list(args: argparse.Namespace) -> int:
    page = asyncio.run(
        with_engine_pool(
            lambda pool: list_dead_letters(pool, args.tenant, limit=args.limit, cursor=args.cursor), max_size=2
        )
    )
    if args.json:
        print_json(page, compact=True)
        return 0
    if not page["items"]:
        print("no dead letters" + (f" for tenant {args.tenant}" if args.tenant else ""))
    for item in page["items"]:
        print(_line(item))
    if page["next_cursor"]:
        print(f"more: chronoq dlq list --cursor {page['next_cursor']}", file=sys.stderr)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    if not args.tenant:
        raise InvalidInput(
            "tenant", "is required: --tenant NAME (the tenant that owns the occurrence)", "--tenant acme"
        )
    replayed = asyncio.run(
        with_engine_pool(lambda pool: replay_dead_letter(pool, args.tenant, args.occurrence_id), max_size=2)
    )
    print_json(replayed, args.json)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    dlq = commands.add_parser("dlq", help="list and replay dead occurrences")
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="DEAD occurrences, oldest first")
    listing.add_argument("--tenant", help="only this tenant's (default: every tenant)")
    listing.add_argument("--limit", type=int, default=100, help="page size, 1-500 (default 100)")
    listing.add_argument("--cursor", help="continue after a previous page")
    listing.add_argument("--json", action="store_true", help='one JSON object {"items": [...], "next_cursor": ...}')
    listing.set_defaults(func=cmd_list)

    replay = actions.add_parser("replay", help="re-enqueue a DEAD occurrence (same occurrence_id)")
    replay.add_argument("occurrence_id")
    replay.add_argument("--tenant", help="tenant that owns the occurrence (required)")
    replay.add_argument("--json", action="store_true", help="one JSON line")
    replay.set_defaults(func=cmd_replay)

"""``chronoq target register|grant|revoke|list``: who may schedule onto a target.

A target is claimed by the first tenant that creates a schedule on it; these
commands let an operator reserve a name for a tenant beforehand, share a
target with further tenants, take a grant back and see who has what
(``engine/control/targets.py``).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from engine.cli import print_json
from engine.cli.endpoints import resolve_database_url
from engine.control import targets
from schemas.clock import DatabaseClock
from schemas.connections import create_pool


def _run(action: Callable[[asyncpg.Pool], Awaitable[Any]], as_json: bool) -> int:
    async def main() -> Any:
        pool = await create_pool(resolve_database_url(), min_size=1, max_size=1)
        try:
            return await action(pool)
        finally:
            await pool.close()

    print_json(asyncio.run(main()), as_json)
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    return _run(lambda pool: _json(targets.register(pool, args.target, args.tenant, DatabaseClock())), args.json)


def cmd_grant(args: argparse.Namespace) -> int:
    return _run(lambda pool: _json(targets.grant(pool, args.target, args.tenant, DatabaseClock())), args.json)


def cmd_revoke(args: argparse.Namespace) -> int:
    return _run(lambda pool: _json(targets.revoke(pool, args.target, args.tenant, DatabaseClock())), args.json)


def cmd_list(args: argparse.Namespace) -> int:
    async def listing(pool: asyncpg.Pool) -> dict[str, Any]:
        return {"items": [t.to_json() for t in await targets.list_targets(pool, args.tenant)]}

    return _run(listing, args.json)


async def _json(change: Awaitable[targets.Target]) -> dict[str, Any]:
    return (await change).to_json()


def register(commands: argparse._SubParsersAction) -> None:
    target = commands.add_parser("target", help="manage which tenants may schedule onto a target")
    actions = target.add_subparsers(dest="target_command", required=True, metavar="ACTION")
    for name, func, help_text in (
        ("register", cmd_register, "reserve an unused target for a tenant (its owner)"),
        ("grant", cmd_grant, "let another tenant schedule onto a registered target"),
        ("revoke", cmd_revoke, "withdraw a grant (refused while the tenant has live schedules on it)"),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("target", help="the target name, e.g. billing.invoice")
        action.add_argument("tenant", help="the tenant id")
        action.add_argument("--json", action="store_true", help="print compact JSON")
        action.set_defaults(func=func)
    listing = actions.add_parser("list", help="targets with their owner and granted tenants")
    listing.add_argument("--tenant", help="only the targets this tenant may use")
    listing.add_argument("--json", action="store_true", help="print compact JSON")
    listing.set_defaults(func=cmd_list)

"""``chronoq tenant create``: onboard a tenant and print its secrets once; ``chronoq tenant usage``: what
counts against its quotas (and a recount of it)."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import fields

from engine.cli import print_json
from engine.cli.endpoints import with_engine_pool
from engine.control.quotas import TenantQuotas, every_usage, open_count_drift, usage_of
from engine.control.tenants import create_tenant
from schemas.errors import InvalidInput


def cmd_create(args: argparse.Namespace) -> int:
    quotas = TenantQuotas(
        **{f.name: getattr(args, f.name) for f in fields(TenantQuotas) if getattr(args, f.name) is not None}
    )

    created = asyncio.run(with_engine_pool(lambda pool: create_tenant(pool, args.name, quotas)))
    print_json(created.to_json(), args.json)
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    if args.recount and args.name is None:
        raise InvalidInput("--recount", "name the tenant to recount", "chronoq tenant usage acme --recount")
    if args.drift and (args.name is not None or args.recount):
        raise InvalidInput(
            "--drift", "checks every tenant: give no name and no --recount", "chronoq tenant usage --drift"
        )

    if args.drift:
        drift = asyncio.run(with_engine_pool(open_count_drift))
        print_json(
            {
                "open_occurrences_drift": [
                    {
                        "tenant_id": tenant,
                        "counter": counter,
                        "counted": counted,
                        "repair": f"chronoq tenant usage {tenant} --recount",
                    }
                    for tenant, (counter, counted) in drift.items()
                ]
            },
            args.json,
        )
        return 1 if drift else 0
    if args.name is None:
        print_json(asyncio.run(with_engine_pool(every_usage)), args.json)
    else:
        print_json(
            asyncio.run(with_engine_pool(lambda pool: usage_of(pool, args.name, recount=args.recount))), args.json
        )
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    tenant = commands.add_parser("tenant", help="manage tenants")
    actions = tenant.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", help="create a tenant; prints tenant_id, api_token and signing_key (shown only once)"
    )
    create.add_argument("name", help="tenant id: lowercase letters, digits, '-', '_'")
    defaults = TenantQuotas()
    for item in fields(TenantQuotas):
        create.add_argument(
            "--" + item.name.replace("_", "-"),
            dest=item.name,
            type=float if item.type in ("float", float) else int,
            help=f"default {getattr(defaults, item.name)}",
        )
    create.add_argument("--json", action="store_true", help="print compact JSON")
    create.set_defaults(func=cmd_create)

    usage = actions.add_parser(
        "usage", help="a tenant's live schedules and trigger rate beside its quotas (every tenant's without a name)"
    )
    usage.add_argument("name", nargs="?", help="tenant id (none: every tenant, the nearest to a quota first)")
    usage.add_argument(
        "--recount",
        action="store_true",
        help="count the tenant's schedules and open occurrences again and store that as its usage (after a"
        " restore that bypassed triggers); prints the drift it corrected",
    )
    usage.add_argument(
        "--drift",
        action="store_true",
        help="list every tenant whose open-occurrence counter (max_running's) differs from a count of its open"
        " occurrences; exits 1 if any does (counts every open occurrence: a check, not for monitoring loops)",
    )
    usage.add_argument("--json", action="store_true", help="print compact JSON")
    usage.set_defaults(func=cmd_usage)

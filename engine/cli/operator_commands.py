"""``chronoq operator token | revoke``: the tokens that see every tenant in the console."""

from __future__ import annotations

import argparse
import asyncio

from engine.cli import print_json
from engine.cli.endpoints import with_engine_pool
from engine.control.operators import create_operator_token, revoke_operator


def cmd_token(args: argparse.Namespace) -> int:
    created = asyncio.run(with_engine_pool(lambda pool: create_operator_token(pool, args.name)))
    print_json(created.to_json(), args.json)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    revoked = asyncio.run(with_engine_pool(lambda pool: revoke_operator(pool, args.name)))
    print_json({"operator": args.name, "revoked_tokens": revoked}, args.json)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    operator = commands.add_parser("operator", help="operator tokens: sign in to the console and see every tenant")
    actions = operator.add_subparsers(dest="operator_command", required=True, metavar="ACTION")
    token = actions.add_parser("token", help="create an operator token (printed once; only its hash is stored)")
    token.add_argument("name", help="who holds it, e.g. alice")
    token.add_argument("--json", action="store_true", help="print compact JSON")
    token.set_defaults(func=cmd_token)
    revoke = actions.add_parser("revoke", help="revoke every token of an operator (ends its console sessions)")
    revoke.add_argument("name")
    revoke.add_argument("--json", action="store_true", help="print compact JSON")
    revoke.set_defaults(func=cmd_revoke)

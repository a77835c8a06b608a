"""``chronoq target register|grant|revoke|list``: who may schedule onto a target;
``chronoq target owner TARGET GROUP``: the one consumer group whose attempt events count for it;
``chronoq target credential issue|rotate|revoke|list``: its consumer side's attempt credentials.

A target is claimed by the first tenant that creates a schedule on it; these
commands let an operator reserve a name for a tenant beforehand, share a
target with further tenants, take a grant back and see who has what
(``engine/control/targets.py``). A credential's token is printed once, by
``issue`` or ``rotate``, to stdout only (``engine/control/attempt_credentials.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg

from engine.cli import print_json
from engine.cli.endpoints import with_engine_pool
from engine.control import attempt_credentials, attempt_owners, targets
from schemas.clock import DatabaseClock
from schemas.errors import InvalidInput

_GRACE = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _run(action: Callable[[asyncpg.Pool], Awaitable[Any]], as_json: bool) -> int:
    print_json(asyncio.run(with_engine_pool(action)), as_json)
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    return _run(lambda pool: _json(targets.register(pool, args.target, args.tenant, DatabaseClock())), args.json)


def cmd_grant(args: argparse.Namespace) -> int:
    return _run(lambda pool: _json(targets.grant(pool, args.target, args.tenant, DatabaseClock())), args.json)


def cmd_revoke(args: argparse.Namespace) -> int:
    return _run(lambda pool: _json(targets.revoke(pool, args.target, args.tenant, DatabaseClock())), args.json)


def cmd_owner(args: argparse.Namespace) -> int:
    async def registering(pool: asyncpg.Pool) -> dict[str, Any]:
        owner = await attempt_owners.register_attempt_owner(pool, args.target, args.group, DatabaseClock())
        return owner.to_json()

    return _run(registering, args.json)


def cmd_list(args: argparse.Namespace) -> int:
    async def listing(pool: asyncpg.Pool) -> dict[str, Any]:
        return {"items": [t.to_json() for t in await targets.list_targets(pool, args.tenant)]}

    return _run(listing, args.json)


def cmd_credential_issue(args: argparse.Namespace) -> int:
    return _print_issued(lambda pool: attempt_credentials.issue(pool, args.target, DatabaseClock()), args.json)


def cmd_credential_rotate(args: argparse.Namespace) -> int:
    grace = _grace(args.grace)
    return _print_issued(lambda pool: attempt_credentials.rotate(pool, args.target, DatabaseClock(), grace), args.json)


def cmd_credential_revoke(args: argparse.Namespace) -> int:
    try:
        credential_id = uuid.UUID(args.credential_id)
    except ValueError:
        raise InvalidInput("credential_id", "is not a credential id", str(uuid.uuid4())) from None

    async def revoking(pool: asyncpg.Pool) -> dict[str, Any]:
        return (await attempt_credentials.revoke(pool, credential_id, DatabaseClock())).to_json()

    return _run(revoking, args.json)


def cmd_credential_list(args: argparse.Namespace) -> int:
    async def listing(pool: asyncpg.Pool) -> dict[str, Any]:
        return {"items": [c.to_json() for c in await attempt_credentials.list_credentials(pool, args.target)]}

    return _run(listing, args.json)


def _print_issued(
    action: Callable[[asyncpg.Pool], Awaitable[attempt_credentials.IssuedCredential]], as_json: bool
) -> int:
    async def issuing(pool: asyncpg.Pool) -> dict[str, Any]:
        issued = await action(pool)
        # The only time the secret is shown: stdout, never a log line.
        return {**issued.info.to_json(), "token": issued.token, "expiring": [str(c) for c in issued.expiring]}

    code = _run(issuing, as_json)
    if not as_json:
        print(
            "give the token to the target's consumer app (ConsumerConfig.attempt_credentials, or"
            " CHRONOQ_ATTEMPT_CREDENTIALS=<target>=<token> for chronoq consume); it is not shown again",
            file=sys.stderr,
        )
    return code


def _grace(text: str) -> timedelta:
    match = _GRACE.fullmatch(text.strip())
    if match is None:
        raise InvalidInput("grace", "is a number of seconds, optionally with a unit s, m, h or d", "1h")
    return timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])


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
    owner = actions.add_parser(
        "owner", help="the one consumer group whose attempt events count for a target (the others observe)"
    )
    owner.add_argument("target", help="the target name, e.g. billing.invoice")
    owner.add_argument("group", help="the consumer group that reports attempts, e.g. billing")
    owner.add_argument("--json", action="store_true", help="print compact JSON")
    owner.set_defaults(func=cmd_owner)
    listing = actions.add_parser("list", help="targets with their owner and granted tenants")
    listing.add_argument("--tenant", help="only the targets this tenant may use")
    listing.add_argument("--json", action="store_true", help="print compact JSON")
    listing.set_defaults(func=cmd_list)
    credential = actions.add_parser(
        "credential", help="the attempt credentials a target's consumer app signs its attempt events with"
    )
    credential_actions = credential.add_subparsers(dest="credential_command", required=True, metavar="ACTION")
    issue = credential_actions.add_parser("issue", help="add a credential; prints its token once")
    rotate = credential_actions.add_parser(
        "rotate", help="add a credential and end the others after a grace period; prints its token once"
    )
    rotate.add_argument("--grace", default="1h", help="how long the previous credentials stay valid (default 1h)")
    listed = credential_actions.add_parser("list", help="a target's credentials and until when each is valid")
    for action, func in ((issue, cmd_credential_issue), (rotate, cmd_credential_rotate), (listed, cmd_credential_list)):
        action.add_argument("target", help="the target name, e.g. billing.invoice")
        action.add_argument("--json", action="store_true", help="print compact JSON")
        action.set_defaults(func=func)
    revoke = credential_actions.add_parser("revoke", help="end one credential now (a leaked secret)")
    revoke.add_argument("credential_id", help="the credential id (chronoq target credential list)")
    revoke.add_argument("--json", action="store_true", help="print compact JSON")
    revoke.set_defaults(func=cmd_credential_revoke)

"""``chronoq schedule ...``: create and inspect schedules from a terminal."""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime
from typing import Any

import orjson

from engine.cli import print_json
from engine.cli.endpoints import resolve_database_url
from engine.control.schedule_requests import preview_fires
from engine.control.schedules import ControlPlane
from schemas.connections import create_pool
from schemas.errors import InvalidInput

# Create flags whose values pass through unchanged under their API field names.
_PASS_THROUGH = (
    "priority",
    "flexible_window",
    "misfire_policy",
    "max_lateness",
    "overlap_policy",
    "max_attempts",
    "dst_repeat",
    "dst_gap",
    "anchor",
    "start_at",
    "end_at",
)


def fields_from_flags(args: argparse.Namespace, *, create: bool) -> dict[str, Any]:
    """Turn create/update flags into API field names (validation happens in the control plane).

    Create needs exactly one of --cron/--at/--every; update takes at most one.
    """
    chosen = [flag for flag in ("cron", "at", "every") if getattr(args, flag) is not None]
    if len(chosen) > 1 or (create and not chosen):
        raise InvalidInput(
            "expression",
            "give exactly one of --cron EXPR, --at ISO8601 or --every DURATION",
            "--cron '0 9 * * MON-FRI' --tz Europe/Berlin",
        )
    body: dict[str, Any] = {}
    if chosen:
        body["kind"] = {"cron": "cron", "at": "once", "every": "rate"}[chosen[0]]
        body["expression"] = getattr(args, chosen[0])
    if create or args.target is not None:
        body["target"] = args.target
    if args.tz is not None:
        body["time_zone"] = args.tz
    if args.payload is not None:
        try:
            body["payload"] = orjson.loads(args.payload)
        except orjson.JSONDecodeError as err:
            raise InvalidInput("payload", f"is not valid JSON ({err})", "'{\"invoice\": 42}'") from err
    for name in _PASS_THROUGH:
        value = getattr(args, name, None)
        if value is not None:
            body[name] = value
    return body


async def control_plane_call(method: str, *call_args: Any, **call_kwargs: Any) -> Any:
    """Run one ControlPlane method against the configured engine database."""
    pool = await create_pool(resolve_database_url(), min_size=1, max_size=2)
    try:
        return await getattr(ControlPlane(pool), method)(*call_args, **call_kwargs)
    finally:
        await pool.close()


def cmd_create(args: argparse.Namespace) -> int:
    if not args.tenant:
        raise InvalidInput("tenant", "is required: --tenant NAME", "--tenant acme")
    body = fields_from_flags(args, create=True)
    schedule = asyncio.run(control_plane_call("create_schedule", args.tenant, body, args.idempotency_key))
    print_json(schedule, args.json)
    return 0


def cmd_preview(args: argparse.Namespace) -> int:
    chosen = [flag for flag in ("cron", "at", "every") if getattr(args, flag) is not None]
    if len(chosen) != 1:
        raise InvalidInput(
            "expression",
            "give exactly one of --cron EXPR, --at ISO8601 or --every DURATION",
            "--cron '30 2 * * *' --tz America/New_York",
        )
    body = {
        "kind": {"cron": "cron", "at": "once", "every": "rate"}[chosen[0]],
        "expression": getattr(args, chosen[0]),
        "time_zone": args.tz,
        "dst_repeat": args.dst_repeat,
        "dst_gap": args.dst_gap,
        "anchor": args.anchor,
    }
    if args.from_ is None:
        # A read-only preview needs no database: "now" is this terminal's clock.
        after = datetime.now(UTC)
    else:
        after = parse_instant(args.from_, "from")
    fires = preview_fires(body, after, args.n)
    if args.json:
        print_json(fires, compact=True)
    else:
        for fire in fires:
            print(f"{fire['utc']}  {fire['local']}")
    return 0


def parse_instant(text: str, field: str) -> datetime:
    """An ISO-8601 instant with an offset (or Z) given on the command line."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as err:
        raise InvalidInput(field, f"{text!r} is not an ISO-8601 instant", "2026-03-07T00:00:00Z") from err
    if value.tzinfo is None:
        raise InvalidInput(field, "needs an offset or Z", "2026-03-07T00:00:00Z")
    return value.astimezone(UTC)


def cmd_get(args: argparse.Namespace) -> int:
    print_json(asyncio.run(control_plane_call("get_schedule", args.tenant, args.schedule_id)), args.json)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    page = asyncio.run(
        control_plane_call(
            "list_schedules", args.tenant, state=args.state, target=args.target, cursor=args.cursor, limit=args.limit
        )
    )
    print_json(page.to_json(), args.json)
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    changes = fields_from_flags(args, create=False)
    schedule = asyncio.run(control_plane_call("update_schedule", args.tenant, args.schedule_id, changes))
    print_json(schedule, args.json)
    return 0


def _lifecycle(method: str):  # type: ignore[no-untyped-def]
    def command(args: argparse.Namespace) -> int:
        print_json(asyncio.run(control_plane_call(method, args.tenant, args.schedule_id)), args.json)
        return 0

    return command


def cmd_occurrences(args: argparse.Namespace) -> int:
    page = asyncio.run(
        control_plane_call("list_occurrences", args.tenant, args.schedule_id, cursor=args.cursor, limit=args.limit)
    )
    print_json(page.to_json(), args.json)
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    print_json(asyncio.run(control_plane_call("schedule_history", args.tenant, args.schedule_id)), args.json)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    schedule = commands.add_parser("schedule", help="create and inspect schedules")
    actions = schedule.add_subparsers(dest="schedule_command", required=True, metavar="ACTION")

    create = actions.add_parser("create", help="create a schedule and print it as JSON")
    create.add_argument("--tenant", help="tenant that owns the schedule")
    create.add_argument("--target", help="handler name; occurrences go to topic chronoq.occurrences.<target>")
    create.add_argument("--cron", help="5-field cron expression, local time in --tz")
    create.add_argument("--at", help="one-time instant, ISO 8601 with offset or Z")
    create.add_argument("--every", help="rate: elapsed-time period such as 90s, 15m, 1h30m")
    create.add_argument("--tz", help="IANA time zone of a cron expression (default UTC)")
    create.add_argument("--payload", help="JSON payload delivered with every occurrence")
    create.add_argument("--priority", choices=["strict", "flexible"])
    create.add_argument("--flexible-window", dest="flexible_window", help="jitter window of flexible jobs (5m)")
    create.add_argument("--misfire-policy", dest="misfire_policy", help="skip | fire_once | catch_up:K")
    create.add_argument("--max-lateness", dest="max_lateness", help="lateness beyond which a fire misfires (1m)")
    create.add_argument("--overlap-policy", dest="overlap_policy", choices=["allow", "skip_if_running", "queue_one"])
    create.add_argument("--max-attempts", dest="max_attempts", type=int)
    create.add_argument("--dst-repeat", dest="dst_repeat", choices=["first", "both"])
    create.add_argument("--dst-gap", dest="dst_gap", choices=["skip", "shift"])
    create.add_argument("--anchor", help="rate: instant the period counts from (default: now)")
    create.add_argument("--start-at", dest="start_at", help="no fires before this instant")
    create.add_argument("--end-at", dest="end_at", help="no fires after this instant")
    create.add_argument(
        "--idempotency-key", dest="idempotency_key", help="repeat-safe create: the same key returns the same schedule"
    )
    create.add_argument("--json", action="store_true", help="print compact JSON")
    create.set_defaults(func=cmd_create)

    preview = actions.add_parser("preview", help="the next fire instants of an expression, UTC and local")
    preview.add_argument("--cron", help="5-field cron expression, local time in --tz")
    preview.add_argument("--at", help="one-time instant, ISO 8601 with offset or Z")
    preview.add_argument("--every", help="rate: elapsed-time period such as 90s, 15m, 1h30m")
    preview.add_argument("--anchor", help="rate: instant the period counts from (default: --from)")
    preview.add_argument("--tz", help="IANA time zone of a cron expression (default UTC)")
    preview.add_argument(
        "--dst-repeat",
        dest="dst_repeat",
        choices=["first", "both"],
        help="a repeated wall time (fall back) fires at the first instant (default) or both",
    )
    preview.add_argument(
        "--dst-gap",
        dest="dst_gap",
        choices=["skip", "shift"],
        help="a nonexistent wall time (spring forward) is skipped (default) or shifted",
    )
    preview.add_argument("--from", dest="from_", help="list fires strictly after this instant (default: now)")
    preview.add_argument("-n", type=int, default=10, help="how many fires (default 10, at most 1000)")
    preview.add_argument("--json", action="store_true", help='a JSON list of {"utc", "local"} objects')
    preview.set_defaults(func=cmd_preview)

    def one_schedule(name: str, help_text: str, func) -> argparse.ArgumentParser:  # type: ignore[no-untyped-def]
        parser = actions.add_parser(name, help=help_text)
        parser.add_argument("schedule_id")
        parser.add_argument("--tenant", required=True, help="tenant that owns the schedule")
        parser.add_argument("--json", action="store_true", help="print compact JSON")
        parser.set_defaults(func=func)
        return parser

    one_schedule("get", "print one schedule as JSON", cmd_get)
    one_schedule(
        "pause", "stop firing (a new version); resume applies the misfire policy", _lifecycle("pause_schedule")
    )
    one_schedule("resume", "fire again from the durable cursor", _lifecycle("resume_schedule"))
    one_schedule("cancel", "stop for good; history stays readable", _lifecycle("cancel_schedule"))
    one_schedule("history", "every version of the schedule", cmd_history)
    occurrences = one_schedule("occurrences", "the schedule's occurrences, oldest first", cmd_occurrences)
    occurrences.add_argument("--cursor", help="next_cursor of the previous page")
    occurrences.add_argument("--limit", type=int, default=50)

    update = one_schedule(
        "update", "change a schedule (a new version; pending older occurrences are canceled)", cmd_update
    )
    update.add_argument("--target")
    update.add_argument("--cron")
    update.add_argument("--at")
    update.add_argument("--every")
    update.add_argument("--tz")
    update.add_argument("--payload")
    update.add_argument("--priority", choices=["strict", "flexible"])
    update.add_argument("--flexible-window", dest="flexible_window")
    update.add_argument("--misfire-policy", dest="misfire_policy")
    update.add_argument("--max-lateness", dest="max_lateness")
    update.add_argument("--overlap-policy", dest="overlap_policy", choices=["allow", "skip_if_running", "queue_one"])
    update.add_argument("--max-attempts", dest="max_attempts", type=int)
    update.add_argument("--dst-repeat", dest="dst_repeat", choices=["first", "both"])
    update.add_argument("--dst-gap", dest="dst_gap", choices=["skip", "shift"])
    update.add_argument("--anchor")
    update.add_argument("--start-at", dest="start_at")
    update.add_argument("--end-at", dest="end_at")

    listing = actions.add_parser("list", help="a tenant's schedules, in creation order")
    listing.add_argument("--tenant", required=True)
    listing.add_argument("--state", choices=["active", "paused", "canceled", "completed"])
    listing.add_argument("--target")
    listing.add_argument("--cursor", help="next_cursor of the previous page")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true", help="print compact JSON")
    listing.set_defaults(func=cmd_list)

    from engine.cli import schedule_operations  # backfill, trigger, timeline, import (imports this module)

    schedule_operations.register(actions)

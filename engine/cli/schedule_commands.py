"""``chronoq schedule ...``: create and inspect schedules from a terminal."""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.cli import print_json
from engine.cli.calendar_commands import calendars_call, read_ics
from engine.cli.endpoints import with_engine_pool
from engine.control.icalendar_import import parse_icalendar_dates
from engine.control.schedule_requests import preview_fires
from engine.control.schedules import ControlPlane
from engine.rules.exclusion_calendars import ExclusionCalendar
from engine.rules.timing.zones import validate_zone
from schemas.errors import InvalidInput
from schemas.exact_json import field_json

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
    "exclusion_calendar",
    "max_runs",
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
        body["payload"] = field_json(args.payload, "payload", "'{\"invoice\": 42}'")
    for name in _PASS_THROUGH:
        value = getattr(args, name, None)
        if value is not None:
            body[name] = value
    for name, flag in (("exclusion_calendar", "no_calendar"), ("max_runs", "no_max_runs")):
        if getattr(args, flag, False):
            if name in body:
                raise InvalidInput(name, f"give --{flag.replace('_', '-')} or a value, not both")
            body[name] = None  # update: remove it
    return body


async def control_plane_call(method: str, *call_args: Any, **call_kwargs: Any) -> Any:
    """Run one ControlPlane method against the configured engine database."""
    return await with_engine_pool(
        lambda pool: getattr(ControlPlane(pool), method)(*call_args, **call_kwargs), max_size=2
    )


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
        "max_runs": args.max_runs,
    }
    if args.from_ is None:
        # A read-only preview needs no database: "now" is this terminal's clock.
        after = datetime.now(UTC)
    else:
        after = parse_instant(args.from_, "from")
    calendar = None
    if args.calendar is not None and args.exclude_ics is not None:
        raise InvalidInput("exclusion_calendar", "give --calendar NAME (stored) or --exclude-ics FILE, not both")
    if args.calendar is not None:
        if not args.tenant:
            raise InvalidInput("tenant", "--calendar reads the tenant's calendar: give --tenant NAME", "--tenant acme")
        calendar = asyncio.run(calendars_call("get_calendar_value", args.tenant, args.calendar))
    elif args.exclude_ics is not None:
        # Offline: the file's all-day events, read on --calendar-tz (default: the schedule's zone).
        imported = parse_icalendar_dates(read_ics(args.exclude_ics))
        zone = validate_zone(args.calendar_tz) if args.calendar_tz is not None else None
        calendar = ExclusionCalendar(Path(args.exclude_ics).name, 0, zone, imported.entries)
    preview = preview_fires(body, after, args.n, calendar=calendar)
    if args.json:
        print_json(preview, compact=True)
        return 0
    print_preview(preview)
    return 0


def print_preview(preview: dict[str, Any]) -> None:
    """The fires as ``utc  local  rule`` lines, then what the calendar excluded."""
    for fire in preview["fires"]:
        print(f"{fire['utc']}  {fire['local']}  {fire['rule']}")
    if "runs_left" in preview:
        print(f"runs left: {preview['runs_left']}")
    if preview["excluded_dates"]:
        print("excluded dates in this window:")
        for entry in preview["excluded_dates"]:
            span = entry["start"] if entry["start"] == entry["end"] else f"{entry['start']}/{entry['end']}"
            print(f"  {span}" + (f"  {entry['label']}" if entry["label"] else ""))
    if preview["excluded"]:
        print("excluded fires:")
        for slot in preview["excluded"]:
            print(f"  {slot['utc']}  {slot['local']}  {slot['date']}" + (f"  {slot['label']}" if slot["label"] else ""))


def cmd_upcoming(args: argparse.Namespace) -> int:
    after = parse_instant(args.from_, "from") if args.from_ is not None else None
    preview = asyncio.run(
        control_plane_call("preview_schedule", args.tenant, args.schedule_id, after=after, count=args.n)
    )
    if args.json:
        print_json(preview, compact=True)
    else:
        print_preview(preview)
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
    if args.expected_version is not None:
        changes["expected_version"] = args.expected_version
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
        "--calendar",
        dest="exclusion_calendar",
        help="the tenant's exclusion calendar: no fires on its dates (chronoq calendar ...)",
    )
    create.add_argument("--max-runs", dest="max_runs", type=int, help="complete after this many runs")
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
    preview.add_argument("--max-runs", dest="max_runs", type=int, help="only this many runs")
    preview.add_argument(
        "--calendar", help="exclude the dates of the tenant's calendar (needs --tenant and the database)"
    )
    preview.add_argument("--tenant", help="tenant of --calendar")
    preview.add_argument(
        "--exclude-ics", dest="exclude_ics", help="exclude the all-day events of an .ics file (no database needed)"
    )
    preview.add_argument(
        "--calendar-tz", dest="calendar_tz", help="zone the --exclude-ics dates are read in (default: --tz)"
    )
    preview.add_argument(
        "--json", action="store_true", help='JSON: {"fires": [{"utc", "local", "rule"}], "excluded", "excluded_dates"}'
    )
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
    upcoming = one_schedule(
        "upcoming", "the next fires of a stored schedule, with its calendar and runs left", cmd_upcoming
    )
    upcoming.add_argument("-n", type=int, default=10, help="how many fires (default 10, at most 1000)")
    upcoming.add_argument("--from", dest="from_", help="after this instant (default: now)")
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
    update.add_argument("--calendar", dest="exclusion_calendar", help="use this exclusion calendar from now on")
    update.add_argument("--no-calendar", dest="no_calendar", action="store_true", help="stop excluding dates")
    update.add_argument("--max-runs", dest="max_runs", type=int, help="complete after this many runs in all")
    update.add_argument("--no-max-runs", dest="no_max_runs", action="store_true", help="no run limit")
    update.add_argument(
        "--expected-version",
        dest="expected_version",
        type=int,
        help="apply only if the schedule is still at this version (the one you read)",
    )

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

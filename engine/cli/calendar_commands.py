"""``chronoq calendar ...``: a tenant's exclusion calendars from a terminal.

    chronoq calendar import de-holidays feiertage.ics --tenant acme --tz Europe/Berlin
    chronoq calendar create closures --tenant acme --date 2026-12-24/2026-12-26 --date 2026-12-31
    chronoq calendar get de-holidays --tenant acme
    chronoq schedule create ... --calendar de-holidays

Every command runs through :class:`engine.control.calendars.Calendars`, so it
validates, versions and isolates tenants exactly as the HTTP API does.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import orjson

from engine.cli import print_json
from engine.cli.endpoints import with_engine_pool
from engine.control.calendars import Calendars
from engine.control.icalendar_import import MAX_ICS_BYTES
from schemas.errors import InvalidInput


async def calendars_call(method: str, *call_args: Any, **call_kwargs: Any) -> Any:
    """Run one Calendars method against the configured engine database."""
    return await with_engine_pool(lambda pool: getattr(Calendars(pool), method)(*call_args, **call_kwargs), max_size=2)


def read_ics(path: str) -> bytes:
    """The bytes of an .ics file named on the command line, or InvalidInput('ics')."""
    file = Path(path)
    try:
        if file.stat().st_size > MAX_ICS_BYTES:
            raise InvalidInput("ics", f"{path} is larger than {MAX_ICS_BYTES} bytes")
        return file.read_bytes()
    except OSError as err:
        raise InvalidInput("ics", f"cannot read {path}: {err.strerror}") from None


def _dates(args: argparse.Namespace) -> list[Any] | None:
    """--date values and --dates-file (a JSON list, as the API takes it), or None when neither is given."""
    dates: list[Any] | None = None
    if args.dates_file is not None:
        try:
            loaded = orjson.loads(Path(args.dates_file).read_bytes())
        except OSError as err:
            raise InvalidInput("dates", f"cannot read {args.dates_file}: {err.strerror}") from None
        except orjson.JSONDecodeError as err:
            raise InvalidInput("dates", f"{args.dates_file} is not JSON ({err})", '["2026-12-25"]') from None
        if not isinstance(loaded, list):
            raise InvalidInput("dates", f"{args.dates_file} must hold a JSON list of dates", '["2026-12-25"]')
        dates = loaded
    if args.date:
        dates = [*(dates or []), *args.date]
    return dates


def cmd_create(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name, "dates": _dates(args) or []}
    if args.tz is not None:
        body["time_zone"] = args.tz
    if args.description is not None:
        body["description"] = args.description
    print_json(asyncio.run(calendars_call("create_calendar", args.tenant, body)), args.json)
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    dates = _dates(args)
    if dates is not None:
        changes["dates"] = dates
    if args.tz is not None and args.no_tz:
        raise InvalidInput("time_zone", "give --tz ZONE or --no-tz, not both", "--tz Europe/Berlin")
    if args.tz is not None:
        changes["time_zone"] = args.tz
    if args.no_tz:
        changes["time_zone"] = None
    if args.description is not None:
        changes["description"] = args.description
    if args.expected_version is not None:
        changes["expected_version"] = args.expected_version
    print_json(asyncio.run(calendars_call("update_calendar", args.tenant, args.name, changes)), args.json)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    result = asyncio.run(
        calendars_call(
            "import_calendar",
            args.tenant,
            args.name,
            read_ics(args.file),
            time_zone=args.tz,
            description=args.description,
        )
    )
    print_json(result, args.json)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    print_json(asyncio.run(calendars_call("get_calendar", args.tenant, args.name)), args.json)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    page = asyncio.run(calendars_call("list_calendars", args.tenant, cursor=args.cursor, limit=args.limit))
    print_json(page.to_json(), args.json)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    print_json(asyncio.run(calendars_call("delete_calendar", args.tenant, args.name)), args.json)
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    print_json(asyncio.run(calendars_call("calendar_history", args.tenant, args.name)), args.json)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    calendar = commands.add_parser("calendar", help="exclusion calendars: dates a schedule does not fire on")
    actions = calendar.add_subparsers(dest="calendar_command", required=True, metavar="ACTION")

    def one(name: str, help_text: str, func) -> argparse.ArgumentParser:  # type: ignore[no-untyped-def]
        parser = actions.add_parser(name, help=help_text)
        parser.add_argument("name", help="calendar name (a-z 0-9 _ . -)")
        parser.add_argument("--tenant", required=True, help="tenant that owns the calendar")
        parser.add_argument("--json", action="store_true", help="print compact JSON")
        parser.set_defaults(func=func)
        return parser

    def date_flags(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--date",
            action="append",
            metavar="DATE",
            help="a date YYYY-MM-DD or an inclusive range YYYY-MM-DD/YYYY-MM-DD (repeatable)",
        )
        parser.add_argument(
            "--dates-file",
            dest="dates_file",
            help='a JSON list of dates as the API takes them, e.g. ["2026-12-25", {"date":'
            ' "2027-01-01", "label": "New Year"}]',
        )
        parser.add_argument("--description")

    create = one("create", "create a calendar (version 1)", cmd_create)
    create.add_argument("--tz", help="the zone its dates are read in (default: each schedule's own zone)")
    date_flags(create)
    update = one("update", "a new version: the dates given replace all dates", cmd_update)
    update.add_argument("--tz", help="read the dates in this zone from now on")
    update.add_argument("--no-tz", dest="no_tz", action="store_true", help="read them in each schedule's zone")
    update.add_argument(
        "--expected-version",
        dest="expected_version",
        type=int,
        help="apply only if the calendar is still at this version",
    )
    date_flags(update)
    imported = one(
        "import", "replace the dates with an .ics file's all-day events (creates the calendar if needed)", cmd_import
    )
    imported.add_argument("file", help="iCalendar file of all-day events (VEVENT with DTSTART;VALUE=DATE)")
    imported.add_argument("--tz", help="the zone its dates are read in")
    imported.add_argument("--description")
    one("get", "one calendar with its dates", cmd_get)
    one("delete", "delete a calendar no active or paused schedule uses", cmd_delete)
    one("history", "every version with its dates", cmd_history)
    listing = actions.add_parser("list", help="a tenant's calendars, in creation order")
    listing.add_argument("--tenant", required=True)
    listing.add_argument("--cursor", help="next_cursor of the previous page")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true", help="print compact JSON")
    listing.set_defaults(func=cmd_list)

"""``chronoq schedule backfill | trigger | import | timeline``: the operator's actions on schedules.

They run against the engine database like the other ``schedule`` commands and
go through the same code as the HTTP API (``engine.control.requested_occurrences``,
``engine.control.schedule_batches``, ``engine.control.timeline``), so quotas,
pacing and idempotency are the same. What the CLI asks for is recorded as
requested by ``cli:<os user>``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import pwd
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson

from engine.cli import print_json
from engine.cli.endpoints import with_engine_pool
from engine.cli.schedule_commands import parse_instant
from engine.control.requested_occurrences import RequestedOccurrences
from engine.control.schedule_batches import MAX_BATCH, BatchItem, ScheduleBatches
from engine.control.schedules import ControlPlane
from engine.control.timeline import schedule_timeline
from schemas.errors import InvalidInput
from schemas.exact_json import field_json


def requester() -> str:
    """Who asked, for the occurrence's record: the operating-system user running the CLI."""
    return f"cli:{pwd.getpwuid(os.getuid()).pw_name}"


async def _with_control(call):  # type: ignore[no-untyped-def]
    return await with_engine_pool(lambda pool: call(ControlPlane(pool)), max_size=2)


def cmd_backfill(args: argparse.Namespace) -> int:
    window_from, window_to = parse_instant(args.from_, "from"), parse_instant(args.to, "to")
    result = asyncio.run(
        _with_control(
            lambda control: RequestedOccurrences(control.pool).backfill(
                args.tenant, args.schedule_id, window_from, window_to, requester()
            )
        )
    )
    print_json(result.to_json(), args.json)
    return 0


def cmd_trigger(args: argparse.Namespace) -> int:
    occurrence = asyncio.run(
        _with_control(
            lambda control: RequestedOccurrences(control.pool).trigger_now(
                args.tenant, args.schedule_id, requester(), args.idempotency_key
            )
        )
    )
    print_json(occurrence, args.json)
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    async def read(control: ControlPlane) -> dict[str, Any]:
        now = await control.now()
        window_to = parse_instant(args.to, "to") if args.to else now
        window_from = parse_instant(args.from_, "from") if args.from_ else window_to - timedelta(hours=1)
        return (
            await schedule_timeline(control.pool, args.tenant, args.schedule_id, window_from, window_to, now)
        ).to_json()

    timeline = asyncio.run(_with_control(read))
    if args.json:
        print_json(timeline, compact=True)
        return 0
    for entry in timeline["entries"]:
        version = f"v{entry['version']}" if entry["version"] is not None else "--"
        print(f"{entry['scheduled_for']}  {version:>4}  {entry['verdict']:<15} {entry['explanation']}")
    print("  ".join(f"{verdict}={count}" for verdict, count in timeline["counts"].items()), file=sys.stderr)
    return 0


def import_items(path: Path) -> Iterator[tuple[int, BatchItem | InvalidInput]]:
    """(line number, item or the line's error) for every non-empty line of a JSONL file.

    A line is ``{"idempotency_key": "...", "schedule": {...}}`` or a bare schedule body, whose key is then
    derived from its canonical JSON: importing the same file twice creates nothing the second time.
    """
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                value = field_json(line, "line")
            except InvalidInput as err:
                yield number, err
                continue
            if isinstance(value, dict) and set(value) == {"idempotency_key", "schedule"}:
                yield number, BatchItem(value["idempotency_key"], value["schedule"])
            elif isinstance(value, dict):
                digest = hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()
                yield number, BatchItem(f"import:{digest}", value)
            else:
                yield number, InvalidInput("line", "must be a JSON object")


def cmd_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise InvalidInput("file", f"{args.file} is not a readable file", "schedules.jsonl")
    if not 1 <= args.batch <= MAX_BATCH:
        raise InvalidInput("batch", f"must be from 1 to {MAX_BATCH}", str(MAX_BATCH))

    async def run(control: ControlPlane) -> dict[str, Any]:
        batches = ScheduleBatches(control)
        totals = {"lines": 0, "created": 0, "replayed": 0, "failed": 0}
        started = time.monotonic()
        pending: list[tuple[int, BatchItem]] = []

        async def flush() -> None:
            results = await batches.create_schedules(args.tenant, [item for _, item in pending])
            for (number, _), result in zip(pending, results, strict=True):
                status = result["status"]
                if status == 201:
                    totals["created"] += 1
                elif status == 200:
                    totals["replayed"] += 1
                else:
                    totals["failed"] += 1
                    _report(number, result["error"].get("field"), result["error"]["message"])
            pending.clear()

        for number, item in import_items(path):
            totals["lines"] += 1
            if isinstance(item, InvalidInput):
                totals["failed"] += 1
                _report(number, item.field, str(item))
                continue
            pending.append((number, item))
            if len(pending) == args.batch:
                await flush()
        if pending:
            await flush()
        return {**totals, "seconds": round(time.monotonic() - started, 3)}

    summary = asyncio.run(_with_control(run))
    print_json(summary, args.json)
    return 2 if summary["failed"] else 0


def _report(number: int, field: str | None, message: str) -> None:
    print(f"chronoq: line {number}: {message}" + (f" [field {field}]" if field else ""), file=sys.stderr)


def register(actions: argparse._SubParsersAction) -> None:
    """Add the operator's actions to ``chronoq schedule``."""
    backfill = actions.add_parser(
        "backfill", help="fire the past slots of a window that never ran (same occurrence ids; twice adds none)"
    )
    backfill.add_argument("schedule_id")
    backfill.add_argument("--tenant", required=True, help="tenant that owns the schedule")
    backfill.add_argument("--from", dest="from_", required=True, help="first instant of the window (ISO 8601)")
    backfill.add_argument("--to", required=True, help="last instant of the window, not in the future")
    backfill.add_argument("--json", action="store_true", help="print compact JSON")
    backfill.set_defaults(func=cmd_backfill)

    trigger = actions.add_parser("trigger", help="run the schedule now: one manual occurrence (overlap policy applies)")
    trigger.add_argument("schedule_id")
    trigger.add_argument("--tenant", required=True, help="tenant that owns the schedule")
    trigger.add_argument("--idempotency-key", dest="idempotency_key", help="the same key triggers once")
    trigger.add_argument("--json", action="store_true", help="print compact JSON")
    trigger.set_defaults(func=cmd_trigger)

    timeline = actions.add_parser("timeline", help="every expected slot in a window and what happened to it")
    timeline.add_argument("schedule_id")
    timeline.add_argument("--tenant", required=True, help="tenant that owns the schedule")
    timeline.add_argument("--from", dest="from_", help="start of the window (default: an hour before --to)")
    timeline.add_argument("--to", help="end of the window (default: now)")
    timeline.add_argument("--json", action="store_true", help="print the timeline as one JSON object")
    timeline.set_defaults(func=cmd_timeline)

    importing = actions.add_parser(
        "import", help="create schedules from a JSONL file in batches (idempotent: importing again creates none)"
    )
    importing.add_argument("file", help='one schedule per line: {"idempotency_key": K, "schedule": {...}} or a body')
    importing.add_argument("--tenant", required=True, help="tenant that owns the schedules")
    importing.add_argument("--batch", type=int, default=MAX_BATCH, help=f"schedules per transaction (max {MAX_BATCH})")
    importing.add_argument("--json", action="store_true", help="print the summary as compact JSON")
    importing.set_defaults(func=cmd_import)

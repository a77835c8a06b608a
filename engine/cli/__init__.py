"""The ``chronoq`` command: the operator's edge.

The CLI is the only code that reads the environment (``engine.cli.endpoints``:
``CHRONOQ_*`` variables and the state file of a running ``chronoq up``) and,
with ``engine.loops.service`` (which runs a process's roles), the only code
that wires engine, relay and consumer components together; ``relay`` and
``consumers`` never import ``engine``. Only the CLI and the tests start the
embedded PostgreSQL and broker (``engine.cli.embedded``).

Each module registers one area's subcommands: ``stack_commands`` (up, api,
migrate, engine, relay), ``tenant_commands`` (tenant create),
``schedule_commands`` (schedule ...), ``calendar_commands`` (calendar ...),
``dlq_commands`` (dlq list, replay), ``history_commands`` (history prune, retention), ``consume_command`` (consume),
``kafka_command`` (kafka fetch, kafka acls) and ``status_command`` (status).

Exit status: 0 on success, 2 for invalid input (one line naming the field,
nothing written), 1 for any other chronoq error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from engine.cli.log_format import configure_logging
from schemas.errors import ChronoqError, InvalidInput


def print_json(value: Any, compact: bool) -> None:
    """JSON on stdout: one line when ``compact`` (``--json``), indented otherwise."""
    option = 0 if compact else orjson.OPT_INDENT_2
    sys.stdout.write(orjson.dumps(value, option=option).decode() + "\n")
    sys.stdout.flush()


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM set ``stop``: services finish in order instead of dying mid-handoff."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def build_parser() -> argparse.ArgumentParser:
    from engine.cli import (
        calendar_commands,
        consume_command,
        dlq_commands,
        history_commands,
        kafka_command,
        operator_commands,
        reconcile_command,
        schedule_commands,
        stack_commands,
        status_command,
        target_commands,
        tenant_commands,
    )

    parser = argparse.ArgumentParser(prog="chronoq", description="Multi-tenant distributed job scheduler.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for area in (
        stack_commands,
        tenant_commands,
        target_commands,
        operator_commands,
        schedule_commands,
        calendar_commands,
        consume_command,
        dlq_commands,
        history_commands,
        kafka_command,
        status_command,
        reconcile_command,
    ):
        area.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.INFO if args.command == "up" else logging.WARNING
    configure_logging(level)
    try:
        return args.func(args)
    except InvalidInput as err:
        print(f"chronoq: invalid input: {err}", file=sys.stderr)
        return 2
    except ChronoqError as err:
        print(f"chronoq: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

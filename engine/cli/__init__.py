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
import importlib
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


#: Each command and the module that registers it. ``main`` imports only the module of the command on the
#: command line: an area's imports (the engine's loops, the console, aiokafka) cost a second of start-up,
#: which a ``chronoq schedule create`` should not pay for ``chronoq up``'s sake. ``--help`` without a
#: command, or an unknown one, imports them all (tests/unit/test_cli_commands.py checks this table against
#: what the modules register).
COMMAND_MODULES: dict[str, str] = {
    "up": "stack_commands",
    "api": "stack_commands",
    "migrate": "stack_commands",
    "engine": "stack_commands",
    "relay": "stack_commands",
    "tenant": "tenant_commands",
    "target": "target_commands",
    "operator": "operator_commands",
    "schedule": "schedule_commands",
    "calendar": "calendar_commands",
    "consume": "consume_command",
    "dlq": "dlq_commands",
    "history": "history_commands",
    "kafka": "kafka_command",
    "status": "status_command",
    "reconcile": "reconcile_command",
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: with only its command's module registered when ``argv`` names a known
    command, with every command otherwise (``None``, ``--help``, a typo: the full list and argparse's
    suggestions)."""
    command = next((arg for arg in argv or () if not arg.startswith("-")), None)
    every_module = list(dict.fromkeys(COMMAND_MODULES.values()))
    modules = [COMMAND_MODULES[command]] if command in COMMAND_MODULES else every_module
    parser = argparse.ArgumentParser(prog="chronoq", description="Multi-tenant distributed job scheduler.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in modules:
        importlib.import_module(f"engine.cli.{module}").register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
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

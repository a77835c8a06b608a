"""What a process loads at start: the CLI only its command's module (its table of commands is what the modules
register), an engine or relay process the API only when it serves it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from engine.cli import COMMAND_MODULES, build_parser


def registered(parser: argparse.ArgumentParser) -> set[str]:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(commands.choices)


def test_the_table_names_every_registered_command_and_nothing_else():
    assert registered(build_parser()) == set(COMMAND_MODULES)
    assert registered(build_parser(["--help"])) == set(COMMAND_MODULES)


@pytest.mark.parametrize("command", sorted(COMMAND_MODULES))
def test_a_named_command_registers_its_module_alone(command):
    alone = build_parser(["-v", command])
    assert command in registered(alone)
    assert registered(alone) == {c for c, m in COMMAND_MODULES.items() if m == COMMAND_MODULES[command]}


def test_an_unknown_command_is_refused_with_the_full_list():
    parser = build_parser(["shedule"])
    assert registered(parser) == set(COMMAND_MODULES)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["shedule"])
    assert exit_info.value.code == 2


def loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported after running ``statement``."""
    probe = f"import json, sys; {statement}; print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def test_a_control_command_loads_neither_the_engines_loops_nor_the_console_nor_its_server():
    run = "from engine.cli import main; main(['schedule', 'preview', '--cron', '0 9 * * *', '-n', '1', '--json'])"
    assert loaded_after(run, ("engine.loops.service", "engine.api.console.app", "uvicorn")) == []


def test_an_engine_or_relay_process_loads_the_api_and_console_only_to_serve_them():
    api = ("engine.api.app", "engine.api.console.app", "engine.api.openapi")
    assert loaded_after("import engine.loops.service", api) == []

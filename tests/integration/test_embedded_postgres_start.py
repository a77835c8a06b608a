"""Embedded PostgreSQL servers started by several processes at once (pytest-xdist workers, CI on a fresh
machine) all start: the wheel's first-use setup (the system user, the data directory's owner) is serialized
across processes (engine/cli/embedded/postgres.py, ``_one_start_at_a_time``)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_AND_STOP = """
import sys
from pathlib import Path
from engine.cli.embedded.postgres import EmbeddedPostgres
server = EmbeddedPostgres(Path(sys.argv[1]))
server.start()
try:
    print("started", server.pid, flush=True)
finally:
    server.stop()
"""


def test_three_processes_starting_servers_at_once_all_start() -> None:
    with tempfile.TemporaryDirectory(prefix="chronoq-test-concurrent-start-") as base:
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", START_AND_STOP, str(Path(base) / f"server-{n}" / "postgres")],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(3)
        ]
        outcomes = [process.communicate(timeout=90) for process in processes]
    for process, (out, err) in zip(processes, outcomes, strict=True):
        assert process.returncode == 0, err[-2000:]
        assert out.startswith("started "), (out, err[-2000:])

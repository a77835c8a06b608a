"""Embedded PostgreSQL servers started by several processes at once (pytest-xdist workers, CI on a fresh
machine) all start: the wheel's first-use setup (the system user, the data directory's owner) is serialized
across processes (engine/cli/embedded/postgres.py, ``_one_start_at_a_time``). A fresh server gets its
start-up parameters once (engine/cli/embedded/server_sizing.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg
import pytest

from engine.cli.embedded.postgres import EmbeddedPostgres
from engine.cli.embedded.server_sizing import OVERRIDE_VARIABLE

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


async def _shown(server: EmbeddedPostgres, *names: str) -> list[str]:
    conn = await asyncpg.connect(server.url("postgres"))
    try:
        return [await conn.fetchval(f"SHOW {name}") for name in names]
    finally:
        await conn.close()


def test_a_fresh_server_gets_its_buffer_cache_and_settings_and_keeps_what_an_operator_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sized at its first start (here by the override, to stay small), with the caller's settings, in one
    restart; a value set later (configure, ALTER SYSTEM) survives restarts; a running server is adopted as
    it is, never restarted."""
    monkeypatch.setenv(OVERRIDE_VARIABLE, "144MB")
    server = EmbeddedPostgres(tmp_path / "postgres", settings={"max_connections": "123"})
    server.start()
    try:
        assert asyncio.run(_shown(server, "shared_buffers", "max_connections")) == ["144MB", "123"]
        asyncio.run(server.configure({"shared_buffers": "160MB"}))
        server.stop()
        server.start()
        assert asyncio.run(_shown(server, "shared_buffers", "max_connections")) == ["160MB", "123"]
        monkeypatch.setenv(OVERRIDE_VARIABLE, "200MB")
        adopted = EmbeddedPostgres(tmp_path / "postgres")
        adopted.start()
        assert adopted.pid == server.pid
        assert asyncio.run(_shown(adopted, "shared_buffers")) == ["160MB"]
    finally:
        server.stop()

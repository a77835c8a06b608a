"""`chronoq engine` as its own process, on the database's clock (production's), for e2e tests."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path


async def start_engine(engine_db: str, kafka_bootstrap: str, log: Path, *flags: str) -> asyncio.subprocess.Process:
    """`chronoq engine [flags]` (every engine role) against these servers, its output appended to ``log``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")}
    env.update(CHRONOQ_DATABASE_URL=engine_db, CHRONOQ_KAFKA_BOOTSTRAP=kafka_bootstrap)
    with log.open("ab") as out:  # the child keeps its own descriptor
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "engine.cli", "engine", *flags, env=env, stdout=out, stderr=out
        )


async def stop_engine(engine: asyncio.subprocess.Process) -> None:
    """SIGTERM (after SIGCONT, should a test have stopped it) and wait for the exit."""
    if engine.returncode is None:
        engine.send_signal(signal.SIGCONT)
        engine.send_signal(signal.SIGTERM)
        await asyncio.wait_for(engine.wait(), 30)

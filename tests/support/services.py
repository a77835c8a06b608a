"""Running the engine's roles, or a consumer app, inside a test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from consumers.app import ConsumerApp
from engine.control.command_processor import CommandConfig
from engine.loops.attempt_processor import AttemptProcessorConfig
from engine.loops.overlap_gate import OverlapGateConfig
from engine.loops.reaper import ReaperConfig
from engine.loops.service import ServiceConfig, run_services
from relay.dispatcher import RelayConfig
from schemas.clock import Clock


def fast_services(**overrides: Any) -> ServiceConfig:
    """A ServiceConfig for tests: short consumer-group sessions (on the embedded broker a group's first
    join waits about half the session timeout) and short idle intervals, so tests wait on work, not timers."""
    base: dict[str, Any] = dict(
        attempts=AttemptProcessorConfig(session_timeout=2.0, heartbeat_interval=0.4),
        commands=CommandConfig(session_timeout=2.0, heartbeat_interval=0.4),
        reaper=ReaperConfig(interval=0.05),
        relay=RelayConfig(idle_interval=0.05),
        overlap_gate=OverlapGateConfig(interval=0.05),
        tenant_gate_interval=0.05,
    )
    return ServiceConfig(**{**base, **overrides})


@contextlib.asynccontextmanager
async def services_running(
    engine_db: str, kafka_bootstrap: str, config: ServiceConfig, clock: Clock | None = None
) -> AsyncIterator[asyncio.Event]:
    """The configured roles, running in this test's event loop until the block ends."""
    stop = asyncio.Event()
    services = asyncio.create_task(run_services(engine_db, kafka_bootstrap, stop, config, clock))
    try:
        yield stop
    finally:
        stop.set()
        await services


class Running:
    """``async with Running(app):`` runs a consumer app in the background and stops it after the block."""

    def __init__(self, app: ConsumerApp) -> None:
        self.app, self.stop = app, asyncio.Event()

    async def __aenter__(self) -> ConsumerApp:
        self.task = asyncio.create_task(self.app.run(self.stop))
        return self.app

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await self.task

"""Running the engine's loops (materializer, HTTP API) and the relay in one process.

``chronoq up`` runs them all beside the embedded stack; ``chronoq engine``,
``chronoq relay`` and ``chronoq api`` run one each against external endpoints
(the production shape in compose.yaml). Each loop stops when the shared stop
event is set.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from engine.api.app import Api
from engine.api.server import serve as serve_api
from engine.loops.attempt_processor import AttemptProcessor, AttemptProcessorConfig
from engine.control.command_processor import CommandConfig, CommandProcessor
from engine.control.schedules import ControlPlane
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.overlap_gate import OverlapGate, OverlapGateConfig
from engine.loops.reaper import Reaper, ReaperConfig
from relay.dispatcher import Relay, RelayConfig
from relay.publisher import KafkaPublisher, PublisherConfig
from schemas.clock import Clock, DatabaseClock
from schemas.connections import create_pool
from schemas.migrations import apply_migrations

log = logging.getLogger("chronoq.service")


@dataclass(frozen=True)
class ServiceConfig:
    run_materializer: bool = True
    run_relay: bool = True
    api_socket: socket.socket | None = None   # serve the HTTP API on this bound socket
    run_commands: bool = False                 # consume chronoq.commands
    commands: CommandConfig = field(default_factory=CommandConfig)
    materializer: MaterializerConfig = field(default_factory=MaterializerConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)
    run_attempts: bool = True                  # consume chronoq.attempts (attempt events from consumers)
    attempts: AttemptProcessorConfig = field(default_factory=AttemptProcessorConfig)
    run_reaper: bool = True                    # time out expired attempt leases, retry or dead-letter them
    reaper: ReaperConfig = field(default_factory=ReaperConfig)
    run_overlap_gate: bool = True              # dispatch or skip occurrences of skip_if_running/queue_one schedules
    overlap_gate: OverlapGateConfig = field(default_factory=OverlapGateConfig)


async def migrate(database_url: str) -> list[str]:
    """Apply the engine's migrations; return the names applied now."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            return [f"{m.version:04d}_{m.name}" for m in await apply_migrations(conn, "engine")]
    finally:
        await pool.close()


async def run_services(database_url: str, kafka_bootstrap: str, stop: asyncio.Event,
                       config: ServiceConfig | None = None, clock: Clock | None = None) -> None:
    """Run the selected loops until ``stop`` is set, then close everything they opened."""
    config = config or ServiceConfig()
    clock = clock or DatabaseClock()
    async with AsyncExitStack() as resources:
        pool = await create_pool(database_url, min_size=2, max_size=8)
        resources.push_async_callback(pool.close)
        tasks: list[asyncio.Task[None]] = []
        if config.run_materializer:
            materializer = Materializer(pool, config.materializer, clock)
            tasks.append(asyncio.create_task(materializer.run(stop), name="materializer"))
        if config.run_relay:
            publisher = KafkaPublisher(PublisherConfig(kafka_bootstrap))
            await publisher.start()
            resources.push_async_callback(publisher.stop)
            relay = Relay.create(pool, publisher, config.relay, clock)
            tasks.append(asyncio.create_task(relay.run(stop), name="relay"))
        if config.run_commands:
            processor = CommandProcessor(pool, kafka_bootstrap, ControlPlane(pool, clock), config.commands)
            tasks.append(asyncio.create_task(processor.run(stop), name="commands"))
        if config.run_attempts:
            attempts = AttemptProcessor(pool, kafka_bootstrap, config.attempts, clock)
            tasks.append(asyncio.create_task(attempts.run(stop), name="attempts"))
        if config.run_reaper:
            tasks.append(asyncio.create_task(Reaper(pool, config.reaper, clock).run(stop), name="reaper"))
        if config.run_overlap_gate:
            gate = OverlapGate(pool, config.overlap_gate, clock)
            tasks.append(asyncio.create_task(gate.run(stop), name="overlap-gate"))
        if config.api_socket is not None:
            api = Api(pool, ControlPlane(pool, clock))
            tasks.append(asyncio.create_task(serve_api(api, config.api_socket, stop), name="api"))
        try:
            await asyncio.gather(*tasks)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

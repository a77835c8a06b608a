"""Running a process's roles: the engine's loops, the relay and the HTTP API, until stopped.

A process runs a set of :class:`Role` values. ``chronoq up`` runs every role
beside the embedded stack; in the production shape (compose.yaml) ``chronoq
engine`` runs :data:`ENGINE_ROLES`, ``chronoq relay`` the relay and ``chronoq
api`` the API, each against external endpoints. A process opens only what
its roles use: the API alone needs the database and no Kafka bootstrap.

Every role runs as one task; they share one connection pool and one stop
event. When any of them ends (or fails to start), the others are stopped and
everything opened is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import asyncpg

from engine.api.app import Api
from engine.api.console.app import Console
from engine.api.metrics_endpoint import MetricsEndpoint
from engine.api.operator_routes import OperatorRoutes
from engine.api.server import serve as serve_api
from engine.api.site import Site
from engine.control.command_processor import CommandConfig, CommandProcessor
from engine.control.schedules import ControlPlane
from engine.loops.attempt_processor import AttemptProcessor, AttemptProcessorConfig
from engine.loops.backlog_gauges import BacklogGauges
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.overlap_gate import OverlapGate, OverlapGateConfig
from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reaper import Reaper, ReaperConfig
from engine.loops.reporting import SUMMARY_EVERY
from relay.dispatcher import Relay, RelayConfig
from relay.publisher import KafkaPublisher, PublisherConfig
from schemas.clock import Clock, DatabaseClock
from schemas.connections import create_pool
from schemas.kafka_security import PLAINTEXT, KafkaSecurity
from schemas.migrations import apply_migrations

log = logging.getLogger("chronoq.service")


class Role(Enum):
    """One thing a chronoq process can run."""

    MATERIALIZER = "materializer"  # due schedules -> occurrences + outbox rows
    ATTEMPTS = "attempts"  # apply attempt events from consumers (chronoq.attempts)
    REAPER = "reaper"  # time out expired attempt leases: retry or dead-letter
    OVERLAP_GATE = "overlap-gate"  # dispatch, hold or skip deliveries of skip_if_running/queue_one schedules
    COMMANDS = "commands"  # apply signed scheduling commands (chronoq.commands)
    RELAY = "relay"  # due outbox rows -> Kafka
    API = "api"  # the HTTP API, the console (/ui) and /metrics on ServiceConfig.api_socket
    GAUGES = "gauges"  # record the backlog gauges (due, outbox, queue age, held, DLQ) every few seconds

    @property
    def needs_kafka(self) -> bool:
        return self in (Role.ATTEMPTS, Role.COMMANDS, Role.RELAY)


#: What ``chronoq engine`` runs: everything between a stored schedule and a consumer's report, except the relay.
ENGINE_ROLES = frozenset({Role.MATERIALIZER, Role.ATTEMPTS, Role.REAPER, Role.OVERLAP_GATE, Role.COMMANDS, Role.GAUGES})
#: What ``chronoq api`` runs: the site and the backlog gauges its /metrics shows.
API_ROLES = frozenset({Role.API, Role.GAUGES})
#: The occurrence pipeline without commands and API: the default of :class:`ServiceConfig`.
PIPELINE_ROLES = frozenset({Role.MATERIALIZER, Role.ATTEMPTS, Role.REAPER, Role.OVERLAP_GATE, Role.RELAY})
#: What ``chronoq up`` runs.
ALL_ROLES = frozenset(Role)


@dataclass(frozen=True)
class ServiceConfig:
    """roles: what this process runs (default :data:`PIPELINE_ROLES`).
    api_socket: the bound socket the API serves on; required with :attr:`Role.API`.
    metrics_socket: a bound socket serving only ``/metrics`` (``--metrics-port`` of engine and relay
        processes; the API serves it on its own port).
    summary_every: seconds between each loop's one-line summary log (0: none).
    idempotent_publisher: the relay uses the idempotent producer (the broker must
        support it: Apache Kafka does, tansu does not; default False).
    kafka_security: TLS and SASL of every Kafka client these roles open (default PLAINTEXT).
    The other fields configure one role each.
    """

    roles: frozenset[Role] = PIPELINE_ROLES
    api_socket: socket.socket | None = None
    metrics_socket: socket.socket | None = None
    summary_every: float = SUMMARY_EVERY
    idempotent_publisher: bool = False
    kafka_security: KafkaSecurity = PLAINTEXT
    materializer: MaterializerConfig = field(default_factory=MaterializerConfig)
    attempts: AttemptProcessorConfig = field(default_factory=AttemptProcessorConfig)
    reaper: ReaperConfig = field(default_factory=ReaperConfig)
    overlap_gate: OverlapGateConfig = field(default_factory=OverlapGateConfig)
    commands: CommandConfig = field(default_factory=CommandConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)

    def validate(self, kafka_bootstrap: str | None) -> None:
        if not self.roles:
            raise ValueError("give at least one role to run")
        if (Role.API in self.roles) != (self.api_socket is not None):
            raise ValueError("the api role and api_socket go together")
        needing = sorted(role.value for role in self.roles if role.needs_kafka)
        if needing and not kafka_bootstrap:
            raise ValueError(f"{', '.join(needing)} need a Kafka bootstrap")


async def migrate(database_url: str) -> list[str]:
    """Apply the engine's migrations; return the names applied now."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            return [f"{m.version:04d}_{m.name}" for m in await apply_migrations(conn, "engine")]
    finally:
        await pool.close()


async def run_services(
    database_url: str,
    kafka_bootstrap: str | None,
    stop: asyncio.Event,
    config: ServiceConfig | None = None,
    clock: Clock | None = None,
) -> None:
    """Run the configured roles until ``stop`` is set (or one of them ends), then close what they opened."""
    config = config or ServiceConfig()
    config.validate(kafka_bootstrap)
    clock = clock or DatabaseClock()
    async with AsyncExitStack() as resources:
        pool = await create_pool(database_url, min_size=2, max_size=8)
        resources.push_async_callback(pool.close)
        runs: dict[Role, Callable[[], Coroutine[Any, Any, None]]] = {}
        roles, every = config.roles, config.summary_every
        if Role.MATERIALIZER in roles:
            materializer = Materializer(pool, config.materializer, clock)
            runs[Role.MATERIALIZER] = lambda: materializer.run(stop, every)
        if Role.ATTEMPTS in roles:
            attempts = AttemptProcessor(pool, kafka_bootstrap, config.attempts, clock, security=config.kafka_security)
            runs[Role.ATTEMPTS] = lambda: attempts.run(stop, every)
        if Role.REAPER in roles:
            reaper = Reaper(pool, config.reaper, clock)
            runs[Role.REAPER] = lambda: reaper.run(stop, every)
        if Role.OVERLAP_GATE in roles:
            gate = OverlapGate(pool, config.overlap_gate, clock)
            runs[Role.OVERLAP_GATE] = lambda: gate.run(stop, every)
        if Role.COMMANDS in roles:
            assert kafka_bootstrap is not None
            commands = CommandProcessor(
                pool, kafka_bootstrap, ControlPlane(pool, clock), config.commands, security=config.kafka_security
            )
            runs[Role.COMMANDS] = lambda: commands.run(stop, every)
        if Role.RELAY in roles:
            assert kafka_bootstrap is not None
            publisher = KafkaPublisher(
                PublisherConfig(kafka_bootstrap, idempotent=config.idempotent_publisher, security=config.kafka_security)
            )
            await publisher.start()
            resources.push_async_callback(publisher.stop)
            relay_loop = relay_periodic_loop(Relay.create(pool, publisher, config.relay, clock), config.relay, every)
            runs[Role.RELAY] = lambda: relay_loop.run(stop)
        if Role.API in roles:
            assert config.api_socket is not None
            site, api_socket = api_site(pool, clock), config.api_socket
            runs[Role.API] = lambda: serve_api(site, api_socket, stop)
        if Role.GAUGES in roles:
            gauges = BacklogGauges(pool, clock)
            runs[Role.GAUGES] = lambda: gauges.run(stop, every)
        tasks = [asyncio.create_task(run(), name=role.value) for role, run in runs.items()]
        if config.metrics_socket is not None:  # --metrics-port: this process's /metrics on a port of its own
            tasks.append(asyncio.create_task(serve_api(MetricsEndpoint(), config.metrics_socket, stop), name="metrics"))
        log.info("running %s", ", ".join(sorted(role.value for role in runs)), extra={"action": "service.start"})
        try:
            await asyncio.gather(*tasks)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def api_site(pool: asyncpg.Pool, clock: Clock) -> Site:
    """What the API role serves on its port: the JSON API with the operator routes, the console, /metrics."""
    control = ControlPlane(pool, clock)
    api = Api(pool, control, extra_routes=OperatorRoutes(control).routes())
    return Site(api, Console(pool, control), MetricsEndpoint())


def relay_periodic_loop(relay: Relay, config: RelayConfig, summary_every: float = SUMMARY_EVERY) -> PeriodicLoop:
    """The relay's passes under the periodic skeleton (the relay package has no loop of its own)."""

    async def run_pass() -> PassOutcome:
        report = await relay.run_once()
        return PassOutcome(
            {"published": report.published, "failed": report.failed, "fenced": report.fenced},
            more=report.claimed >= config.batch_size,
            retry_later=report.failed > 0,
        )

    async def gauges() -> dict[str, int]:
        return {"backlog": await relay.record_backlog()}

    timing = LoopTiming(config.idle_interval, config.error_backoff, summary_every)
    return PeriodicLoop("relay", run_pass, timing, logging.getLogger("chronoq.relay"), gauges=gauges)

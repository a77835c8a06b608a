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
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import asyncpg

from engine.api.metrics_endpoint import MetricsEndpoint
from engine.api.server import serve as serve_api
from engine.control.command_processor import CommandConfig, CommandProcessor
from engine.control.schedules import ControlPlane
from engine.loops.attempt_processor import AttemptProcessor, AttemptProcessorConfig
from engine.loops.backlog_gauges import BacklogGauges
from engine.loops.dispatch_settler import DispatchSettler, SettlerConfig
from engine.loops.history_partitions import HistoryPartitions
from engine.loops.lease_thread import LoopTicks, run_on_own_thread
from engine.loops.loop_lag import LoopLagProbe
from engine.loops.materializer import Materializer, MaterializerConfig, MaterializerHooks
from engine.loops.overlap_gate import OverlapGate, OverlapGateConfig
from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reaper import Reaper, ReaperConfig
from engine.loops.reporting import SUMMARY_EVERY
from engine.loops.shard_leases import LEASE_SERVER_SETTINGS, ShardLeaseConfig, ShardLeases, default_node_id
from engine.loops.stuck_occurrences import StuckOccurrences, StuckOccurrencesConfig
from engine.loops.tenant_gate import TenantGate
from engine.loops.tenant_usage_folds import TenantUsageFolds
from relay.ahead_lane import AheadLaneStore
from relay.ahead_relay import AheadRelay, AheadRelayConfig, AheadRelayHooks
from relay.dispatcher import Relay, RelayConfig
from relay.librdkafka_publisher import LibrdkafkaConfig, LibrdkafkaPublisher
from relay.publisher import KafkaPublisher, PublisherConfig
from schemas.clock import Clock, DatabaseClock, pause
from schemas.connections import create_pool, create_pool_when_ready
from schemas.garbage_collection import freeze_start_up_heap, tune_for_throughput
from schemas.kafka_security import PLAINTEXT, KafkaSecurity, Startable
from schemas.migrations import apply_migrations
from schemas.shard_ownership import ShardOwnership
from schemas.start_retries import retry_until_ready

if TYPE_CHECKING:
    from engine.api.site import Site

log = logging.getLogger("chronoq.service")


# ---------------------------------------------------------------------------------------------- the data plane
#
# One engine node's data plane: shard leases, the shard-owning materializer, the ahead-lane relay, settling.
# Several nodes (processes, hosts) share the shards of one database. Each that runs the ``dispatch`` role
# leases its share of the shards (engine.loops.shard_leases), materializes only those shards ahead of time into
# the ahead lane, and publishes them with its own relay: the relay reads the in-memory ShardOwnership, so it
# runs in the process that holds the leases. The late lane (the outbox) is drained by any process running the
# ``relay`` role. The settle pass records ENQUEUED for published ahead-lane rows while this node's relay is
# quiet. Its connections carry server-side limits (DATA_PLANE_SERVER_SETTINGS): a paused node cannot keep a
# transaction or its row locks open past a few seconds, so it cannot block the shard's next owner.

#: Server-side limits on every data-plane connection (milliseconds): a paused or stuck process cannot keep a
#: transaction (and its row locks) open, wait on a lock, or run one statement past these.
DATA_PLANE_SERVER_SETTINGS = {
    "idle_in_transaction_session_timeout": "5000",
    "lock_timeout": "5000",
    "statement_timeout": "60000",
    # A page read sorts up to rows_per_shard x shards rows of ~500 bytes: in memory, not spilled to disk.
    "work_mem": "32MB",
}


@dataclass(frozen=True)
class DataPlaneConfig:
    """node_id: this node's name in engine_nodes (default host:pid:random).
    leases, dispatch, settler: each loop's configuration (the materializer's is ServiceConfig.materializer).
    idempotent_producer: the librdkafka idempotent producer (Apache Kafka; tansu lacks InitProducerId).
    partitions: partitions of the topics the publisher creates (None: the default).
    pool_size: connections of the data plane's own pool (default 8).
    metrics_interval: seconds between backlog gauge readings (default 5).
    hooks: awaited at the ahead relay's handoffs (tests kill the process there).
    materializer_hooks: awaited at the shard-owning materializer's handoffs.
    compression: of the ahead-lane publisher's batches (default "lz4"; "none": uncompressed).
    """

    node_id: str | None = None
    leases: ShardLeaseConfig = field(default_factory=ShardLeaseConfig)
    dispatch: AheadRelayConfig = field(default_factory=AheadRelayConfig)
    settler: SettlerConfig = field(default_factory=SettlerConfig)
    idempotent_producer: bool = False
    partitions: int | None = None
    pool_size: int = 8
    metrics_interval: float = 5.0
    hooks: AheadRelayHooks | None = None
    materializer_hooks: MaterializerHooks | None = None
    compression: str = "lz4"


class Role(Enum):
    """One thing a chronoq process can run."""

    MATERIALIZER = "materializer"  # due schedules -> occurrences + deliveries (ahead lane with DISPATCH, else outbox)
    DISPATCH = "dispatch"  # shard leases + the ahead-lane relay + the settle pass (the shard owner's data plane)
    ATTEMPTS = "attempts"  # apply attempt events from consumers (chronoq.attempts)
    REAPER = "reaper"  # time out expired attempt leases: retry or dead-letter
    OVERLAP_GATE = "overlap-gate"  # dispatch, hold or skip deliveries of skip_if_running/queue_one schedules
    TENANT_GATE = "tenant-gate"  # release deliveries held for a tenant's max_running as its occurrences finish
    COMMANDS = "commands"  # apply signed scheduling commands (chronoq.commands)
    STUCK = "stuck-occurrences"  # republish or flag ENQUEUED occurrences whose attempt events never came
    RELAY = "relay"  # due outbox rows -> Kafka
    API = "api"  # the HTTP API, the console (/ui) and /metrics on ServiceConfig.api_socket
    GAUGES = "gauges"  # record the backlog gauges (due, outbox, queue age, held, DLQ) every few seconds
    PARTITIONS = "history-partitions"  # create the history tables' day partitions ahead (migration 0016)
    USAGE = "tenant-usage"  # fold tenants' quota-usage change logs into their counters (migration 0024)

    @property
    def needs_kafka(self) -> bool:
        return self in (Role.ATTEMPTS, Role.COMMANDS, Role.RELAY, Role.DISPATCH)


#: What ``chronoq engine`` runs: everything between a stored schedule and a consumer's report, with the
#: ahead-lane dispatch of the shards it leases; the late lane (outbox) is the relay's.
ENGINE_ROLES = frozenset(
    {
        Role.MATERIALIZER,
        Role.DISPATCH,
        Role.ATTEMPTS,
        Role.REAPER,
        Role.OVERLAP_GATE,
        Role.TENANT_GATE,
        Role.COMMANDS,
        Role.GAUGES,
        Role.STUCK,
        Role.PARTITIONS,
        Role.USAGE,
    }
)
#: What ``chronoq api`` runs: the site and the backlog gauges its /metrics shows.
API_ROLES = frozenset({Role.API, Role.GAUGES})
#: The occurrence pipeline without commands and API: the default of :class:`ServiceConfig`.
PIPELINE_ROLES = frozenset(
    {
        Role.MATERIALIZER,
        Role.DISPATCH,
        Role.ATTEMPTS,
        Role.REAPER,
        Role.OVERLAP_GATE,
        Role.TENANT_GATE,
        Role.RELAY,
        Role.STUCK,
        Role.PARTITIONS,
        Role.USAGE,
    }
)
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
    freeze_start_up_heap: once every role has started, move the objects alive then out of the garbage
        collector's way (``schemas.garbage_collection.freeze_start_up_heap``). Set by the entry points that
        own their process (``chronoq engine``/``up``, the load tests' nodes), never by an embedding
        application or a test process, whose heap is not ours to freeze.
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
    tenant_gate_interval: float = 1.0  # seconds between the tenant gate's passes
    commands: CommandConfig = field(default_factory=CommandConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)
    data_plane: DataPlaneConfig = field(default_factory=DataPlaneConfig)
    stuck_occurrences: StuckOccurrencesConfig = field(default_factory=StuckOccurrencesConfig)
    freeze_start_up_heap: bool = False

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
    tune_for_throughput()  # the data plane allocates Records by the page (schemas/garbage_collection.py)
    async with AsyncExitStack() as resources:
        # Restarted into a database that refuses connections for now (too many clients, restarting): wait.
        pool = await create_pool_when_ready(database_url, stop, log, min_size=2, max_size=8)
        if pool is None:
            return
        resources.push_async_callback(pool.close)
        runs: dict[Role, Callable[[], Coroutine[Any, Any, None]]] = {}
        tasks_extra: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {}
        roles, every = config.roles, config.summary_every
        if Role.DISPATCH in roles:
            # The shard owner's data plane; with MATERIALIZER the materializer runs inside it, on the leased
            # shards and into the ahead lane. Without DISPATCH a materializer works on every shard and writes
            # the outbox only (a process that cannot publish the ahead lane must not fill it).
            assert kafka_bootstrap is not None
            plane = await open_data_plane(
                resources,
                database_url,
                kafka_bootstrap,
                stop,
                config.data_plane,
                config.materializer if Role.MATERIALIZER in roles else None,
                clock,
                config.kafka_security,
            )
            if not plane:
                return  # stopped while waiting for the database
            tasks_extra = {name: run for name, run in plane.items() if name != "dispatch"}
            runs[Role.DISPATCH] = plane["dispatch"]
        elif Role.MATERIALIZER in roles:
            materializer = Materializer(pool, config.materializer, clock)
            runs[Role.MATERIALIZER] = lambda: materializer.run(stop, every)
        runs.update(pool_loops(pool, kafka_bootstrap, stop, config, clock))
        if Role.RELAY in roles:
            assert kafka_bootstrap is not None
            settings = PublisherConfig(
                kafka_bootstrap, idempotent=config.idempotent_publisher, security=config.kafka_security
            )
            publisher = await start_publisher(lambda: KafkaPublisher(settings), stop)
            if publisher is None:
                return  # stopped while waiting for the broker
            resources.push_async_callback(publisher.stop)
            relay_loop = relay_periodic_loop(Relay.create(pool, publisher, config.relay, clock), config.relay, every)
            runs[Role.RELAY] = lambda: relay_loop.run(stop)
        if Role.API in roles:
            assert config.api_socket is not None
            site, api_socket = api_site(pool, clock), config.api_socket
            runs[Role.API] = lambda: serve_api(site, api_socket, stop)
        tasks = [asyncio.create_task(run(), name=role.value) for role, run in runs.items()]
        tasks += [asyncio.create_task(run(), name=name) for name, run in tasks_extra.items()]
        if config.metrics_socket is not None:  # --metrics-port: this process's /metrics on a port of its own
            tasks.append(asyncio.create_task(serve_api(MetricsEndpoint(), config.metrics_socket, stop), name="metrics"))
        log.info("running %s", ", ".join(sorted(role.value for role in runs)), extra={"action": "service.start"})
        if config.freeze_start_up_heap:
            freeze_start_up_heap()
        try:
            await asyncio.gather(*tasks)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


_P = TypeVar("_P", bound=Startable)


async def start_publisher(build: Callable[[], _P], stop: asyncio.Event) -> _P | None:
    """A started publisher, waiting for a broker that is not accepting connections yet (started after the
    engine, restarting): each try builds a new one, since a client whose start failed is closed. None when
    ``stop`` came first; a refused credential or certificate is raised at once."""

    async def attempt() -> _P:
        publisher = build()
        await publisher.start()
        return publisher

    return await retry_until_ready(attempt, stop, log, step="connect to Kafka", action="kafka.connect_retry")


def pool_loops(
    pool: asyncpg.Pool, kafka_bootstrap: str | None, stop: asyncio.Event, config: ServiceConfig, clock: Clock
) -> dict[Role, Callable[[], Coroutine[Any, Any, None]]]:
    """The roles that need only the shared pool (and Kafka, for the processors), by role."""
    roles, every = config.roles, config.summary_every
    runs: dict[Role, Callable[[], Coroutine[Any, Any, None]]] = {}
    if Role.ATTEMPTS in roles:
        attempts = AttemptProcessor(pool, kafka_bootstrap, config.attempts, clock, security=config.kafka_security)
        runs[Role.ATTEMPTS] = lambda: attempts.run(stop, every)
    if Role.REAPER in roles:
        reaper = Reaper(pool, config.reaper, clock)
        runs[Role.REAPER] = lambda: reaper.run(stop, every)
    if Role.OVERLAP_GATE in roles:
        gate = OverlapGate(pool, config.overlap_gate, clock)
        runs[Role.OVERLAP_GATE] = lambda: gate.run(stop, every)
    if Role.TENANT_GATE in roles:
        tenant_gate = TenantGate(pool, config.tenant_gate_interval)
        runs[Role.TENANT_GATE] = lambda: tenant_gate.run(stop, every)
    if Role.COMMANDS in roles:
        assert kafka_bootstrap is not None
        commands = CommandProcessor(
            pool, kafka_bootstrap, ControlPlane(pool, clock), config.commands, security=config.kafka_security
        )
        runs[Role.COMMANDS] = lambda: commands.run(stop, every)
    if Role.STUCK in roles:
        stuck = StuckOccurrences(pool, kafka_bootstrap, config.stuck_occurrences, clock, config.kafka_security)
        runs[Role.STUCK] = lambda: stuck.run(stop, every)
    if Role.GAUGES in roles:
        gauges = BacklogGauges(pool, clock)
        runs[Role.GAUGES] = lambda: gauges.run(stop, every)
    if Role.PARTITIONS in roles:
        partitions = HistoryPartitions(pool, clock)
        runs[Role.PARTITIONS] = lambda: partitions.run(stop, every)
    if Role.USAGE in roles:
        folds = TenantUsageFolds(pool)
        runs[Role.USAGE] = lambda: folds.run(stop, every)
    return runs


def api_site(pool: asyncpg.Pool, clock: Clock) -> Site:
    """What the API role serves on its port: the JSON API with the operator routes, the console, /metrics."""
    # Imported here, not at the top: the API and the console (their OpenAPI schema, pages and request
    # models) are a third of an engine process's import time, and only a process with the api role serves
    # them; a relay or a restarted engine node is back at work that much sooner.
    from engine.api.app import Api
    from engine.api.console.app import Console
    from engine.api.operator_routes import OperatorRoutes
    from engine.api.site import Site

    control = ControlPlane(pool, clock)
    api = Api(pool, control, extra_routes=OperatorRoutes(control).routes())
    return Site(api, Console(pool, control), MetricsEndpoint())


def relay_periodic_loop(relay: Relay, config: RelayConfig, summary_every: float = SUMMARY_EVERY) -> PeriodicLoop:
    """The relay's passes under the periodic skeleton (the relay package has no loop of its own)."""

    async def run_pass() -> PassOutcome:
        report = await relay.run_once()
        return PassOutcome(
            {
                "published": report.published,
                "failed": report.failed,
                "fenced": report.fenced,
                "refused": report.refused,
                "quarantined": report.quarantined,
            },
            more=report.claimed >= config.batch_size,
            # Refused rows wait refusal_retry_delay on their own: only a transient failure (the broker away)
            # slows the whole loop down.
            retry_later=report.failed > report.refused,
        )

    async def gauges() -> dict[str, int]:
        return {"backlog": await relay.record_backlog()}

    timing = LoopTiming(config.idle_interval, config.error_backoff, summary_every)
    return PeriodicLoop("relay", run_pass, timing, logging.getLogger("chronoq.relay"), gauges=gauges)


async def open_data_plane(
    resources: AsyncExitStack,
    database_url: str,
    kafka_bootstrap: str,
    stop: asyncio.Event,
    config: DataPlaneConfig,
    materializer: MaterializerConfig | None,
    clock: Clock,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
    """Open the node's pool and publisher (closed by ``resources``) and return its loops by name:
    shard leases, the ahead-lane relay, the settle pass, backlog gauges, and — given a config — the
    shard-owning materializer. Nothing (an empty mapping) when ``stop`` came while waiting for the database."""
    ownership = ShardOwnership(config.node_id or default_node_id())

    ownership.bind_loop(asyncio.get_running_loop())

    def server_settings(name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        # An application_name the URL sets is the operator's label for this process (and what the chaos harness
        # terminates backends by): it wins over the node's own name.
        named = {} if "application_name" in parse_qs(urlsplit(database_url).query) else {"application_name": name}
        return {**DATA_PLANE_SERVER_SETTINGS, **(extra or {}), **named}

    pool = await create_pool_when_ready(
        database_url,
        stop,
        log,
        min_size=min(config.pool_size, 2),
        max_size=config.pool_size,
        server_settings=server_settings(f"chronoq-node {ownership.node_id}"[:63]),
    )
    if pool is None:
        return {}
    resources.push_async_callback(pool.close)
    settings: dict[str, Any] = {
        "idempotent": config.idempotent_producer,
        "security": security,
        "compression": config.compression,
    }
    if config.partitions:
        settings["partitions"] = config.partitions
    publisher = await start_publisher(lambda: LibrdkafkaPublisher(LibrdkafkaConfig(kafka_bootstrap, **settings)), stop)
    if publisher is None:
        return {}
    resources.push_async_callback(publisher.stop)
    # The leases renew on a connection and a thread of their own: a burst can keep every connection of the
    # node's pool busy (pages in flight, settling, a materializer pass) and its event loop late, and a renewal
    # queued behind them for lease_ttl loses the node its shards (the new owners then republish whatever was
    # handed over but not yet logged). engine/loops/lease_thread.py has the measurements.
    ticks = LoopTicks()

    async def lease_loop(thread_stop: asyncio.Event) -> None:  # on the lease thread, in its own event loop
        lease_pool = await create_pool_when_ready(
            database_url,
            thread_stop,
            log,
            min_size=1,
            max_size=1,
            server_settings=server_settings(f"chronoq-leases {ownership.node_id}"[:63], LEASE_SERVER_SETTINGS),
        )
        if lease_pool is None:
            return
        try:
            await ShardLeases(lease_pool, ownership, config.leases, clock, ticks=ticks).run(thread_stop)
        finally:
            await lease_pool.close()

    relay = AheadRelay(
        AheadLaneStore(pool, clock, ownership.node_id), publisher, ownership, config.dispatch, clock, hooks=config.hooks
    )
    settler = DispatchSettler(
        pool,
        config.settler,
        clock,
        quiet=lambda: relay.quiet,
        handed_over=relay.handed_over_within,
        node_id=ownership.node_id,
        unlogged=relay.unlogged_rows,
    )
    runs: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
        "shard-leases": lambda: run_on_own_thread(
            lease_loop, stop, ticks, config.leases.interval / 2, f"chronoq-leases {ownership.node_id}"
        ),
        "dispatch": lambda: relay.run(stop),
        "settler": lambda: settler.run(stop),
        "dispatch-gauges": lambda: _gauges(relay, stop, config.metrics_interval),
        "loop-lag": lambda: LoopLagProbe(node_id=ownership.node_id).run(stop),
    }
    if materializer is not None:
        owner = Materializer(pool, materializer, clock, ownership=ownership, hooks=config.materializer_hooks)
        runs["materializer"] = lambda: owner.run(stop)
    return runs


async def _gauges(relay: AheadRelay, stop: asyncio.Event, interval: float) -> None:
    while not stop.is_set():
        try:
            await relay.record_backlog()
        except Exception as err:  # noqa: BLE001 - a gauge must never stop the node
            log.debug("backlog gauge failed", extra={"action": "gauge.error", "error": repr(err)})
        await pause(stop, interval)

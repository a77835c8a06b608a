"""``chronoq up | api | migrate | engine | relay``: running the stack and its roles."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
from datetime import timedelta

from consumers.printer import printing_consumer
from engine.api.server import bind
from engine.cli import stop_on_signals
from engine.cli.consume_command import consumer_config
from engine.cli.embedded.brokers import BROKER_KINDS, BROKER_NAMES, BrokerKind
from engine.cli.embedded.stack import EmbeddedStack, Endpoints
from engine.cli.endpoints import (
    STATE_FILE,
    StackState,
    clear_state,
    external_endpoints,
    read_state,
    redacted_url,
    resolve_database_url,
    resolve_endpoints,
    write_state,
)
from engine.cli.endpoints import home as stack_home
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.materializer import MaterializerConfig
from engine.loops.service import ALL_ROLES, API_ROLES, ENGINE_ROLES, Role, ServiceConfig, migrate, run_services
from engine.loops.stuck_occurrences import StuckOccurrencesConfig
from engine.rules.timing import parse_duration
from schemas.connections import create_pool
from schemas.errors import ChronoqError, Conflict, InvalidInput
from schemas.messages import format_instant
from schemas.observability import configure_telemetry

log = logging.getLogger("chronoq.cli")

#: How far ahead `chronoq up` and `chronoq engine` materialize: the library's 30 s unless --horizon says
#: otherwise. Not longer by default, because two things a user reads grow with it: a tenant's max_running
#: counts occurrences materialized ahead (they hold a place from the moment they are written), and the
#: API's next_run_at is the first fire not yet materialized. A deployment expecting a large burst raises it:
#: the horizon must cover a shard failover (~3 s measured) plus writing the largest bucket, and two nodes
#: here write 10,000-12,000 occurrences/s, so a 500,000 hour-top burst wants `--horizon 2m`.
#: docs/operations.md "Sizing the horizon".
DEFAULT_HORIZON = "30s"
#: Longer horizons make every update and cancel recall more materialized occurrences, and the
#: reconciler's ahead_slack (1 h) must stay far above it.
MAX_HORIZON = timedelta(minutes=30)


def materializer_config(horizon: str) -> MaterializerConfig:
    """The materializer of a deployed engine, from the ``--horizon`` flag (InvalidInput if out of range)."""
    value = parse_duration(horizon, "horizon")
    if not timedelta(seconds=1) <= value <= MAX_HORIZON:
        raise InvalidInput(
            "horizon",
            f"{horizon!r} is out of range: give 1s to 30m, long enough to cover a failover plus writing the"
            " largest burst ahead, short enough that an update recalls few materialized occurrences",
            DEFAULT_HORIZON,
        )
    return MaterializerConfig(horizon=value)


async def _up(demo: bool, api_host: str, api_port: int, kafka: BrokerKind, materializer: MaterializerConfig) -> int:
    stop = asyncio.Event()
    stop_on_signals(stop)
    home = stack_home()
    stack: EmbeddedStack | None = None
    endpoints = external_endpoints()
    if endpoints is None:
        running = read_state(home)
        if running is not None:
            raise ChronoqError(
                f"chronoq is already running in {home} (pid {running.pid}); stop it first"
                " or set CHRONOQ_HOME to another directory"
            )
        stack = EmbeddedStack(home, kafka)
        endpoints = await stack.start()
    elif kafka != "tansu":
        raise ChronoqError(
            f"--kafka {kafka} chooses the embedded broker, but CHRONOQ_DATABASE_URL and"
            " CHRONOQ_KAFKA_BOOTSTRAP name an external stack; unset them or drop --kafka"
        )
    try:
        applied = await migrate(endpoints.database_url)
        api_socket = bind_api(api_host, api_port)
        api_url = "http://{}:{}".format(*api_socket.getsockname()[:2])
        if stack is not None:
            write_state(
                StackState(
                    pid=os.getpid(),
                    database_url=endpoints.database_url,
                    kafka_bootstrap=endpoints.kafka_bootstrap,
                    consumer_database_url=endpoints.consumer_database_url,
                    api_url=api_url,
                    postgres_pid=stack.postgres.pid,
                    kafka_pid=stack.kafka_pid,
                    kafka_kind=stack.kafka_kind,
                ),
                home,
            )
        print("chronoq is up" + (" (embedded stack)" if stack else " (external stack)"), flush=True)
        print(f"  database:  {redacted_url(endpoints.database_url)}", flush=True)
        print(
            f"  kafka:     {endpoints.kafka_bootstrap}"
            + (f"  ({BROKER_NAMES[stack.kafka_kind]})" if stack else f"  ({endpoints.kafka_security.describe()})"),
            flush=True,
        )
        print(f"  api:       {api_url}  (OpenAPI at {api_url}/openapi.json)", flush=True)
        print(f"  console:   {api_url}/ui  (sign in with a tenant's API token or `chronoq operator token`)", flush=True)
        print(f"  metrics:   {api_url}/metrics", flush=True)
        if stack is not None:
            print(f"  state:     {home / STATE_FILE}", flush=True)
        if applied:
            print(f"  migrated:  {', '.join(applied)}", flush=True)
        tasks = [
            asyncio.create_task(
                run_services(
                    endpoints.database_url,
                    endpoints.kafka_bootstrap,
                    stop,
                    ServiceConfig(
                        roles=ALL_ROLES,
                        api_socket=api_socket,
                        idempotent_publisher=endpoints.idempotent_producer,
                        kafka_security=endpoints.kafka_security,
                        materializer=materializer,
                        freeze_start_up_heap=True,
                    ),
                ),
                name="services",
            )
        ]
        if demo:
            tasks.append(asyncio.create_task(_run_demo(endpoints, stop), name="demo"))
        print("Press Ctrl-C (or send SIGTERM) to stop.", flush=True)
        try:
            await stop.wait()
        finally:
            stop.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for task, result in zip(tasks, results, strict=True):
                if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                    log.error(
                        "component failed",
                        extra={"action": "up.component_failed", "component": task.get_name(), "error": repr(result)},
                    )
    finally:
        if stack is not None:
            clear_state(home)
            stack.stop()
        print("chronoq stopped", flush=True)
    return 0


async def _run_demo(endpoints: Endpoints, stop: asyncio.Event) -> None:
    """Create a few demo schedules (idempotently) and print what a consumer applies."""
    pool = await create_pool(endpoints.database_url, min_size=1, max_size=2)
    try:
        try:
            await create_tenant(pool, "demo")
        except Conflict:
            pass  # created by an earlier `chronoq up --demo`
        control = ControlPlane(pool)
        now = await control.now()
        demo_schedules = [
            (
                "demo-every-10s",
                {
                    "kind": "rate",
                    "expression": "10s",
                    "target": "demo.heartbeat",
                    "payload": {"hello": "every 10 seconds"},
                },
            ),
            (
                "demo-every-minute",
                {
                    "kind": "cron",
                    "expression": "* * * * *",
                    "time_zone": "Europe/Berlin",
                    "target": "demo.minutely",
                    "payload": {"hello": "every minute"},
                },
            ),
            (
                f"demo-once-{now:%Y%m%dT%H%M%S}",
                {
                    "kind": "once",
                    "target": "demo.once",
                    "expression": format_instant(now + timedelta(seconds=5)),
                    "payload": {"hello": "once, 5 s after start"},
                },
            ),
        ]
        for key, body in demo_schedules:
            schedule = await control.create_schedule("demo", body, key)
            print(
                f"demo schedule {schedule['schedule_id']} {body['kind']} {body['expression']!r}"
                f" -> {body['target']} next_run_at={schedule['next_run_at']}",
                flush=True,
            )
    finally:
        await pool.close()
    app = printing_consumer(consumer_config(endpoints, "chronoq-demo"), None, as_json=False)
    await app.run(stop)


def bind_api(host: str, port: int) -> socket.socket:
    return bind_port(host, port, "--api-port")


def bind_port(host: str, port: int, flag: str) -> socket.socket:
    try:
        return bind(host, port)
    except OSError as err:
        raise ChronoqError(
            f"cannot listen on {host}:{port} ({err.strerror}); is another chronoq running?"
            f" Choose another port with {flag} (0 picks a free one)"
        ) from err


def cmd_up(args: argparse.Namespace) -> int:
    configure_telemetry("chronoq")
    materializer = materializer_config(args.horizon)
    return asyncio.run(_up(args.demo, args.api_host, args.api_port, args.kafka, materializer))


def cmd_api(args: argparse.Namespace) -> int:
    configure_telemetry("chronoq-api")
    database_url = resolve_database_url()  # the API needs no Kafka

    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        sock = bind_api(args.api_host, args.api_port)
        print("chronoq api on http://{}:{}".format(*sock.getsockname()[:2]), flush=True)
        await run_services(database_url, None, stop, ServiceConfig(roles=API_ROLES, api_socket=sock))

    asyncio.run(main())
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    applied = asyncio.run(migrate(resolve_database_url()))
    print("applied: " + ", ".join(applied) if applied else "database is up to date")
    return 0


def run_roles(
    roles: frozenset[Role],
    service_name: str,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    stuck_occurrences: StuckOccurrencesConfig | None = None,
    materializer: MaterializerConfig | None = None,
) -> int:
    """Run ``roles`` against the configured stack until SIGINT/SIGTERM (and /metrics on ``metrics_port``)."""
    configure_telemetry(service_name)
    endpoints = resolve_endpoints()

    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        metrics_socket = None
        if metrics_port is not None:
            metrics_socket = bind_port(metrics_host, metrics_port, "--metrics-port")
            print("metrics on http://{}:{}/metrics".format(*metrics_socket.getsockname()[:2]), flush=True)
        await run_services(
            endpoints.database_url,
            endpoints.kafka_bootstrap,
            stop,
            ServiceConfig(
                roles=roles,
                metrics_socket=metrics_socket,
                idempotent_publisher=endpoints.idempotent_producer,
                kafka_security=endpoints.kafka_security,
                stuck_occurrences=stuck_occurrences or StuckOccurrencesConfig(),
                materializer=materializer or MaterializerConfig(),
                freeze_start_up_heap=True,  # this process is ours (schemas/garbage_collection.py)
            ),
        )

    asyncio.run(main())
    return 0


def stuck_config(stuck_after: str) -> StuckOccurrencesConfig:
    timeout = parse_duration(stuck_after, "stuck-after")
    if timeout <= timedelta(0):
        raise InvalidInput("stuck-after", "must be at least 1s", "--stuck-after 10m")
    return StuckOccurrencesConfig(timeout=timeout, interval=min(30.0, timeout.total_seconds() / 2))


def _api_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-host", default="127.0.0.1", help="address of the HTTP API (default 127.0.0.1)")
    parser.add_argument("--api-port", type=int, default=8080, help="port of the HTTP API (default 8080; 0 = any)")


ENGINE_DESCRIPTION = """\
Run the engine's loops against the configured stack (CHRONOQ_DATABASE_URL and
CHRONOQ_KAFKA_BOOTSTRAP, or a running `chronoq up`) until SIGINT or SIGTERM:

  materializer   due schedules -> occurrences and outbox rows
  attempts       apply consumers' attempt events from chronoq.attempts
  reaper         time out expired attempt leases: retry or dead-letter
  overlap-gate   dispatch, hold or skip occurrences of skip_if_running/queue_one schedules
  tenant-gate    release first deliveries held for a tenant's max_running, in due order
  commands       apply signed scheduling commands from chronoq.commands
  gauges         record the backlog gauges (due, outbox, queue age, overlap held, DLQ) every 5 s
  stuck-occurrences  republish (then flag) occurrences ENQUEUED without attempt
                 events for --stuck-after; export the attempt processor's lag
  tenant-usage   fold tenants' quota-usage change logs into their counters every 30 s

The relay (outbox -> Kafka) and the HTTP API run as their own processes:
`chronoq relay` and `chronoq api`. Several engine processes may run at once.
With --metrics-port N the process serves its metrics at http://HOST:N/metrics
(Prometheus text format; the API serves /metrics on its own port)."""


def register(commands: argparse._SubParsersAction) -> None:
    up = commands.add_parser(
        "up", help="start the embedded PostgreSQL + Kafka and every role: engine loops, relay, HTTP API"
    )
    up.add_argument("--demo", action="store_true", help="also create demo schedules and print what they fire")
    up.add_argument(
        "--kafka",
        choices=BROKER_KINDS,
        default="tansu",
        help="the embedded broker: tansu (default: nothing to install, keeps messages in memory) or"
        " apache (Apache Kafka 4.4: needs Java 17+ and its jars, fetched once with"
        " `chronoq kafka fetch`; keeps its log on disk under CHRONOQ_HOME)",
    )
    _api_flags(up)
    _horizon_flag(up)
    up.set_defaults(func=cmd_up)
    api = commands.add_parser(
        "api",
        help="serve the HTTP API (needs only the database)",
        description="Serve the HTTP API against the configured engine database"
        " (CHRONOQ_DATABASE_URL, or a running `chronoq up`); it needs no Kafka.",
    )
    _api_flags(api)
    api.set_defaults(func=cmd_api)
    commands.add_parser("migrate", help="apply the engine's database migrations").set_defaults(func=cmd_migrate)
    engine = commands.add_parser(
        "engine",
        help="run the engine loops: materializer, attempts, reaper, overlap gate, commands, stuck occurrences",
        description=ENGINE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _metrics_flags(engine)
    engine.add_argument(
        "--stuck-after",
        default="10m",
        metavar="DURATION",
        help="an occurrence ENQUEUED this long without attempt events is published again"
        " (default 10m; passes run every half of it, at most every 30 s)",
    )
    _horizon_flag(engine)
    engine.set_defaults(
        func=lambda args: run_roles(
            ENGINE_ROLES,
            "chronoq-engine",
            args.metrics_port,
            args.metrics_host,
            stuck_config(args.stuck_after),
            materializer_config(args.horizon),
        )
    )
    relay = commands.add_parser(
        "relay",
        help="run the outbox relay: due outbox rows -> Kafka",
        description="Publish due outbox rows to Kafka, at least once, against the configured stack"
        " (CHRONOQ_DATABASE_URL and CHRONOQ_KAFKA_BOOTSTRAP, or a running `chronoq up`).",
    )
    _metrics_flags(relay)
    relay.set_defaults(
        func=lambda args: run_roles(frozenset({Role.RELAY}), "chronoq-relay", args.metrics_port, args.metrics_host)
    )


def _horizon_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--horizon",
        default=DEFAULT_HORIZON,
        metavar="DURATION",
        help=f"how far ahead the materializer writes occurrences (default {DEFAULT_HORIZON}, 1s to 30m): cover a"
        " failover plus writing the largest burst; see docs/operations.md",
    )


def _metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics (Prometheus text format) on this port (0 = any free port)",
    )
    parser.add_argument("--metrics-host", default="127.0.0.1", help="address of /metrics (default 127.0.0.1)")

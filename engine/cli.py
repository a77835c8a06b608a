"""The ``chronoq`` command: the operator's edge and the composition root.

This is the only module that reads the environment (through
``engine.settings``) and wires engine, relay and consumer components together;
``relay`` and ``consumers`` never import ``engine``.

Exit status: 0 on success, 2 for invalid input (one line naming the field,
nothing written), 1 for any other chronoq error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from datetime import timedelta
from typing import Any, Sequence

import orjson

from consumers.app import ConsumerConfig
from consumers.printer import printing_consumer
from engine import settings
from engine.control_plane import ControlPlane
from engine.log_format import configure_logging
from engine.service import ServiceConfig, migrate, run_services
from engine.stack import EmbeddedStack, Endpoints
from schemas.connections import create_pool
from schemas.errors import ChronoqError, InvalidInput
from schemas.messages import format_instant
from schemas.observability import configure_telemetry

log = logging.getLogger("chronoq.cli")


def consumer_config(endpoints: Endpoints, group: str) -> ConsumerConfig:
    """Consumer settings for a built-in consumer on these endpoints.

    On the embedded tansu broker a group's join waits about half the session
    timeout, so short-lived CLI consumers use a short session there; Apache
    Kafka rejects sessions under group.min.session.timeout.ms (6 s by
    default), so external brokers keep the library default.
    """
    if endpoints.embedded:
        return ConsumerConfig(group, endpoints.kafka_bootstrap, endpoints.consumer_database_url,
                              session_timeout=2.0, heartbeat_interval=0.5)
    return ConsumerConfig(group, endpoints.kafka_bootstrap, endpoints.consumer_database_url)


def _print_json(value: Any, compact: bool) -> None:
    option = 0 if compact else orjson.OPT_INDENT_2
    sys.stdout.write(orjson.dumps(value, option=option).decode() + "\n")
    sys.stdout.flush()


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


# ---------------------------------------------------------------- schedules

def _schedule_body(args: argparse.Namespace) -> dict[str, Any]:
    """Turn create flags into API field names (validation happens in the control plane)."""
    chosen = [flag for flag in ("cron", "at", "every") if getattr(args, flag) is not None]
    if len(chosen) != 1:
        raise InvalidInput("expression", "give exactly one of --cron EXPR, --at ISO8601 or --every DURATION",
                           "--cron '0 9 * * MON-FRI' --tz Europe/Berlin")
    kind = {"cron": "cron", "at": "once", "every": "rate"}[chosen[0]]
    body: dict[str, Any] = {"kind": kind, "expression": getattr(args, chosen[0]), "target": args.target}
    if args.tz is not None:
        body["time_zone"] = args.tz
    if args.payload is not None:
        try:
            body["payload"] = orjson.loads(args.payload)
        except orjson.JSONDecodeError as err:
            raise InvalidInput("payload", f"is not valid JSON ({err})", '\'{"invoice": 42}\'') from err
    for name in ("priority", "flexible_window", "misfire_policy", "max_lateness", "overlap_policy",
                 "max_attempts", "dst_repeat", "dst_gap", "anchor", "start_at", "end_at"):
        value = getattr(args, name, None)
        if value is not None:
            body[name] = value
    return body


async def _control_plane_call(method: str, *call_args: Any) -> Any:
    endpoints = settings.resolve_endpoints()
    pool = await create_pool(endpoints.database_url, min_size=1, max_size=2)
    try:
        return await getattr(ControlPlane(pool), method)(*call_args)
    finally:
        await pool.close()


def cmd_schedule_create(args: argparse.Namespace) -> int:
    if not args.tenant:
        raise InvalidInput("tenant", "is required: --tenant NAME", "--tenant acme")
    body = _schedule_body(args)
    schedule = asyncio.run(_control_plane_call("create_schedule", args.tenant, body, args.idempotency_key))
    _print_json(schedule, args.json)
    return 0


def cmd_schedule_get(args: argparse.Namespace) -> int:
    schedule = asyncio.run(_control_plane_call("get_schedule", args.tenant, args.schedule_id))
    _print_json(schedule, args.json)
    return 0


# ---------------------------------------------------------------- stack

async def _up(demo: bool) -> int:
    stop = asyncio.Event()
    _stop_on_signals(stop)
    home = settings.home()
    stack: EmbeddedStack | None = None
    endpoints = settings.external_endpoints()
    if endpoints is None:
        running = settings.read_state(home)
        if running is not None:
            raise ChronoqError(f"chronoq is already running in {home} (pid {running.pid}); stop it first"
                               " or set CHRONOQ_HOME to another directory")
        stack = EmbeddedStack(home)
        endpoints = await stack.start()
    try:
        applied = await migrate(endpoints.database_url)
        if stack is not None:
            settings.write_state(settings.StackState(
                pid=os.getpid(), database_url=endpoints.database_url, kafka_bootstrap=endpoints.kafka_bootstrap,
                consumer_database_url=endpoints.consumer_database_url, postgres_pid=stack.postgres.pid,
                kafka_pid=stack.kafka.pid), home)
        print("chronoq is up" + (" (embedded stack)" if stack else " (external stack)"), flush=True)
        print(f"  database:  {endpoints.database_url}", flush=True)
        print(f"  kafka:     {endpoints.kafka_bootstrap}", flush=True)
        if stack is not None:
            print(f"  state:     {home / settings.STATE_FILE}", flush=True)
        if applied:
            print(f"  migrated:  {', '.join(applied)}", flush=True)
        tasks = [asyncio.create_task(run_services(endpoints.database_url, endpoints.kafka_bootstrap, stop),
                                     name="services")]
        if demo:
            tasks.append(asyncio.create_task(_run_demo(endpoints, stop), name="demo"))
        print("Press Ctrl-C (or send SIGTERM) to stop.", flush=True)
        try:
            await stop.wait()
        finally:
            stop.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for task, result in zip(tasks, results):
                if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                    log.error("component failed", extra={"action": "up.component_failed",
                                                         "component": task.get_name(), "error": repr(result)})
    finally:
        if stack is not None:
            settings.clear_state(home)
            stack.stop()
        print("chronoq stopped", flush=True)
    return 0


async def _run_demo(endpoints: Endpoints, stop: asyncio.Event) -> None:
    """Create a few demo schedules (idempotently) and print what a consumer applies."""
    pool = await create_pool(endpoints.database_url, min_size=1, max_size=2)
    try:
        control = ControlPlane(pool)
        now = await control.now()
        demo_schedules = [
            ("demo-every-10s", {"kind": "rate", "expression": "10s", "target": "demo.heartbeat",
                                "payload": {"hello": "every 10 seconds"}}),
            ("demo-every-minute", {"kind": "cron", "expression": "* * * * *", "time_zone": "Europe/Berlin",
                                   "target": "demo.minutely", "payload": {"hello": "every minute"}}),
            (f"demo-once-{now:%Y%m%dT%H%M%S}", {"kind": "once", "target": "demo.once",
                                                "expression": format_instant(now + timedelta(seconds=5)),
                                                "payload": {"hello": "once, 5 s after start"}}),
        ]
        for key, body in demo_schedules:
            schedule = await control.create_schedule("demo", body, key)
            print(f"demo schedule {schedule['schedule_id']} {body['kind']} {body['expression']!r}"
                  f" -> {body['target']} next_run_at={schedule['next_run_at']}", flush=True)
    finally:
        await pool.close()
    app = printing_consumer(consumer_config(endpoints, "chronoq-demo"), None, as_json=False)
    await app.run(stop)


def cmd_up(args: argparse.Namespace) -> int:
    configure_telemetry("chronoq")
    return asyncio.run(_up(args.demo))


def cmd_migrate(args: argparse.Namespace) -> int:
    applied = asyncio.run(migrate(settings.resolve_endpoints().database_url))
    print("applied: " + ", ".join(applied) if applied else "database is up to date")
    return 0


def _run_component(materializer: bool, relay: bool) -> int:
    configure_telemetry("chronoq-engine" if materializer else "chronoq-relay")
    endpoints = settings.resolve_endpoints()

    async def main() -> None:
        stop = asyncio.Event()
        _stop_on_signals(stop)
        await run_services(endpoints.database_url, endpoints.kafka_bootstrap, stop,
                           ServiceConfig(run_materializer=materializer, run_relay=relay))

    asyncio.run(main())
    return 0


def cmd_consume(args: argparse.Namespace) -> int:
    configure_telemetry("chronoq-consume")
    endpoints = settings.resolve_consumer_endpoints()
    if args.max is not None and args.max < 1:
        raise InvalidInput("max", "must be at least 1", "--max 10")

    async def main() -> int:
        stop = asyncio.Event()
        _stop_on_signals(stop)
        app = printing_consumer(consumer_config(endpoints, args.group), args.target, args.json)
        return await app.run(stop, max_applied=args.max)

    asyncio.run(main())
    return 0


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chronoq", description="Multi-tenant distributed job scheduler.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="start the embedded PostgreSQL + Kafka, the engine and the relay")
    up.add_argument("--demo", action="store_true", help="also create demo schedules and print what they fire")
    up.set_defaults(func=cmd_up)

    commands.add_parser("migrate", help="apply the engine's database migrations").set_defaults(func=cmd_migrate)
    commands.add_parser("engine", help="run the materializer against the configured stack").set_defaults(
        func=lambda args: _run_component(materializer=True, relay=False))
    commands.add_parser("relay", help="run the outbox relay against the configured stack").set_defaults(
        func=lambda args: _run_component(materializer=False, relay=True))

    schedule = commands.add_parser("schedule", help="create and inspect schedules")
    schedule_commands = schedule.add_subparsers(dest="schedule_command", required=True, metavar="ACTION")
    create = schedule_commands.add_parser("create", help="create a schedule and print it as JSON")
    create.add_argument("--tenant", help="tenant that owns the schedule")
    create.add_argument("--target", help="handler name; occurrences go to topic chronoq.occurrences.<target>")
    create.add_argument("--cron", help="5-field cron expression, local time in --tz")
    create.add_argument("--at", help="one-time instant, ISO 8601 with offset or Z")
    create.add_argument("--every", help="rate: elapsed-time period such as 90s, 15m, 1h30m")
    create.add_argument("--tz", help="IANA time zone of a cron expression (default UTC)")
    create.add_argument("--payload", help="JSON payload delivered with every occurrence")
    create.add_argument("--priority", choices=["strict", "flexible"])
    create.add_argument("--flexible-window", dest="flexible_window", help="jitter window of flexible jobs (5m)")
    create.add_argument("--misfire-policy", dest="misfire_policy", help="skip | fire_once | catch_up:K")
    create.add_argument("--max-lateness", dest="max_lateness", help="lateness beyond which a fire misfires (1m)")
    create.add_argument("--overlap-policy", dest="overlap_policy", choices=["allow", "skip_if_running", "queue_one"])
    create.add_argument("--max-attempts", dest="max_attempts", type=int)
    create.add_argument("--dst-repeat", dest="dst_repeat", choices=["first", "both"])
    create.add_argument("--dst-gap", dest="dst_gap", choices=["skip", "shift"])
    create.add_argument("--anchor", help="rate: instant the period counts from (default: now)")
    create.add_argument("--start-at", dest="start_at", help="no fires before this instant")
    create.add_argument("--end-at", dest="end_at", help="no fires after this instant")
    create.add_argument("--idempotency-key", dest="idempotency_key",
                        help="repeat-safe create: the same key returns the same schedule")
    create.add_argument("--json", action="store_true", help="print compact JSON")
    create.set_defaults(func=cmd_schedule_create)
    get = schedule_commands.add_parser("get", help="print one schedule as JSON")
    get.add_argument("schedule_id")
    get.add_argument("--tenant", required=True)
    get.add_argument("--json", action="store_true", help="print compact JSON")
    get.set_defaults(func=cmd_schedule_get)

    consume = commands.add_parser("consume", help="built-in consumer: print each applied occurrence")
    consume.add_argument("--target", help="only this target (default: every target)")
    consume.add_argument("--group", default="chronoq-cli", help="consumer group (default chronoq-cli)")
    consume.add_argument("--max", type=int, help="exit after applying this many occurrences")
    consume.add_argument("--json", action="store_true", help="one JSON object per line")
    consume.set_defaults(func=cmd_consume)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(logging.DEBUG if args.verbose else logging.WARNING if args.command != "up" else logging.INFO)
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


if __name__ == "__main__":
    sys.exit(main())

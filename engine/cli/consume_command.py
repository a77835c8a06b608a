"""``chronoq consume``: the built-in consumer, printing each applied occurrence."""

from __future__ import annotations

import argparse
import asyncio
import os

from consumers.app import ConsumerConfig
from consumers.printer import printing_consumer
from engine.cli import stop_on_signals
from engine.cli.embedded.stack import Endpoints
from engine.cli.endpoints import resolve_consumer_endpoints
from schemas.errors import InvalidInput
from schemas.garbage_collection import freeze_start_up_heap, tune_for_throughput
from schemas.observability import configure_telemetry

CREDENTIALS_ENV = "CHRONOQ_ATTEMPT_CREDENTIALS"


def attempt_credentials(text: str | None) -> dict[str, str]:
    """``target=cqa_...[,target=cqa_...]`` (the value of CHRONOQ_ATTEMPT_CREDENTIALS) by target.

    InvalidInput names the variable and never echoes a token.
    """
    credentials: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        target, sep, token = item.strip().partition("=")
        if not sep or not target or not token.startswith("cqa_"):
            raise InvalidInput(CREDENTIALS_ENV, "is a comma-separated list of target=token", "billing.invoice=cqa_...")
        credentials[target] = token
    return credentials


def consumer_config(
    endpoints: Endpoints, group: str, report_attempts: bool = True, credentials: dict[str, str] | None = None
) -> ConsumerConfig:
    """Consumer settings for a built-in consumer on these endpoints.

    On the embedded tansu broker a group's join waits about half the session
    timeout, so short-lived CLI consumers use a short session there, and a short
    fetch wait (tansu answers a waiting fetch of several partitions only when the
    wait runs out: at Kafka's 0.5 s a lone occurrence is printed up to ~0.35 s
    late); Apache Kafka (embedded or external) joins at once, rejects sessions
    under group.min.session.timeout.ms (6 s by default) and answers a fetch as
    records arrive, so it keeps the library defaults.
    """
    if endpoints.kafka_kind == "tansu":
        return ConsumerConfig(
            group,
            endpoints.kafka_bootstrap,
            endpoints.consumer_database_url,
            session_timeout=2.0,
            heartbeat_interval=0.5,
            fetch_wait=0.05,
            report_attempts=report_attempts,
            attempt_credentials=credentials or {},
        )
    return ConsumerConfig(
        group,
        endpoints.kafka_bootstrap,
        endpoints.consumer_database_url,
        report_attempts=report_attempts,
        attempt_credentials=credentials or {},
        kafka_security=endpoints.kafka_security,
    )


def cmd_consume(args: argparse.Namespace) -> int:
    configure_telemetry("chronoq-consume")
    endpoints = resolve_consumer_endpoints()
    if args.max is not None and args.max < 1:
        raise InvalidInput("max", "must be at least 1", "--max 10")
    credentials = attempt_credentials(os.environ.get(CREDENTIALS_ENV))
    tune_for_throughput()
    freeze_start_up_heap()  # the modules and clients are imported by now; this process is ours

    async def main() -> int:
        stop = asyncio.Event()
        stop_on_signals(stop)
        app = printing_consumer(
            consumer_config(endpoints, args.group, not args.no_report, credentials), args.target, args.json
        )
        return await app.run(stop, max_applied=args.max)

    asyncio.run(main())
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    consume = commands.add_parser("consume", help="built-in consumer: print each applied occurrence")
    consume.add_argument("--target", help="only this target (default: every target)")
    consume.add_argument("--group", default="chronoq-cli", help="consumer group (default chronoq-cli)")
    consume.add_argument("--max", type=int, help="exit after applying this many occurrences")
    consume.add_argument("--json", action="store_true", help="one JSON object per line")
    consume.add_argument(
        "--no-report",
        action="store_true",
        help="do not report attempts to the engine: peek at a target another app owns",
    )
    consume.set_defaults(func=cmd_consume)

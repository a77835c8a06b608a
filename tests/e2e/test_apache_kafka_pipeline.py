"""chronoq's pipeline on Apache Kafka where only a real broker can keep the promise.

* **A broker crash mid-burst** (outbox → relay → Apache Kafka, SIGKILLed →
  consumer app): Jepsen's "lost acknowledged write" check on chronoq's own
  path. Every occurrence the outbox marked sent (the relay marks a row only
  after the broker acknowledged it, acks=all) must be in the topic after the
  broker is restarted on the same log directory, and the consumer app's
  effects table must hold each occurrence exactly once.
* **Compaction of the schedule-states topic**: a consumer app started after
  the cleaner ran still knows each schedule's latest state.

tansu can run neither: it keeps its log in memory (a restarted tansu has lost
everything, by design) and never compacts (docs/broker.md). The module runs
its own broker (``own_apache_kafka``), which it kills and restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from consumers.schedule_states import SCHEDULE_CANCELED, STALE_VERSION, ScheduleStateView
from engine.cli.embedded.apache_kafka import ApacheKafka
from engine.loops.service import relay_periodic_loop
from relay.dispatcher import Relay, RelayConfig
from relay.publisher import KafkaPublisher, PublisherConfig
from schemas.messages import ScheduleStateMessage, decode_occurrence, decode_schedule_state
from schemas.target_bindings import TargetBindingMessage
from schemas.topics import (
    SCHEDULE_STATES_TOPIC,
    TARGET_BINDINGS_TOPIC,
    create_missing_topics,
    occurrence_topic,
    topic_partitions,
)
from tests.support.kafka import produce, read_to_end
from tests.support.rows import insert_occurrences, insert_schedule
from tests.support.services import Running
from tests.support.waiting import wait_for

OCCURRENCES = 3_000
TENANTS = 6  # keys on several partitions


async def sent_ids(pool: asyncpg.Pool) -> set[uuid.UUID]:
    return {r["occurrence_id"] for r in await pool.fetch("SELECT occurrence_id FROM outbox WHERE sent_at IS NOT NULL")}


async def consumer_state(app: ConsumerApp, effects: asyncpg.Pool) -> str:
    """What a stalled app was doing: effects so far, its counters, and per partition its position."""
    applied = await effects.fetchval("SELECT count(DISTINCT occurrence_id) FROM effects")
    consumer = app._consumer
    lanes = []
    for tp, lane in sorted(app._lanes.items()):
        position = None
        if consumer is not None and tp in consumer.assignment():
            with contextlib.suppress(Exception):
                position = await consumer.position(tp)
        highwater = consumer.highwater(tp) if consumer is not None else None
        lanes.append(
            f"{tp.partition}: position {position} highwater {highwater} committed {lane.committed}"
            f" pending {len(lane.pending)} parked {lane.parked} paused {lane.paused} in flight {lane.offsets.in_flight}"
        )
    assignment = sorted(tp.partition for tp in consumer.assignment()) if consumer is not None else None
    counters = {k: v for k, v in vars(app.stats).items() if k != "outcomes"}
    return (
        f"{applied} of {OCCURRENCES} effects; {counters}; tasks {len(app._tasks)}; assignment {assignment};"
        f" lanes: {'; '.join(lanes)}"
    )


async def test_a_broker_sigkilled_mid_burst_loses_no_acknowledged_occurrence_and_no_effect_repeats(
    own_apache_kafka: ApacheKafka, pool, clock, target, consumer_db, effects
) -> None:
    bootstrap = own_apache_kafka.bootstrap
    assert bootstrap is not None
    now = clock.now()
    expected: set[uuid.UUID] = set()
    for t in range(TENANTS):
        tenant = f"tenant-{t}"
        schedule = await insert_schedule(pool, tenant, target, now)
        instants = [now - timedelta(seconds=i) for i in range(OCCURRENCES // TENANTS)]
        expected.update(m.occurrence_id for m in await insert_occurrences(pool, schedule, tenant, target, instants))

    # The relay as production runs it on Apache Kafka (idempotent, acks=all), in small batches so the burst
    # spans many produce requests, and a short ack timeout so the outage shows as failed passes quickly.
    publisher = KafkaPublisher(PublisherConfig(bootstrap, ack_timeout=3.0, idempotent=True))
    relay_config = RelayConfig(batch_size=50, claim_ttl=timedelta(seconds=10), error_backoff=0.2)
    # Attempt events off: they are not under test here, and each one is an awaited acks=all send (an fsync
    # per event with flush-per-append: ~15 occurrences/s per handler slot on this busy disk, measured).
    app = ConsumerApp(
        ConsumerConfig(
            f"crash-{uuid.uuid4().hex[:8]}",
            bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            redelivery_backoff=0.05,
            concurrency=16,
            report_attempts=False,
        )
    )

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)

    # The target is bound to its tenants, as the engine announces when they schedule onto it: the app then
    # runs their occurrences without first re-reading the binding topic (which it does for an unbound one).
    tenants = tuple(f"tenant-{t}" for t in range(TENANTS))
    binding = TargetBindingMessage(target, tenants, 1, now)
    await produce(bootstrap, TARGET_BINDINGS_TOPIC, [binding.encode()], key=binding.key)

    stop = asyncio.Event()
    await publisher.start()
    relaying = asyncio.create_task(
        relay_periodic_loop(Relay.create(pool, publisher, relay_config, clock), relay_config, 0).run(stop)
    )
    try:
        async with Running(app):
            # Kill once a third is acknowledged: well inside the burst, with batches in flight.
            await wait_for(
                lambda: pool.fetchval("SELECT count(*) >= $1 FROM outbox WHERE sent_at IS NOT NULL", OCCURRENCES // 3),
                timeout=60,
                interval=0.01,
            )
            own_apache_kafka.kill()
            killed_at = time.monotonic()
            unsent_at_kill = await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL")
            assert unsent_at_kill > 0, "the burst was over before the broker was killed"
            # The relay notices: a pass fails and releases its rows (their last_error is set).
            await wait_for(
                lambda: pool.fetchval("SELECT count(*) > 0 FROM outbox WHERE last_error IS NOT NULL"), timeout=30
            )
            # Nothing can be acknowledged by a dead broker: what is marked sent now was acknowledged before.
            acknowledged = await sent_ids(pool)
            own_apache_kafka.start()
            restarted_at = time.monotonic()

            await wait_for(
                lambda: pool.fetchval("SELECT count(*) = 0 FROM outbox WHERE sent_at IS NULL"), timeout=90, interval=0.2
            )
            try:
                await wait_for(
                    lambda: effects.fetchval("SELECT count(DISTINCT occurrence_id) = $1 FROM effects", OCCURRENCES),
                    timeout=90,
                    interval=0.2,
                )
            except AssertionError as err:
                raise AssertionError(await consumer_state(app, effects)) from err
            recovered_at = time.monotonic()
    finally:
        stop.set()
        try:
            await relaying
        finally:
            await publisher.stop()
            gc.collect()  # aiokafka's futures failed by the kill: finalized here, not in a later test

    in_topic = [
        decode_occurrence(r.value).occurrence_id for r in await read_to_end(bootstrap, occurrence_topic(target))
    ]
    present = set(in_topic)
    lost = acknowledged - present
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged occurrences are not in the topic"
    assert present == expected  # and everything else arrived after the restart
    counts = await effects.fetch("SELECT occurrence_id, count(*) AS n FROM effects GROUP BY occurrence_id")
    assert {r["occurrence_id"] for r in counts} == expected
    duplicated = [r["occurrence_id"] for r in counts if r["n"] > 1]
    assert not duplicated, f"{len(duplicated)} effects applied more than once"
    print(
        f"\nbroker kill: {OCCURRENCES} occurrences, {len(acknowledged)} acknowledged before the kill"
        f" ({unsent_at_kill} unsent at the kill), lost 0, {len(in_topic) - len(present)} duplicate records"
        f" in the topic, {len(counts)} effects each once; broker down {restarted_at - killed_at:.1f} s,"
        f" all applied {recovered_at - restarted_at:.1f} s after the restart"
    )


#: Topic settings that make the cleaner compact within a second: segments roll after 100 ms (on the next
#: append), any dirty fraction is worth cleaning, no minimum age. cleanup.policy stays what chronoq set.
EAGER_COMPACTION = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}


async def states_topic_compacting_eagerly(bootstrap: str) -> dict[str, str]:
    """Create the schedule-states topic as chronoq does, return its configuration as created, and set the
    eager timers (AlterConfigs replaces the topic's whole configuration, so cleanup.policy goes with it)."""
    await create_missing_topics(bootstrap, [SCHEDULE_STATES_TOPIC])
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, SCHEDULE_STATES_TOPIC)
        (response,) = await admin.describe_configs([resource])
        ((_code, _message, _type, _name, entries),) = response.resources
        created = {entry[0]: entry[1] for entry in entries}
        await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    SCHEDULE_STATES_TOPIC,
                    {"cleanup.policy": created["cleanup.policy"], **EAGER_COMPACTION},
                )
            ]
        )
    finally:
        await admin.close()
    return created


def state(schedule_id: uuid.UUID, version: int, value: str) -> ScheduleStateMessage:
    return ScheduleStateMessage(schedule_id, "acme", version, value, datetime(2026, 11, 29, 10, version, tzinfo=UTC))


async def publish_then_compact(bootstrap: str, published: list[ScheduleStateMessage]) -> dict[uuid.UUID, int]:
    """Publish the state messages in the given order, then wait until the cleaner has left one record per
    schedule; return the version each schedule's surviving record carries."""
    created = await states_topic_compacting_eagerly(bootstrap)
    assert created["cleanup.policy"] == "compact"  # chronoq creates the topic compacted
    schedules = {m.schedule_id for m in published}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for message in published:
            await producer.send_and_wait(SCHEDULE_STATES_TOPIC, message.encode(), key=message.key)
        partitions = await topic_partitions(bootstrap, SCHEDULE_STATES_TOPIC)

        async def compacted() -> dict[uuid.UUID, int] | None:
            # Only a closed segment is cleaned: a state of some other schedule on every partition rolls the
            # active one (segment.ms has passed since the last round) and is itself one record per key.
            for partition in partitions:
                filler = state(uuid.uuid4(), 1, "active")
                await producer.send_and_wait(
                    SCHEDULE_STATES_TOPIC, filler.encode(), key=filler.key, partition=partition
                )
            records = [decode_schedule_state(r.value) for r in await read_to_end(bootstrap, SCHEDULE_STATES_TOPIC)]
            ours = [m for m in records if m.schedule_id in schedules]
            return {m.schedule_id: m.version for m in ours} if len(ours) == len(schedules) else None

        surviving: dict[uuid.UUID, int] = await wait_for(compacted, timeout=60, interval=0.2)
    finally:
        await producer.stop()
    return surviving


@contextlib.asynccontextmanager
async def started_view(bootstrap: str, consumer_db: str, target: str) -> AsyncIterator[ScheduleStateView]:
    """A consumer app started now, once it has read the schedule states; stopped when the block ends."""
    app = ConsumerApp(
        ConsumerConfig(
            f"states-{uuid.uuid4().hex[:8]}",
            bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            report_attempts=False,
        )
    )

    @app.handler(target)
    async def ignore(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        pass

    async with Running(app):
        await wait_for(lambda: app.view.caught_up.is_set(), timeout=30)
        yield app.view


async def test_a_consumer_started_after_compaction_knows_each_schedules_latest_state(
    own_apache_kafka: ApacheKafka, consumer_db, target
) -> None:
    # Published in version order (one relay, or one schedule's changes a relay pass apart): the cleaner
    # keeps the last record of each key, which is the latest version.
    bootstrap = own_apache_kafka.bootstrap
    assert bootstrap is not None
    updated, canceled = uuid.uuid4(), uuid.uuid4()
    surviving = await publish_then_compact(
        bootstrap,
        [
            state(updated, 1, "active"),
            state(canceled, 1, "active"),
            state(updated, 2, "active"),
            state(updated, 3, "paused"),
            state(canceled, 2, "canceled"),
        ],
    )
    assert surviving == {updated: 3, canceled: 2}

    async with started_view(bootstrap, consumer_db, target) as view:
        assert view.verdict(updated, 2) == STALE_VERSION
        assert view.verdict(updated, 3) is None
        assert view.verdict(canceled, 1) == SCHEDULE_CANCELED


async def test_compaction_keeps_a_keys_last_record_not_its_highest_version(own_apache_kafka: ApacheKafka) -> None:
    """The broker fact behind the relay's keyed order (tests/integration/test_keyed_message_order.py): states
    published out of version order lose the newest one to the cleaner, and no consumer rule can bring it
    back, so the outbox never hands out a key's message while an older one of that key is unsent."""
    bootstrap = own_apache_kafka.bootstrap
    assert bootstrap is not None
    schedule = uuid.uuid4()
    # Version 3 (canceled) reaching the broker before version 2 (paused), as two unordered relays could.
    surviving = await publish_then_compact(
        bootstrap, [state(schedule, 1, "active"), state(schedule, 3, "canceled"), state(schedule, 2, "paused")]
    )
    assert surviving == {schedule: 2}, "the cleaner keeps the last offset"

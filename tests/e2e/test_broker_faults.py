"""The pipeline through a broker crash: outbox → relay → Apache Kafka (SIGKILLed mid-burst) → consumer app.

Jepsen's "lost acknowledged write" check on chronoq's own path: every
occurrence the outbox marked sent (the relay marks a row only after the
broker acknowledged it, acks=all) must be in the topic after the broker is
SIGKILLed and restarted on the same log directory, and the consumer app's
effects table must hold each occurrence exactly once. Only Apache Kafka can
run this: tansu keeps its log in memory, so a restarted tansu has lost
everything by design (docs/broker.md).
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from datetime import timedelta

import asyncpg

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.cli.embedded.apache_kafka import ApacheKafka
from engine.loops.service import relay_periodic_loop
from relay.dispatcher import Relay, RelayConfig
from relay.publisher import KafkaPublisher, PublisherConfig
from schemas.messages import decode_occurrence
from schemas.topics import occurrence_topic
from tests.support.kafka import read_to_end
from tests.support.rows import insert_occurrences, insert_schedule
from tests.support.services import Running
from tests.support.waiting import wait_for

OCCURRENCES = 3_000
TENANTS = 6          # keys on several partitions


async def sent_ids(pool: asyncpg.Pool) -> set[uuid.UUID]:
    return {r["occurrence_id"] for r in await pool.fetch("SELECT occurrence_id FROM outbox WHERE sent_at IS NOT NULL")}


async def test_a_broker_sigkilled_mid_burst_loses_no_acknowledged_occurrence_and_no_effect_repeats(
        own_apache_kafka: ApacheKafka, pool, clock, target, consumer_db, effects) -> None:
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
    app = ConsumerApp(ConsumerConfig(f"crash-{uuid.uuid4().hex[:8]}", bootstrap, consumer_db, session_timeout=2.0,
                                     heartbeat_interval=0.4, redelivery_backoff=0.05, concurrency=16,
                                     report_attempts=False))

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)

    stop = asyncio.Event()
    await publisher.start()
    relaying = asyncio.create_task(
        relay_periodic_loop(Relay.create(pool, publisher, relay_config, clock), relay_config, 0).run(stop))
    try:
        async with Running(app):
            # Kill once a third is acknowledged: well inside the burst, with batches in flight.
            await wait_for(lambda: pool.fetchval("SELECT count(*) >= $1 FROM outbox WHERE sent_at IS NOT NULL",
                                                 OCCURRENCES // 3), timeout=60, interval=0.01)
            own_apache_kafka.kill()
            killed_at = time.monotonic()
            unsent_at_kill = await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL")
            assert unsent_at_kill > 0, "the burst was over before the broker was killed"
            # The relay notices: a pass fails and releases its rows (their last_error is set).
            await wait_for(lambda: pool.fetchval("SELECT count(*) > 0 FROM outbox WHERE last_error IS NOT NULL"),
                           timeout=30)
            # Nothing can be acknowledged by a dead broker: what is marked sent now was acknowledged before.
            acknowledged = await sent_ids(pool)
            own_apache_kafka.start()
            restarted_at = time.monotonic()

            await wait_for(lambda: pool.fetchval("SELECT count(*) = 0 FROM outbox WHERE sent_at IS NULL"),
                           timeout=90, interval=0.2)
            await wait_for(lambda: effects.fetchval("SELECT count(DISTINCT occurrence_id) = $1 FROM effects",
                                                    OCCURRENCES), timeout=90, interval=0.2)
            recovered_at = time.monotonic()
    finally:
        stop.set()
        await relaying
        await publisher.stop()
        gc.collect()   # aiokafka's futures failed by the kill: finalized here, not in a later test

    in_topic = [decode_occurrence(r.value).occurrence_id for r in await read_to_end(bootstrap, occurrence_topic(target))]
    present = set(in_topic)
    lost = acknowledged - present
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged occurrences are not in the topic"
    assert present == expected                      # and everything else arrived after the restart
    counts = await effects.fetch("SELECT occurrence_id, count(*) AS n FROM effects GROUP BY occurrence_id")
    assert {r["occurrence_id"] for r in counts} == expected
    duplicated = [r["occurrence_id"] for r in counts if r["n"] > 1]
    assert not duplicated, f"{len(duplicated)} effects applied more than once"
    print(f"\nbroker kill: {OCCURRENCES} occurrences, {len(acknowledged)} acknowledged before the kill"
          f" ({unsent_at_kill} unsent at the kill), lost 0, {len(in_topic) - len(present)} duplicate records"
          f" in the topic, {len(counts)} effects each once; broker down {restarted_at - killed_at:.1f} s,"
          f" all applied {recovered_at - restarted_at:.1f} s after the restart")

"""Hostile records on every topic the engine and a consumer app consume, on the real stack.

Hypothesis generates the records (random bytes, right-shaped JSON with wrong
types, NUL, huge and negative numbers, NaN, extreme instants, null and
non-UTF-8 header values) for chronoq.commands, chronoq.attempts, the
schedule-state and target-binding topics and an occurrence topic; they are
produced to a running engine (command and attempt processors, relay) and a
running consumer app. Then valid records follow, and must be applied: a
signed command creates its schedule, and an occurrence published by the
relay is run by the app, whose attempt events the engine applies (SUCCEEDED).
Every loop stays alive and no partition stays stuck behind a hostile record.

The budget here is small (``CHRONOQ_FUZZ_RECORDS``, default 100 per topic);
``load_tests/fuzz_topics.py`` sends 10,000 per topic.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import UTC, datetime

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.loops.service import PIPELINE_ROLES, Role
from schemas.commands import HEADER_SIGNATURE, Command, sign
from schemas.topics import (
    ATTEMPTS_TOPIC,
    COMMANDS_TOPIC,
    SCHEDULE_STATES_TOPIC,
    TARGET_BINDINGS_TOPIC,
    TOPIC_CONFIGS,
    create_missing_topics,
    occurrence_topic,
)
from tests.support.hostile_records import hostile
from tests.support.rows import due_occurrence, occurrence_row
from tests.support.services import Running, fast_services, services_running
from tests.support.waiting import wait_for

RECORDS = int(os.environ.get("CHRONOQ_FUZZ_RECORDS", "100"))


def compacted(topic: str) -> bool:
    return TOPIC_CONFIGS.get(topic, {}).get("cleanup.policy") == "compact"


async def produce_all(bootstrap: str, batches: dict[str, list[tuple[bytes | None, bytes | None, list]]]) -> int:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, max_request_size=4 * 1024 * 1024
    )
    await producer.start()
    sent = 0
    try:
        for topic, batch in batches.items():
            # Apache Kafka refuses some hostile records itself (a record without a key on a compacted topic is
            # invalid; aiokafka reports it as UnknownError), and with it the whole batch it travelled in; tansu
            # takes them all. So records for a compacted topic go one per request, and refused ones, which
            # never reach a loop, are not counted as sent.
            if compacted(topic):
                outcomes: list[object] = []
                for key, value, headers in batch:
                    outcomes.extend(
                        await asyncio.gather(
                            await producer.send(topic, value, key=key, headers=headers), return_exceptions=True
                        )
                    )
            else:
                futures = [await producer.send(topic, value, key=key, headers=headers) for key, value, headers in batch]
                outcomes = list(await asyncio.gather(*futures, return_exceptions=True))
            unexpected = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, KafkaError)]
            if unexpected:
                raise unexpected[0]
            sent += sum(not isinstance(o, BaseException) for o in outcomes)
    finally:
        await producer.stop()
    return sent


async def test_hostile_records_on_every_consumed_topic_leave_every_loop_alive(
    engine_db, pool, consumer_db, kafka_bootstrap, target, acme
):
    batches = await asyncio.to_thread(
        lambda: {
            COMMANDS_TOPIC: hostile("command", RECORDS),
            ATTEMPTS_TOPIC: hostile("attempt_event", RECORDS),
            SCHEDULE_STATES_TOPIC: hostile("schedule_state", RECORDS),
            TARGET_BINDINGS_TOPIC: hostile("target_binding", RECORDS),
            occurrence_topic(target): hostile("occurrence", RECORDS),
        }
    )
    await create_missing_topics(kafka_bootstrap, list(batches))
    # A compacted topic cannot hold a record without a key: Apache Kafka refuses those (tansu keeps them).
    keyless_on_compacted = sum(
        key is None for topic, batch in batches.items() if compacted(topic) for key, _, _ in batch
    )
    hostile_occurrences = await produce_all(
        kafka_bootstrap, {occurrence_topic(target): batches.pop(occurrence_topic(target))}
    )
    assert hostile_occurrences >= RECORDS * 0.9
    others = await produce_all(kafka_bootstrap, batches)
    assert hostile_occurrences + others >= (5 * RECORDS - keyless_on_compacted) * 0.9

    effects = await asyncpg.connect(consumer_db)
    await effects.execute("CREATE TABLE effects (occurrence_id uuid)")
    app = ConsumerApp(
        ConsumerConfig(
            f"fuzz-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            binding_wait=0.5,
            # A hostile binding_version that decodes (a huge integer) parks its record until this runs out.
            binding_behind_timeout=1.0,
        )
    )

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO effects VALUES ($1)", occurrence.occurrence_id)

    config = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER} | {Role.COMMANDS})
    try:
        async with services_running(engine_db, kafka_bootstrap, config), Running(app):
            # Valid records behind the hostile ones: a signed command and an occurrence the relay publishes.
            command = Command(
                uuid.uuid4(),
                "acme",
                "create",
                datetime.now(UTC),
                body={"kind": "cron", "expression": "0 9 * * *", "target": f"{target}-cmd"},
            )
            value = command.encode()
            await produce_all(
                kafka_bootstrap,
                {
                    COMMANDS_TOPIC: [
                        (b"acme", value, [(HEADER_SIGNATURE, sign(acme.tenant.signing_key, value).encode())])
                    ]
                },
            )
            valid = await due_occurrence(pool, "acme", target, datetime.now(UTC))
            await wait_for(
                lambda: pool.fetchval("SELECT count(*) FROM schedules WHERE target = $1", f"{target}-cmd"), 60
            )
            await wait_for(
                lambda: effects.fetchval("SELECT count(*) FROM effects WHERE occurrence_id = $1", valid.occurrence_id),
                60,
            )
            await wait_for(async_state(pool, valid.occurrence_id, "SUCCEEDED"), 60)
            # Every hostile occurrence is set aside, each after its own checks: on partitions other than the
            # valid record's, some are still being judged (a binding wait, a park) when it has been applied.
            await wait_for(lambda: app.stats.dead_lettered >= hostile_occurrences, 60)
    finally:
        await effects.close()


def async_state(pool: asyncpg.Pool, occurrence_id: uuid.UUID, state: str):
    async def reached() -> bool:
        return (await occurrence_row(pool, occurrence_id))["state"] == state

    return reached

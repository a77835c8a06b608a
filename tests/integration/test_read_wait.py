"""A record that arrives alone is read at once by the engine's processors (and by a consumer app that asks for
a short fetch wait), on every broker.

tansu 0.6 answers a waiting fetch of several partitions late, when its wait (``fetch_max_wait_ms``) runs
out (~350 ms at aiokafka's default 500), even when a record arrives meanwhile; Apache Kafka answers as the
record arrives. Someone waits on each record the processors read (a consumer app's ``started`` for the
attempt processor's answer, a caller for its command's result), so they wait at most
``schemas.topics.FETCH_WAIT_MS`` at the broker. Records here are produced one at a time to the partitions
of an eight-partition topic, early in a waiting fetch; the median time to reading them must stay well under
the old wait (218 ms measured here before the change, on tansu).
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg
from aiokafka import AIOKafkaProducer

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.loops.kafka_processor import KafkaLoopSettings, KafkaProcessorLoop
from schemas.messages import OccurrenceMessage
from schemas.target_bindings import TargetBindingMessage
from schemas.topics import TARGET_BINDINGS_TOPIC, create_missing_topics, occurrence_topic
from tests.support.kafka import produce
from tests.support.services import Running

PARTITIONS = 8
RECORDS = 9
#: Far above a prompt read (a few ms plus this machine's noise), below the old wait (218 ms on tansu).
MEDIAN_BOUND = 0.15


async def lone_records(send: Callable[[int], Awaitable[None]], read: asyncio.Queue[int]) -> list[float]:
    """Send records 0 .. RECORDS - 1 one at a time (``send(n)``: acknowledged once it returns), each once the
    previous one was read; seconds from each send to its read."""
    rng = random.Random(7)
    took = []
    for n in range(RECORDS):
        await asyncio.sleep(rng.uniform(0.0, 0.1))  # early in the fetch that followed the last read
        sent = time.monotonic()
        await send(n)
        async with asyncio.timeout(10):
            assert await read.get() == n
        took.append(time.monotonic() - sent)
    return took


async def test_the_engine_processors_read_a_lone_record_at_once(kafka_bootstrap):
    topic = f"read-wait-{uuid.uuid4().hex[:8]}"
    read: asyncio.Queue[int] = asyncio.Queue()

    async def handle(records) -> dict[str, int]:
        for record in records:
            read.put_nowait(int(record.value))
        return {"applied": len(records)}

    settings = KafkaLoopSettings(
        group=f"g-{topic}", topic=topic, create=(topic,), session_timeout=6.0, heartbeat_interval=1.0
    )
    loop = KafkaProcessorLoop("read-wait", kafka_bootstrap, settings, handle, logging.getLogger("test.read_wait"))
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))
    try:
        await create_missing_topics(kafka_bootstrap, [topic], PARTITIONS)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"-1", partition=0)  # read once the group has assigned
        finally:
            await producer.stop()
        async with asyncio.timeout(60):
            assert await read.get() == -1
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()

        async def send(n: int) -> None:
            await producer.send_and_wait(topic, str(n).encode(), partition=(n * 3) % PARTITIONS)

        try:
            took = await lone_records(send, read)
        finally:
            await producer.stop()
    finally:
        stop.set()
        await running
    assert statistics.median(took) < MEDIAN_BOUND, took


async def test_a_consumer_app_with_a_short_fetch_wait_runs_a_lone_occurrence_at_once(
    kafka_bootstrap, target, consumer_db
):
    """``ConsumerConfig.fetch_wait`` (what the CLI's consumers use on tansu): a lone occurrence reaches its
    handler without waiting out the broker's fetch (at the default 0.5 s, tansu made it wait ~0.2-0.35 s)."""
    tenant = "acme"
    binding = TargetBindingMessage(target, (tenant,), 1, datetime.now(UTC))
    await produce(kafka_bootstrap, TARGET_BINDINGS_TOPIC, [binding.encode()], key=binding.key)
    await create_missing_topics(kafka_bootstrap, [occurrence_topic(target)], PARTITIONS)
    app = ConsumerApp(
        ConsumerConfig(
            f"wait-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            report_attempts=False,
            fetch_wait=0.05,
        )
    )
    read: asyncio.Queue[int] = asyncio.Queue()
    numbers: dict[uuid.UUID, int] = {}

    @app.handler(target)
    async def started(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        read.put_nowait(numbers[occurrence.occurrence_id])

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")

    async def send(n: int) -> None:
        now = datetime.now(UTC)
        message = OccurrenceMessage(uuid.uuid4(), uuid.uuid4(), 1, tenant, target, now, now, binding_version=1)
        numbers[message.occurrence_id] = n
        await producer.send_and_wait(occurrence_topic(target), message.encode(), partition=(n * 3) % PARTITIONS)

    await producer.start()
    try:
        async with Running(app):
            await send(-1)  # read once the group has assigned the partitions
            async with asyncio.timeout(60):
                assert await read.get() == -1
            took = await lone_records(send, read)
    finally:
        await producer.stop()
    assert statistics.median(took) < MEDIAN_BOUND, took

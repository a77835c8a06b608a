"""A record that arrives alone is read at once by the engine's processors, on every broker.

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

from aiokafka import AIOKafkaProducer

from engine.loops.kafka_processor import KafkaLoopSettings, KafkaProcessorLoop
from schemas.topics import create_missing_topics

PARTITIONS = 8
RECORDS = 9
#: Far above a prompt read (a few ms plus this machine's noise), below the old wait (218 ms on tansu).
MEDIAN_BOUND = 0.15


async def lone_records(bootstrap: str, topic: str, read: asyncio.Queue[int]) -> list[float]:
    """Produce RECORDS records one at a time, each once the previous one was read; seconds each took."""
    rng = random.Random(7)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        took = []
        for n in range(RECORDS):
            await asyncio.sleep(rng.uniform(0.0, 0.1))  # early in the fetch that followed the last read
            sent = time.monotonic()
            await producer.send_and_wait(topic, str(n).encode(), partition=(n * 3) % PARTITIONS)
            async with asyncio.timeout(10):
                assert await read.get() == n
            took.append(time.monotonic() - sent)
        return took
    finally:
        await producer.stop()


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
        took = await lone_records(kafka_bootstrap, topic, read)
    finally:
        stop.set()
        await running
    assert statistics.median(took) < MEDIAN_BOUND, took

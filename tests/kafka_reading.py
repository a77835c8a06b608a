"""Reading a topic from the beginning, without a consumer group (test inspection only)."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord


async def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 15.0,
                     settle: float = 0.5) -> list[ConsumerRecord]:
    """All records of ``topic`` once at least ``expected`` arrived (then ``settle`` s more for extras)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        partitions = None
        while partitions is None:
            partitions = consumer.partitions_for_topic(topic)
            if partitions is None:
                await consumer.topics()  # refresh metadata
                if loop.time() > deadline:
                    raise AssertionError(f"topic {topic} does not exist")
                await asyncio.sleep(0.05)
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        await consumer.seek_to_beginning()
        settle_until = None
        while True:
            batch = await consumer.getmany(timeout_ms=100)
            for part in batch.values():
                records.extend(part)
            now = loop.time()
            if len(records) >= expected and settle_until is None:
                settle_until = now + settle
            if settle_until is not None and now >= settle_until:
                return records
            if now > deadline:
                raise AssertionError(f"read {len(records)} of {expected} expected records from {topic}")
    finally:
        await consumer.stop()

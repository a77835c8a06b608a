"""Group records through the producers' shared batches (schemas/produce_batches.py), on both brokers.

Concurrent callers' records for one partition gather in its open batch, up to ``SHARED_BATCH_BYTES``
uncompressed. The brokers refuse a batch over 1 MiB (Apache Kafka's ``message.max.bytes``) after compression:
the largest groups (256 KiB) that do not compress, from several callers at once, must still all be taken,
each caller's in its order."""

from __future__ import annotations

import asyncio
import os
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.attempt_events import MAX_GROUP_BYTES
from schemas.first_offset import seek_to_first
from schemas.messages import Record
from schemas.produce_batches import SHARED_BATCH_BYTES, send_shared
from schemas.topics import create_missing_topics


async def test_the_largest_groups_of_concurrent_callers_all_arrive_each_callers_in_order(kafka_bootstrap):
    topic = f"test.shared-batches.{uuid.uuid4().hex[:8]}"
    await create_missing_topics(kafka_bootstrap, [topic], 2)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        acks="all",
        enable_idempotence=False,
        compression_type="lz4",
        max_batch_size=SHARED_BATCH_BYTES,
    )
    await producer.start()
    callers, per_caller = 4, 3
    try:
        # Random bytes: lz4 cannot shrink them, so a shared batch is as large as it gets.
        sent: list[list[Record]] = [
            [(f"{caller}-{n}".encode(), os.urandom(MAX_GROUP_BYTES - 1024), []) for n in range(per_caller)]
            for caller in range(callers)
        ]
        acknowledgements = await asyncio.gather(*(send_shared(producer, topic, 1, records) for records in sent))
        metadata = await asyncio.gather(*(future for futures in acknowledgements for future in futures))
    finally:
        await producer.stop()
    assert {m.partition for m in metadata} == {1}

    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 1)
        consumer.assign([tp])
        seek_to_first(consumer, [tp])  # the callers produced at once: tansu's "earliest" can point past records
        received: list[tuple[bytes, bytes]] = []
        while len(received) < callers * per_caller:
            batches = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=1000), 30)
            received += [(r.key or b"", r.value or b"") for r in batches.get(tp, [])]
    finally:
        await consumer.stop()
    assert sorted(received) == sorted((key, value) for records in sent for key, value, _ in records)
    for caller, records in enumerate(sent):
        mine = [key for key, _ in received if key.startswith(f"{caller}-".encode())]
        assert mine == [key for key, _, _ in records], "a caller's records out of order"

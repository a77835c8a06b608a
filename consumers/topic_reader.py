"""Reading a whole compacted topic without a consumer group (the schedule-state and target-binding views).

Each view reads its topic from the beginning on every partition and keeps the
newest record per key; no group, so reading never triggers a rebalance and
every app instance sees every record.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.kafka_security import KafkaSecurity, start_client
from schemas.topics import topic_partitions


async def open_from_beginning(
    bootstrap: str, topic: str, deadline: float, security: KafkaSecurity
) -> tuple[AIOKafkaConsumer, list[TopicPartition]]:
    """A started, group-less consumer assigned every partition of ``topic`` at its beginning.

    Waits until the event loop's ``deadline`` for the topic to appear (it may have been created a
    moment ago); the partitions are ``[]`` and nothing is assigned when it did not. The caller stops
    the consumer.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **security.client_options(),
    )
    await start_client(consumer, bootstrap, security)
    loop = asyncio.get_running_loop()
    # Partitions from an admin client, not consumer.partitions_for_topic: an assigning consumer has
    # no topic metadata on Apache Kafka (schemas.topics.topic_partitions).
    partitions = await topic_partitions(bootstrap, topic, security)
    while not partitions and loop.time() < deadline:
        await asyncio.sleep(0.05)
        partitions = await topic_partitions(bootstrap, topic, security)
    assigned = [TopicPartition(topic, p) for p in partitions]
    if assigned:
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
    return consumer, assigned

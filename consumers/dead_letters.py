"""Poison messages go to the dead-letter topic instead of blocking a partition.

The original key, value and headers are kept byte for byte, with headers that
say where the message came from and why it was set aside, so an operator can
inspect and replay it.
"""

from __future__ import annotations

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from schemas.topics import DEAD_LETTER_TOPIC

HEADER_REASON = "chronoq-dlq-reason"
HEADER_SOURCE_TOPIC = "chronoq-dlq-source-topic"
HEADER_SOURCE_PARTITION = "chronoq-dlq-source-partition"
HEADER_SOURCE_OFFSET = "chronoq-dlq-source-offset"
HEADER_GROUP = "chronoq-dlq-consumer-group"


async def send_to_dead_letters(producer: AIOKafkaProducer, record: ConsumerRecord, group: str, reason: str) -> None:
    """Publish ``record`` to the dead-letter topic and wait for the broker's acknowledgement."""
    headers = list(record.headers or ()) + [
        (HEADER_REASON, reason[:1000].encode()),
        (HEADER_SOURCE_TOPIC, record.topic.encode()),
        (HEADER_SOURCE_PARTITION, str(record.partition).encode()),
        (HEADER_SOURCE_OFFSET, str(record.offset).encode()),
        (HEADER_GROUP, group.encode()),
    ]
    await producer.send_and_wait(DEAD_LETTER_TOPIC, value=record.value, key=record.key, headers=headers)

"""The load tests' partition warm-up grows each partition and leaves nothing a reader could see."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from load_tests.partition_warmup import warm_partitions
from schemas.first_offset import FIRST_OFFSET
from schemas.topics import create_missing_topics
from tests.support.brokers import BrokerUnderTest

pytestmark = pytest.mark.on_broker("apache")  # DeleteRecords: tansu has none, and the warm-up is Apache's


def _watermarks(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"marks-{uuid.uuid4().hex[:6]}"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)]
    finally:
        consumer.close()


def _from_first_offset(member: Any, partitions: list[Any]) -> None:
    for tp in partitions:
        tp.offset = FIRST_OFFSET
    member.assign(partitions)


def _read_from_earliest(bootstrap: str, topic: str) -> list[bytes | None]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        # From offset 0, not the broker's "earliest" (tansu's can point past records: schemas.first_offset).
        consumer.subscribe([topic], on_assign=_from_first_offset)
        seen: list[bytes | None] = []
        for _ in range(10):  # 5 s: the group joins, gets its partitions and fetches from their start
            seen.extend(m.value() for m in consumer.consume(1000, 0.5) if m.error() is None)
        return seen
    finally:
        consumer.close()


async def test_every_partition_is_written_and_its_records_deleted(broker: BrokerUnderTest) -> None:
    topic = f"warmup.{uuid.uuid4().hex[:8]}"
    await create_missing_topics(broker.bootstrap, [topic], 3)

    assert await warm_partitions(broker.bootstrap, [topic], records=50) == 3

    marks = await asyncio.to_thread(_watermarks, broker.bootstrap, topic, 3)
    # Each partition took all 50 records (its log end moved) and starts after them now.
    assert marks == [(50, 50)] * 3
    assert await asyncio.to_thread(_read_from_earliest, broker.bootstrap, topic) == []


async def test_a_topic_that_does_not_exist_is_an_error_not_a_created_topic(broker: BrokerUnderTest) -> None:
    topic = f"warmup.missing.{uuid.uuid4().hex[:8]}"

    with pytest.raises(RuntimeError, match="do not exist; create them first"):
        await warm_partitions(broker.bootstrap, [topic], records=1)

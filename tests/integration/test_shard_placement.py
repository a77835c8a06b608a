"""Both publishers put an occurrence record on the partition of its schedule's shard range, on a real
broker: the ahead lane (librdkafka) and the late lane (aiokafka) agree, so a schedule's occurrences share
one partition whichever lane published them; a record whose key names no schedule is still delivered."""

from __future__ import annotations

import asyncio
import uuid

from relay.publisher import KafkaPublisher, OutgoingRecord, PublisherConfig
from schemas.shard_placement import partition_of_shard, shard_of
from schemas.topics import occurrence_topic, schedule_key
from tests.support.kafka import librdkafka_publisher, read_topic

PARTITIONS = 4


async def test_occurrence_records_land_on_their_shards_partition_through_either_publisher(kafka_bootstrap, target):
    topic = occurrence_topic(target)
    schedules = [uuid.uuid4() for _ in range(200)]
    async with librdkafka_publisher(kafka_bootstrap, partitions=PARTITIONS) as ahead:
        items: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]] = [
            (topic, schedule_key(s), b"ahead", []) for s in schedules
        ]
        items.append((topic, b"not-a-schedule", b"ahead", []))
        assert await asyncio.wait_for(await ahead.send(items), 20) == [None] * len(items)
    late = KafkaPublisher(PublisherConfig(kafka_bootstrap, partitions=PARTITIONS, ack_timeout=10))
    await late.start()
    try:
        records = [OutgoingRecord(s, topic, schedule_key(s), b"late") for s in schedules]
        assert set((await late.publish(records)).values()) == {None}
    finally:
        await late.stop()

    read = await read_topic(kafka_bootstrap, topic, expected=2 * len(schedules) + 1)
    by_lane: dict[bytes, dict[bytes, int]] = {b"ahead": {}, b"late": {}}
    for record in read:
        by_lane[record.value][record.key] = record.partition
    expected = {schedule_key(s): partition_of_shard(shard_of(s), PARTITIONS) for s in schedules}
    assert {k: p for k, p in by_lane[b"ahead"].items() if k != b"not-a-schedule"} == expected
    assert by_lane[b"late"] == expected
    assert b"not-a-schedule" in by_lane[b"ahead"]  # hashed by librdkafka's partitioner, delivered
    assert len(set(expected.values())) == PARTITIONS  # 200 schedules spread over every partition

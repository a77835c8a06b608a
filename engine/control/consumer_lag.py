"""Consumer lag per group, from the broker: committed offsets against high watermarks.

Read with the Kafka admin API and a group-less consumer, never by joining a
group (reading lag must not trigger a rebalance). Committed offsets are asked
for every partition of every topic explicitly (the embedded broker answers
only that form); a partition where the group has no offset is not the group's.
A topic whose end offsets the broker cannot give in time is left out rather than failing the whole read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from schemas.kafka_security import PLAINTEXT, KafkaSecurity, start_client


@dataclass(frozen=True)
class GroupLag:
    """group, topic: whose lag; partitions: partitions of the topic the group has committed on;
    lag: messages after the committed offsets, summed over those partitions."""

    group: str
    topic: str
    partitions: int
    lag: int

    def to_json(self) -> dict[str, object]:
        return {"group": self.group, "topic": self.topic, "partitions": self.partitions, "lag": self.lag}


async def read_consumer_lag(
    bootstrap: str,
    groups: Sequence[str] | None = None,
    timeout: float = 5.0,
    security: KafkaSecurity = PLAINTEXT,
) -> list[GroupLag]:
    """Lag of every consumer group (or of ``groups``), per topic, sorted by group and topic."""
    async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancellation (Python 3.11)
        return await _read(bootstrap, groups, security)


async def _read(bootstrap: str, groups: Sequence[str] | None, security: KafkaSecurity) -> list[GroupLag]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, **security.client_options())
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=5000, **security.client_options()
    )
    await start_client(admin, bootstrap, security)
    try:
        await consumer.start()
        try:
            names = (
                list(groups)
                if groups is not None
                else sorted(group for group, _protocol in await admin.list_consumer_groups())
            )
            # Topics and partitions from the admin client: a group-less consumer has no topic metadata
            # on Apache Kafka (schemas.topics.topic_partitions says why).
            topics = sorted(topic for topic in await admin.list_topics() if not topic.startswith("__"))
            described = await admin.describe_topics(topics) if topics else []
            every = [
                TopicPartition(description["topic"], partition["partition"])
                for description in described
                if description["error_code"] == 0
                for partition in sorted(description["partitions"], key=lambda p: p["partition"])
            ]
            committed: dict[str, dict[TopicPartition, int]] = {}
            for group in names:
                offsets = await admin.list_consumer_group_offsets(group, partitions=every) if every else {}
                committed[group] = {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}
            ends = await _end_offsets(consumer, {tp for per in committed.values() for tp in per})
        finally:
            await consumer.stop()
    finally:
        await admin.close()
    result: list[GroupLag] = []
    for group in names:
        per_topic: dict[str, list[int]] = {}
        for tp, offset in committed[group].items():
            if tp in ends:
                per_topic.setdefault(tp.topic, []).append(max(ends[tp] - offset, 0))
        for topic, lags in sorted(per_topic.items()):
            result.append(GroupLag(group, topic, len(lags), sum(lags)))
    return result


async def _end_offsets(consumer: AIOKafkaConsumer, partitions: set[TopicPartition]) -> dict[TopicPartition, int]:
    """High watermarks, asked per topic at once: a topic the broker cannot answer for in time (a partition
    without a leader, a topic being deleted) is left out of the result instead of failing every other one."""
    by_topic: dict[str, list[TopicPartition]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp)
    answers = await asyncio.gather(*(consumer.end_offsets(tps) for tps in by_topic.values()), return_exceptions=True)
    ends: dict[TopicPartition, int] = {}
    for answer in answers:
        if isinstance(answer, KafkaError):
            continue
        if isinstance(answer, BaseException):
            raise answer
        ends.update(answer)
    return ends

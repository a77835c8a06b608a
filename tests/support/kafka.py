"""Kafka in tests: occurrence messages, producing them, reading a topic, collecting attempt events, the
librdkafka publisher of the data plane, topics with a small message limit."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord

from relay.librdkafka_publisher import LibrdkafkaConfig, LibrdkafkaPublisher
from schemas.attempt_events import AttemptEvent, decode_attempt_record
from schemas.errors import MalformedMessage
from schemas.first_offset import seek_to_first
from schemas.identity import occurrence_id
from schemas.messages import OccurrenceMessage
from schemas.topics import ATTEMPTS_TOPIC, create_missing_topics, ensure_topics, topic_partitions
from tests.support.waiting import wait_for

SCHEDULED = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)

T = TypeVar("T")


def occurrence_message(
    target: str, tenant: str = "acme", when: datetime = SCHEDULED, attempt: int = 1
) -> OccurrenceMessage:
    """An occurrence message of a schedule that exists nowhere (consumer tests produce it directly)."""
    schedule_id = uuid.uuid4()
    return OccurrenceMessage(
        occurrence_id=occurrence_id(schedule_id, 1, when),
        schedule_id=schedule_id,
        schedule_version=1,
        tenant_id=tenant,
        target=target,
        scheduled_for=when,
        available_at=when,
        attempt=attempt,
        payload={"amount": 7},
    )


async def produce(
    bootstrap: str, topic: str, values: list[bytes], key: bytes | None = b"acme", partition: int | None = None
) -> list[int]:
    """Produce ``values`` in order (one key, or the given ``partition``: one partition), creating the topic
    first as chronoq does (Apache Kafka never creates one on its own); their offsets."""
    await create_missing_topics(bootstrap, [topic])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        return [(await producer.send_and_wait(topic, value, key=key, partition=partition)).offset for value in values]
    finally:
        await producer.stop()


async def attempt_events(bootstrap: str, ident: uuid.UUID, expected: int, timeout: float = 15.0) -> list[AttemptEvent]:
    """The attempt events reported for one occurrence, once at least ``expected`` arrived."""

    async def found() -> list[AttemptEvent] | None:
        records = await read_topic(bootstrap, ATTEMPTS_TOPIC, expected=0, settle=0.1)
        events = [e for r in decodable(records, decode_attempt_record) for e in r.events]
        matching = [e for e in events if e.occurrence_id == ident]
        return matching if len(matching) >= expected else None

    result: list[AttemptEvent] = await wait_for(found, timeout, interval=0.2)
    return result


async def read_topic(
    bootstrap: str, topic: str, expected: int, timeout: float = 15.0, settle: float = 0.5
) -> list[ConsumerRecord]:
    """All records of ``topic`` once at least ``expected`` arrived (then ``settle`` s more for extras)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # Not consumer.partitions_for_topic: on Apache Kafka an assigning
        # consumer has no metadata for the topic (schemas.topics says why).
        partitions = await topic_partitions(bootstrap, topic)
        while not partitions:
            if loop.time() > deadline:
                raise AssertionError(f"topic {topic} does not exist")
            await asyncio.sleep(0.05)
            partitions = await topic_partitions(bootstrap, topic)
        assigned = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(assigned)
        seek_to_first(consumer, assigned)  # not seek_to_beginning: tansu's can point past records
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


async def read_to_end(bootstrap: str, topic: str, timeout: float = 30.0) -> list[ConsumerRecord]:
    """Every record of ``topic`` from the log start to the end offsets as of the call (no group)."""
    partitions = [TopicPartition(topic, p) for p in await topic_partitions(bootstrap, topic)]
    assert partitions, f"topic {topic} does not exist"
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        consumer.assign(partitions)
        seek_to_first(consumer, partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[ConsumerRecord] = []
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            if loop.time() > deadline:
                raise AssertionError(f"read {len(records)} records of {topic} but not to its end offsets {ends}")
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


def decodable(records: list[ConsumerRecord], decode: Callable[[bytes | None], T]) -> list[T]:
    """The records ``decode`` accepts, decoded. The engine's topics are shared by every test of a session,
    the fuzz tests' hostile records included, so a reader skips what is not a record of its kind."""
    found: list[T] = []
    for record in records:
        try:
            found.append(decode(record.value))
        except MalformedMessage:
            continue
    return found


@contextlib.asynccontextmanager
async def librdkafka_publisher(bootstrap: str, **config: Any) -> AsyncIterator[LibrdkafkaPublisher]:
    """The data plane's publisher, started (topics it creates get 4 partitions; acknowledgements are
    awaited 10 s unless ``config`` says otherwise), stopped afterwards."""
    publisher = LibrdkafkaPublisher(LibrdkafkaConfig(bootstrap, **{"partitions": 4, "ack_timeout": 10, **config}))
    await publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()


async def create_topic_with_limit(bootstrap: str, topic: str, partitions: int, max_message_bytes: int) -> None:
    """Create ``topic`` whose broker refuses record batches over ``max_message_bytes`` (Apache Kafka; tansu
    accepts the setting and ignores it)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [topic], partitions, configs={"max.message.bytes": str(max_message_bytes)})
    finally:
        await admin.close()


async def commit_offsets(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit ``offsets`` for ``group`` (as a member that reads nothing)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


async def commit_at_end(bootstrap: str, group: str, topic: str) -> None:
    """Commit ``group``'s offsets at the current end of every partition of ``topic``: the group then reads only
    what comes after (a few records more on tansu, whose end offsets lag its log by a batch: docs/broker.md)."""
    partitions = [TopicPartition(topic, p) for p in await topic_partitions(bootstrap, topic)]
    assert partitions, f"topic {topic} does not exist"
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    await commit_offsets(bootstrap, group, ends)

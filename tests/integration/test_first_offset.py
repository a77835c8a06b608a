"""Readers start at a partition's first record, whatever the broker answers for "earliest".

Found by CI (stop 59): the concurrent-relays test read 198 of the 200 records its three relays had
published and the broker had acknowledged. tansu answers ListOffsets(EARLIEST) with the base offset of the
batch stored first *in time*, and two producers writing one partition at once can have the batch of the
higher offsets stored first; a reader seeking to the beginning then starts after records that are in the
log (schemas.first_offset). Here the fault is provoked on a tansu of this module's own (a large batch and a
one-record batch sent to each of 64 partitions a moment apart, until tansu reports a partition's "earliest"
past its first record), and every kind of chronoq reader is shown to start at that first record anyway. The
other tests hold the rule's other half on both brokers: a committed partition resumes where the group left
it, and on Apache Kafka a log that starts after offset 0 (records deleted) is read from its start.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.structs import ConsumerRecord

from consumers.topic_reader import open_from_beginning
from engine.cli.embedded.tansu import EmbeddedKafka
from engine.loops.kafka_processor import KafkaLoopSettings, KafkaProcessorLoop
from schemas.kafka_security import PLAINTEXT
from schemas.messages import OccurrenceMessage
from schemas.topics import create_missing_topics, occurrence_topic
from tests.integration.test_consumer import effect_app, run_until
from tests.support.kafka import commit_offsets, occurrence_message, produce, read_topic
from tests.support.waiting import wait_for

PARTITIONS = 64
BIG = 900_000  # bytes of the first batch: storing it takes tansu long enough for the second to overtake it


@pytest.fixture(scope="module")
def own_tansu() -> Iterator[str]:
    """A tansu of this module alone (the provoked topics hold ~60 MB each); started in the main thread like
    the session's brokers."""
    base = Path(tempfile.mkdtemp(prefix="chronoq-test-first-offset-"))
    kafka = EmbeddedKafka(base / "tansu.log")
    try:
        yield kafka.start()
    finally:
        kafka.stop()
        shutil.rmtree(base, ignore_errors=True)


async def _earliest(bootstrap: str, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return dict(await consumer.beginning_offsets(list(partitions)))
    finally:
        await consumer.stop()


def _plain_records(partition: int) -> tuple[bytes, bytes]:
    return b"b" * BIG, b"s"


async def _a_partition_tansu_misplaces(
    bootstrap: str,
    records: Callable[[int], tuple[bytes, bytes]] = _plain_records,
    new_topic: Callable[[], str] = lambda: f"test.first-offset.{uuid.uuid4().hex[:10]}",
    topics: int = 6,
) -> TopicPartition:
    """A partition whose "earliest" tansu reports past its first record. Each partition of the topic holds two
    records, ``records(partition)``: a big one and a small one, at offsets 0 and 1 in the order tansu took them.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    big = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=2 * BIG, max_request_size=4 * BIG)
    small = AIOKafkaProducer(bootstrap_servers=bootstrap)
    for client in (admin, big, small):
        await client.start()
    try:
        for _ in range(topics):
            topic = new_topic()
            await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
            for partition in range(PARTITIONS):
                big_value, small_value = records(partition)
                first = await big.send(topic, big_value, partition=partition)
                await asyncio.sleep(0.0003)
                second = await small.send(topic, small_value, partition=partition)
                assert sorted([(await first).offset, (await second).offset]) == [0, 1]
            earliest = await _earliest(bootstrap, [TopicPartition(topic, p) for p in range(PARTITIONS)])
            misplaced = sorted((tp for tp, offset in earliest.items() if offset > 0), key=lambda tp: tp.partition)
            if misplaced:
                return misplaced[0]
    finally:
        await big.stop()
        await small.stop()
        await admin.close()
    raise AssertionError(
        f"tansu reported every partition's earliest offset as 0 in {topics} topics of {PARTITIONS} partitions: if"
        " its ListOffsets(EARLIEST) is fixed, say so in schemas.first_offset and docs/broker.md"
    )


async def _first_read_by_group(bootstrap: str, topic: str, partitions: int, group: str | None = None) -> dict[int, int]:
    """The first offset the engine's Kafka loop hands on for each of the ``partitions`` of ``topic``, in
    ``group`` (default: a new group, which never committed)."""
    first: dict[int, int] = {}

    async def handle(records: Sequence[ConsumerRecord]) -> dict[str, int]:
        for record in records:
            first.setdefault(record.partition, record.offset)
        return {"applied": len(records)}

    settings = KafkaLoopSettings(group or f"first-{uuid.uuid4().hex[:8]}", topic, (), 6.0, 1.0, error_backoff=0.1)
    loop = KafkaProcessorLoop("first", bootstrap, settings, handle, logging.getLogger("test.first_offset"))
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        await wait_for(lambda: len(first) == partitions, timeout=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    return first


@pytest.mark.on_broker("tansu")
async def test_every_reader_starts_at_the_first_record_where_tansu_reports_a_later_earliest(own_tansu):
    tp = await _a_partition_tansu_misplaces(own_tansu)
    assert (await _earliest(own_tansu, [tp]))[tp] == 1  # the fault: a plain seek_to_beginning skips offset 0

    # The views' group-less reader (schedule states, target bindings).
    consumer, assigned = await open_from_beginning(
        own_tansu, tp.topic, asyncio.get_running_loop().time() + 10, PLAINTEXT
    )
    try:
        assert tp in assigned
        offsets: list[int] = []
        for _ in range(20):  # up to ~10 s, while fewer than both records came
            if len(offsets) < 2:
                batches = await consumer.getmany(tp, timeout_ms=500)
                offsets += [r.offset for r in batches.get(tp, [])]
        assert offsets == [0, 1]
    finally:
        await consumer.stop()

    # The engine's Kafka loops (attempt and command processors) in a new group (a consumer app's group: the
    # last test).
    assert (await _first_read_by_group(own_tansu, tp.topic, PARTITIONS))[tp.partition] == 0

    # The tests' own reader.
    records = await read_topic(own_tansu, tp.topic, expected=2 * PARTITIONS)
    assert sorted(r.offset for r in records if r.partition == tp.partition) == [0, 1]


@pytest.mark.on_broker("tansu", "apache")
async def test_a_group_resumes_a_committed_partition_and_starts_the_others_at_their_first_record(kafka_bootstrap):
    topic = f"test.first-offset.{uuid.uuid4().hex[:10]}"
    await create_missing_topics(kafka_bootstrap, [topic], partitions=2)
    for partition in (0, 1):
        await produce(kafka_bootstrap, topic, [b"a", b"b", b"c"], partition=partition)
    group = f"first-{uuid.uuid4().hex[:8]}"
    await commit_offsets(kafka_bootstrap, group, {TopicPartition(topic, 0): 2})

    assert await _first_read_by_group(kafka_bootstrap, topic, 2, group) == {0: 2, 1: 0}


@pytest.mark.on_broker("apache")
async def test_a_log_that_starts_after_offset_zero_is_read_from_its_start(kafka_bootstrap):
    """Offset 0 is out of range once records were deleted; the readers' "earliest" reset takes them to the
    log start instead of failing or jumping to the end."""
    topic = f"test.first-offset.{uuid.uuid4().hex[:10]}"
    await create_missing_topics(kafka_bootstrap, [topic], partitions=1)
    await produce(kafka_bootstrap, topic, [b"a", b"b", b"c", b"d"], partition=0)
    tp = TopicPartition(topic, 0)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_records({tp: RecordsToDelete(before_offset=2)})
    finally:
        await admin.close()
    assert (await _earliest(kafka_bootstrap, [tp]))[tp] == 2

    assert await _first_read_by_group(kafka_bootstrap, topic, 1) == {0: 2}
    consumer, _ = await open_from_beginning(kafka_bootstrap, topic, asyncio.get_running_loop().time() + 10, PLAINTEXT)
    try:
        batches = await consumer.getmany(tp, timeout_ms=5000)
        assert [r.offset for r in batches.get(tp, [])][:1] == [2]
    finally:
        await consumer.stop()
    assert sorted(r.offset for r in await read_topic(kafka_bootstrap, topic, expected=2)) == [2, 3]


@pytest.mark.on_broker("tansu")
async def test_a_new_consumer_group_applies_the_first_occurrence_where_tansu_reports_a_later_earliest(
    own_tansu, consumer_db, effects
):
    targets: list[str] = []
    sent: list[OccurrenceMessage] = []

    def new_topic() -> str:  # a target per provoked topic: the app reads one target's topic
        targets.append(f"test.{uuid.uuid4().hex[:10]}")
        sent.clear()
        return occurrence_topic(targets[-1])

    def occurrences(partition: int) -> tuple[bytes, bytes]:
        big = occurrence_message(targets[-1])
        big = OccurrenceMessage(**{**big.__dict__, "payload": {"amount": 7, "blob": "b" * BIG}})
        small = occurrence_message(targets[-1])
        sent.extend((big, small))
        return big.encode(), small.encode()

    tp = await _a_partition_tansu_misplaces(own_tansu, occurrences, new_topic)
    target = targets[-1]
    assert tp.topic == occurrence_topic(target)
    app = effect_app(consumer_db, own_tansu, target)

    await run_until(app, lambda: app.stats.applied == len(sent), timeout=60)

    assert sorted(await effects.fetchval("SELECT array_agg(occurrence_id) FROM effects")) == sorted(
        m.occurrence_id for m in sent
    )

"""Apache Kafka 4.4 (KRaft, one node) as chronoq runs it: what the broker itself must guarantee.

These are the broker semantics tansu lacks — a log on disk, the idempotent
producer, compaction — checked on the real broker with the project's broker
properties (engine/cli/embedded/apache_kafka/server.properties). The module
starts its own brokers from the cached jars and is skipped, with the reason,
when java or the jars are missing; with CHRONOQ_REQUIRE_APACHE_KAFKA set (CI
after fetching) a missing broker fails instead.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord

from engine.cli.embedded.apache_kafka import ApacheKafka
from relay.publisher import KafkaPublisher, OutgoingRecord, PublisherConfig
from schemas.topics import DEFAULT_PARTITIONS, ensure_topics
from tests.support.brokers import BROKER_TEST_OVERRIDES, require_apache_kafka
from tests.support.kafka import read_to_end
from tests.support.kafka_proxy import KafkaProxy
from tests.support.waiting import wait_for

#: A topic that compacts as soon as the cleaner looks: segments roll after
#: 100 ms (on the next append), any dirty fraction is worth cleaning, and
#: tombstones go 100 ms after compaction.
AGGRESSIVE_COMPACTION = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}


@pytest.fixture(scope="module")
async def proxied_kafka() -> AsyncIterator[tuple[ApacheKafka, KafkaProxy]]:
    """A broker that advertises a fault-injecting proxy in front of it, so every client goes through it."""
    require_apache_kafka()
    base = Path(tempfile.mkdtemp(prefix="chronoq-test-apache-kafka-proxied-"))
    broker: ApacheKafka | None = None

    def upstream() -> tuple[str, int]:
        assert broker is not None and broker.broker_port is not None
        return "127.0.0.1", broker.broker_port

    proxy = KafkaProxy(upstream)
    await proxy.start()
    broker = ApacheKafka(
        base, overrides={**BROKER_TEST_OVERRIDES, "advertised.listeners": f"PLAINTEXT://{proxy.bootstrap}"}
    )
    try:
        broker.start()
        yield broker, proxy
    finally:
        broker.stop()
        await proxy.stop()
        shutil.rmtree(base, ignore_errors=True)


def new_topic() -> str:
    return f"test.apache.{uuid.uuid4().hex[:10]}"


async def create_topic(bootstrap: str, topic: str, partitions: int, configs: dict[str, str] | None = None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [topic], partitions, configs=configs)
    finally:
        await admin.close()


async def test_keyed_records_round_trip_and_a_group_commits_its_offsets(own_apache_kafka: ApacheKafka) -> None:
    # The basics chronoq relies on, on the production broker: explicit topic
    # creation with 8 partitions, keyed acks=all produce with headers, a
    # tenant's key on one partition, a consumer group committing offsets into
    # __consumer_offsets (replication factor 1 on one node).
    bootstrap = own_apache_kafka.bootstrap
    assert bootstrap is not None
    topic = new_topic()
    await create_topic(bootstrap, topic, DEFAULT_PARTITIONS)
    sent = {(f"tenant-{i % 5}".encode(), f"value-{i}".encode()) for i in range(100)}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, headers=[("occurrence_id", value)])
            for key, value in sorted(sent)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()

    records = await read_to_end(bootstrap, topic)
    assert {(r.key, r.value) for r in records} == sent and len(records) == len(sent)
    assert all(dict(r.headers)["occurrence_id"] == r.value for r in records)
    partitions_of: dict[bytes, set[int]] = {}
    for record in records:
        partitions_of.setdefault(record.key, set()).add(record.partition)
    assert all(len(partitions) == 1 for partitions in partitions_of.values())

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"group.{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        seen = 0
        while seen < len(sent):
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
            seen += sum(len(batch) for batch in batches.values())
        await consumer.commit()
        committed = {tp: await consumer.committed(tp) for tp in consumer.assignment()}
    finally:
        await consumer.stop()
    ends: dict[int, int] = {}
    for record in records:
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    assert {tp.partition: offset for tp, offset in committed.items() if offset} == ends


@pytest.mark.parametrize("idempotent, copies", [(True, 1), (False, 2)], ids=["idempotent", "not-idempotent"])
async def test_a_retry_after_a_lost_produce_response_duplicates_only_without_idempotence(
    proxied_kafka: tuple[ApacheKafka, KafkaProxy], idempotent: bool, copies: int
) -> None:
    # The proxy lets the broker append the record, swallows its answer and
    # cuts the connection: the producer cannot know the write happened and
    # retries it. With enable_idempotence the broker recognises the retried
    # batch by producer id and sequence number and answers with the first
    # append's offset; without it the retry is a second copy. (tansu cannot
    # run the idempotent case: it has no InitProducerId.)
    _broker, proxy = proxied_kafka
    topic = new_topic()
    await create_topic(proxy.bootstrap, topic, 1)
    producer = AIOKafkaProducer(
        bootstrap_servers=proxy.bootstrap,
        acks="all",
        enable_idempotence=idempotent,
        retry_backoff_ms=50,
        request_timeout_ms=10_000,
    )
    await producer.start()
    try:
        first = await producer.send_and_wait(topic, b"before", key=b"tenant")
        dropped_before = len(proxy.dropped)
        proxy.drop_next_produce_response()
        retried = await producer.send_and_wait(topic, b"retried", key=b"tenant")
    finally:
        await producer.stop()
    assert len(proxy.dropped) == dropped_before + 1, "the broker's answer was not intercepted: nothing was retried"

    values = [record.value for record in await read_to_end(proxy.bootstrap, topic)]
    assert values.count(b"before") == 1
    assert values.count(b"retried") == copies
    # The acknowledged offset is the first append's when the retry was
    # recognised, the duplicate's when it was not.
    assert retried.offset == first.offset + copies


@pytest.mark.parametrize("idempotent, copies", [(True, 1), (False, 2)], ids=["idempotent", "not-idempotent"])
async def test_the_relays_publisher_keeps_one_copy_of_a_retried_batch_only_when_idempotent(
    proxied_kafka: tuple[ApacheKafka, KafkaProxy], idempotent: bool, copies: int
) -> None:
    # The same lost response, through the relay's own publisher (explicit
    # partition batches, PublisherConfig.idempotent as the relay sets it on
    # Apache Kafka): the retried batch of 50 records is one copy with
    # idempotence, two without; either way every record is acknowledged.
    _broker, proxy = proxied_kafka
    topic = new_topic()
    publisher = KafkaPublisher(
        PublisherConfig(bootstrap=proxy.bootstrap, partitions=1, ack_timeout=10.0, idempotent=idempotent)
    )
    await publisher.start()
    try:
        warm = await publisher.publish([OutgoingRecord("warm", topic, b"tenant", b"warm")])
        assert warm == {"warm": None}
        dropped_before = len(proxy.dropped)
        proxy.drop_next_produce_response()
        records = [OutgoingRecord(i, topic, b"tenant", f"record-{i}".encode()) for i in range(50)]
        outcome = await publisher.publish(records)
    finally:
        await publisher.stop()
    assert len(proxy.dropped) == dropped_before + 1, "the broker's answer was not intercepted: nothing was retried"
    assert outcome == {i: None for i in range(50)}

    values = [record.value for record in await read_to_end(proxy.bootstrap, topic)]
    assert all(values.count(f"record-{i}".encode()) == copies for i in range(50))
    assert len(values) == 1 + 50 * copies


async def test_every_acknowledged_record_survives_a_sigkill_of_the_broker(own_apache_kafka: ApacheKafka) -> None:
    # Jepsen's "lost acknowledged write" check at the broker: the relay's own
    # publisher (acks=all) publishes a burst in batches; the broker is
    # SIGKILLed while batches are in flight (no shutdown hook, no final
    # flush) and restarted on the same log directory. Every record the
    # broker acknowledged must be in the topic afterwards; the ones in
    # flight may or may not be.
    bootstrap = own_apache_kafka.bootstrap
    assert bootstrap is not None
    topic = new_topic()
    await create_topic(bootstrap, topic, DEFAULT_PARTITIONS)
    publisher = KafkaPublisher(PublisherConfig(bootstrap=bootstrap, ack_timeout=5.0))
    await publisher.start()
    acknowledged: set[int] = set()
    not_acknowledged: set[int] = set()

    async def burst() -> None:
        for start in range(0, 40_000, 500):
            records = [
                OutgoingRecord(i, topic, f"tenant-{i % 7}".encode(), f"record-{i}".encode())
                for i in range(start, start + 500)
            ]
            outcome = await publisher.publish(records)
            acknowledged.update(ref for ref, error in outcome.items() if error is None)  # type: ignore[misc]
            not_acknowledged.update(ref for ref, error in outcome.items() if error is not None)  # type: ignore[misc]
            if not_acknowledged:
                return

    publishing = asyncio.create_task(burst())
    killed = False
    try:
        await wait_for(lambda: len(acknowledged) >= 3_000 or publishing.done(), timeout=60)
        assert not publishing.done(), "the burst ended before the broker was killed"
        own_apache_kafka.kill()
        killed = True
        await asyncio.wait_for(publishing, 60)
        await publisher.stop()
        # aiokafka's sender leaves futures failed with NodeNotReadyError that
        # nobody retrieves; finalize them here (they log "Future exception was
        # never retrieved") rather than at a random later point: a finalizer
        # that runs inside ast.parse trips CPython 3.11's "AST constructor
        # recursion depth mismatch" in whatever test parses next.
        gc.collect()
        assert not (own_apache_kafka.log_dir / ".kafka_cleanshutdown").exists(), "the broker shut down cleanly"
    finally:
        if not publishing.done():
            publishing.cancel()
        if killed:
            own_apache_kafka.start()
    assert not_acknowledged, "no publish was cut short: the kill did not land mid-burst"

    present = {int(record.value.removeprefix(b"record-")) for record in await read_to_end(bootstrap, topic)}
    lost = acknowledged - present
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged records lost, e.g. {sorted(lost)[:5]}"


async def test_sigterm_is_a_clean_shutdown_and_a_restart_keeps_the_log(own_apache_kafka: ApacheKafka) -> None:
    # stop() is a controlled shutdown (the JVM exits, Kafka marks the log
    # directory clean); start() again serves the same log on the same address.
    bootstrap = own_apache_kafka.bootstrap
    topic = new_topic()
    await create_topic(bootstrap, topic, 2)  # type: ignore[arg-type]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(20):
            await producer.send_and_wait(topic, f"kept-{i}".encode(), key=b"tenant")
    finally:
        await producer.stop()
    pid = own_apache_kafka.pid
    assert pid is not None
    own_apache_kafka.stop()
    try:
        assert not psutil.pid_exists(pid), "the JVM outlived stop()"
        assert (own_apache_kafka.log_dir / ".kafka_cleanshutdown").exists()
    finally:
        assert own_apache_kafka.start() == bootstrap
    values = sorted(record.value for record in await read_to_end(bootstrap, topic))
    assert values == sorted(f"kept-{i}".encode() for i in range(20))


async def test_a_compacted_topic_keeps_only_the_latest_value_of_each_key(own_apache_kafka: ApacheKafka) -> None:
    # What the schedule-states topic relies on: the cleaner removes older
    # values of a key (and, after delete.retention.ms, a key's tombstone),
    # keeping the latest one. Only a closed segment is cleaned; segment.ms
    # closes the active one on the first append after 100 ms, so the wait
    # appends a filler record each round and polls.
    bootstrap = own_apache_kafka.bootstrap
    assert bootstrap is not None
    topic = new_topic()
    await create_topic(bootstrap, topic, 1, configs=AGGRESSIVE_COMPACTION)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for version in range(5):
            for key in range(10):
                await producer.send_and_wait(topic, f"v{version}".encode(), key=f"schedule-{key}".encode())
        # A tombstone: schedule 9 is gone. Its offset shows all 51 records were
        # appended (reading them back could race the cleaner).
        tombstone = await producer.send_and_wait(topic, None, key=b"schedule-9")
        fillers = 0

        async def compacted() -> list[ConsumerRecord] | None:
            nonlocal fillers
            await producer.send_and_wait(topic, b"filler", key=f"filler-{fillers}".encode())
            fillers += 1
            records = [r for r in await read_to_end(bootstrap, topic) if r.key.startswith(b"schedule-")]
            return records if len(records) == 9 else None

        records = await wait_for(compacted, timeout=60, interval=0.2)
    finally:
        await producer.stop()
    assert tombstone.offset == 50
    assert sorted((r.key, r.value) for r in records) == [(f"schedule-{k}".encode(), b"v4") for k in range(9)]


def test_the_broker_dies_with_the_process_that_started_it() -> None:
    # PR_SET_PDEATHSIG: a SIGKILLed parent (a crashed `chronoq up`, a killed
    # pytest) cannot run its cleanup, and the JVM must not outlive it.
    require_apache_kafka()
    base = Path(tempfile.mkdtemp(prefix="chronoq-test-apache-kafka-orphan-"))
    script = (
        "import sys; from pathlib import Path; from engine.cli.embedded.apache_kafka import ApacheKafka;"
        " broker = ApacheKafka(Path(sys.argv[1])); broker.start(); print(broker.pid, flush=True);"
        " sys.stdin.read()"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(base)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    jvm: psutil.Process | None = None
    try:
        line = parent.stdout.readline()  # type: ignore[union-attr]
        assert line.strip(), f"the parent did not start a broker: {parent.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
        jvm = psutil.Process(int(line))
        assert "kafka.Kafka" in jvm.cmdline()
        parent.kill()
        parent.wait()
        jvm.wait(timeout=30)  # raises TimeoutExpired if the JVM was orphaned
        jvm = None
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for stream in (parent.stdin, parent.stdout, parent.stderr):
            stream.close()  # type: ignore[union-attr]
        if jvm is not None and jvm.is_running():
            jvm.kill()
        shutil.rmtree(base, ignore_errors=True)

"""Kafka side of the relay on librdkafka (confluent-kafka): the publisher of the dispatch hot path.

Same guarantee and interface as :class:`relay.publisher.KafkaPublisher`: a
record is reported delivered only when the broker acknowledged it (acks=all);
an error, a timeout or no answer is reported as not delivered and the caller
keeps the row unpublished (the outcome of an unanswered send is unknown, and
retrying it may duplicate, which consumers dedupe).

Why librdkafka: measured on the development machine (docs/benchmarks.md),
producing pre-encoded occurrence messages into the embedded broker runs
several times faster than aiokafka's batch API, and its batching, compression
and network I/O run in C threads beside the Python event loop instead of
competing with it for one core. Records are keyed by schedule. An occurrence
record goes to the partition of its shard's range (``schemas.shard_placement``:
a node owning a contiguous range of shards produces to few partitions, in
large batches), the same partition :class:`relay.publisher.KafkaPublisher`
picks, so a schedule's occurrences keep their order on one partition whichever
client produced them; any other record is placed by librdkafka's murmur2
partitioner, the Java client's. A topic's partition count is read from the
broker's metadata when the publisher first uses it and again every
``partition_refresh`` seconds (partitions added to a topic are used after that).

Delivery reports are served by one polling thread; a batch completes (its
future resolves in the event loop) when the last of its records is reported.
The idempotent producer is off on tansu (no InitProducerId) and on against
Apache Kafka (``PublisherConfig``-like ``idempotent=True``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from relay.publisher import Outcome, OutgoingRecord
from schemas.kafka_security import PLAINTEXT, KafkaSecurity, start_client
from schemas.shard_placement import placement
from schemas.topics import DEFAULT_PARTITIONS, ensure_topics, placed_by_shard

log = logging.getLogger("chronoq.relay")

#: librdkafka error names that no retry of the same record can fix: the row is a poison row.
PERMANENT_ERRORS = frozenset(
    {
        "MSG_SIZE_TOO_LARGE",
        "_MSG_TIMED_OUT_PERMANENT",
        "TOPIC_AUTHORIZATION_FAILED",
        "INVALID_RECORD",
        "_INVALID_ARG",
        "TOPIC_EXCEPTION",
        "INVALID_TOPIC_EXCEPTION",
        "RECORD_LIST_TOO_LARGE",
        "_UNKNOWN_TOPIC",
        "UNKNOWN_TOPIC_OR_PART",
        "POLICY_VIOLATION",
    }
)


class DeliveryError(Exception):
    """A record the broker did not acknowledge; ``permanent`` when retrying the same record cannot help."""

    def __init__(self, name: str, text: str, permanent: bool) -> None:
        super().__init__(f"{name}: {text}")
        self.name = name
        self.permanent = permanent


@dataclass(frozen=True)
class LibrdkafkaConfig:
    """bootstrap: Kafka bootstrap servers ("host:port[,host:port]").
    partitions: partitions of the topics this publisher creates (default 8).
    replication_factor: of topics it creates (1 on the embedded broker).
    ack_timeout: seconds a record may wait for its acknowledgement (librdkafka's message.timeout.ms);
        after it the record is reported failed, outcome unknown (default 30).
    linger: seconds librdkafka waits to fill a batch (default 0.005).
    max_message_bytes: the largest record accepted (default 1 MiB, the broker default).
    idempotent: the idempotent producer (needs a broker with InitProducerId: Apache Kafka, not tansu).
    security: TLS and SASL (default PLAINTEXT), for librdkafka and for the admin client that creates topics.
    partition_refresh: seconds between re-reads of the occurrence topics' partition counts (default 60).
    compression: librdkafka's compression.type for every batch (default "lz4"; "none" turns it off). An occurrence
        message is JSON with repeated field names and instants: lz4 shrinks a burst's batches about fourfold, and
        the broker stores and serves them as they are. Measured on tansu (docs/benchmarks.md, "Compressed
        batches"): the broker's CPU per record fell from ~2.6 to ~1.5 µs when produced and from ~2.6 to ~0.8 µs
        when read by a consumer, the producer's and the consumer's own CPU unchanged. Every Kafka client decodes
        lz4 (aiokafka with cramjam, a dependency of chronoq).
    """

    bootstrap: str
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = 1
    ack_timeout: float = 30.0
    linger: float = 0.005
    max_message_bytes: int = 1024 * 1024
    idempotent: bool = False
    security: KafkaSecurity = PLAINTEXT
    partition_refresh: float = 60.0
    compression: str = "lz4"

    def producer_settings(self) -> dict[str, Any]:
        return {
            **self.security.librdkafka_options(),
            "bootstrap.servers": self.bootstrap,
            "acks": "all",
            "enable.idempotence": self.idempotent,
            "linger.ms": self.linger * 1000,
            "compression.type": self.compression,
            "batch.num.messages": 10_000,
            "batch.size": 1024 * 1024,
            "message.max.bytes": self.max_message_bytes + 64 * 1024,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 1024 * 1024,
            "message.timeout.ms": int(self.ack_timeout * 1000),
            "partitioner": "murmur2_random",
            "log_level": 3,
        }


def _delivery_error(err: Any) -> DeliveryError:
    name = err.name()
    return DeliveryError(name, err.str(), name in PERMANENT_ERRORS or err.fatal())


class _Batch:
    """Outcomes of one send call, filled by the delivery-report thread.

    One bound method is every record's delivery callback (no per-record closure: a burst hands hundreds
    of thousands of records over, and each allocation shows). A failed report carries the message, not
    its index; failures are matched back to the items by (topic, key, value) once the batch completes.
    Items with the same content all take the failure (a record that did arrive is then sent again, which
    consumers dedupe; never the other way round).
    """

    __slots__ = ("items", "errors", "failed", "left", "future", "loop")

    def __init__(self, items: Sequence[tuple[str, bytes, bytes, Any]], loop: asyncio.AbstractEventLoop) -> None:
        self.items = items
        self.errors: list[BaseException | None] = [None] * len(items)
        self.failed: list[tuple[Any, Any]] = []  # (librdkafka error, message) from the delivery thread
        self.left = len(items)
        self.loop = loop
        self.future: asyncio.Future[list[BaseException | None]] = loop.create_future()

    def report(self, err: Any, message: Any) -> None:
        """librdkafka's delivery report of one record (its polling thread)."""
        if err is not None:
            self.failed.append((err, message))
        self.left -= 1
        if self.left == 0:
            self.loop.call_soon_threadsafe(self._finish)

    def refuse(self, index: int, error: BaseException) -> None:
        """Item ``index`` was never handed to librdkafka."""
        self.errors[index] = error
        self.left -= 1
        if self.left == 0:
            self.loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        if self.future.done():
            return
        if self.failed:
            where: dict[tuple[Any, Any, Any], list[int]] = {}
            for index, (topic, key, value, _headers) in enumerate(self.items):
                where.setdefault((topic, key, value), []).append(index)
            for err, message in self.failed:
                error = _delivery_error(err)
                found = where.get((message.topic(), message.key(), message.value()))
                # A report that matches no item cannot be placed: every item's outcome is then unknown.
                for index in found if found is not None else range(len(self.items)):
                    if self.errors[index] is None:
                        self.errors[index] = error
        self.future.set_result(self.errors)


class LibrdkafkaPublisher:
    """Publishes pre-encoded records with librdkafka; see the module docstring for the guarantee."""

    def __init__(self, config: LibrdkafkaConfig) -> None:
        self.config = config
        self._producer: Any = None
        self._poller: threading.Thread | None = None
        self._stopping = threading.Event()
        self._known_topics: set[str] = set()
        # Partition counts of the occurrence topics (placed by shard range); a topic missing here, or
        # any other topic, is left to librdkafka's partitioner.
        self._partition_counts: dict[str, int] = {}
        self._counts_read_at = 0.0
        self._refreshing: asyncio.Task[None] | None = None
        self._admin: Any = None

    async def start(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient
        from confluent_kafka import Producer

        security = self.config.security
        admin = AIOKafkaAdminClient(bootstrap_servers=self.config.bootstrap, **security.client_options())
        # The admin client first: it fails (and is closed) when the broker is not reachable yet, before a
        # librdkafka producer exists whose threads would go on reconnecting after this start was given up.
        await start_client(admin, self.config.bootstrap, security)
        self._admin = admin
        self._producer = Producer(self.config.producer_settings())
        self._poller = threading.Thread(target=self._poll, name="librdkafka-delivery", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stopping.is_set():
            self._producer.poll(0.05)

    async def stop(self) -> None:
        if self._producer is None:
            return
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._producer.flush, 5.0)
        self._stopping.set()
        if self._poller:
            await loop.run_in_executor(None, self._poller.join, 5.0)
        await self._admin.close()
        self._producer = None

    async def ensure_topics(self, topics: Iterable[str]) -> None:
        """Create topics that do not exist yet, with the configured partition count."""
        missing = sorted(set(topics) - self._known_topics)
        if missing:
            await ensure_topics(self._admin, missing, self.config.partitions, self.config.replication_factor)
            # Learn the partition leaders now, not on the first produce: a relay that read a page ahead
            # of its due time must not spend the first half second after it fetching metadata.
            await self._read_partition_counts(missing)
            self._known_topics.update(missing)
        elif time.monotonic() - self._counts_read_at > self.config.partition_refresh and (
            self._refreshing is None or self._refreshing.done()
        ):
            # In the background: a burst's send never waits for a metadata round trip. Only the placed
            # topics: librdkafka refreshes the leaders of every topic itself.
            placed = sorted(t for t in self._known_topics if placed_by_shard(t))
            self._refreshing = asyncio.create_task(self._read_partition_counts(placed))

    async def _read_partition_counts(self, topics: Sequence[str]) -> None:
        """Read ``topics``' metadata (librdkafka keeps it too) and note the occurrence topics' partition
        counts; a topic whose metadata cannot be read keeps its last count, or none (murmur2)."""
        loop = asyncio.get_running_loop()
        for topic in topics:
            try:
                metadata = await loop.run_in_executor(None, self._producer.list_topics, topic, 10.0)
            except Exception as err:  # noqa: BLE001 - KafkaException; the partitioner is the fallback
                log.warning(
                    "could not read a topic's partitions; its records are hashed until the next read",
                    extra={"action": "publisher.metadata_failed", "topic": topic, "error": repr(err)},
                )
                continue
            described = metadata.topics.get(topic)
            if placed_by_shard(topic) and described is not None and described.error is None and described.partitions:
                self._partition_counts[topic] = len(described.partitions)
        self._counts_read_at = time.monotonic()
        if any(placed_by_shard(t) and t not in self._partition_counts for t in topics):
            # A topic just created may not list its partitions yet: look again in a second, not a minute,
            # so its schedules do not change partition a minute into its life.
            self._counts_read_at -= max(self.config.partition_refresh - 1.0, 0.0)

    async def send(
        self, items: Sequence[tuple[str, bytes, bytes, list[tuple[str, bytes]] | None]]
    ) -> asyncio.Future[list[BaseException | None]]:
        """Hand (topic, key, value, headers) items to librdkafka; the returned future resolves to one
        error-or-None per item, in order, once every item is acknowledged or has failed."""
        loop = asyncio.get_running_loop()
        batch = _Batch(items, loop)
        if not items:
            batch.future.set_result([])
            return batch.future
        await self.ensure_topics({item[0] for item in items})
        produce, report, limit = self._producer.produce, batch.report, self.config.max_message_bytes
        counts = self._partition_counts
        for index, (topic, key, value, headers) in enumerate(items):
            if len(value) > limit:
                batch.refuse(index, DeliveryError("MSG_SIZE_TOO_LARGE", _too_large(len(value), limit), True))
                continue
            partitions = counts.get(topic)
            partition = placement(key, partitions) if partitions else None
            if partition is None:
                partition = -1  # librdkafka's partitioner (murmur2 of the key)
            try:
                # Positional (topic, value, key, partition, callback, its alias, timestamp 0 = now,
                # headers): keyword arguments cost a dict per record in this C call.
                produce(topic, value, key, partition, report, None, 0, headers)
            except BufferError:
                await self._produce_when_room(topic, value, key, partition, headers, report)
        return batch.future

    async def _produce_when_room(
        self, topic: str, value: bytes, key: bytes, partition: int, headers: Any, callback: Any
    ) -> None:
        """The local queue is full: let the broker catch up, then produce."""
        while True:
            await asyncio.sleep(0.005)
            try:
                self._producer.produce(topic, value, key, partition, callback, None, 0, headers)
                return
            except BufferError:
                continue

    async def publish(self, records: Sequence[OutgoingRecord]) -> Outcome:
        """Publish all records; return ref → None (acknowledged) or the error (the late lane's interface)."""
        future = await self.send([(r.topic, r.key, r.value, list(r.headers)) for r in records])
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that arrives with
            # the acknowledgement, and a cancelled relay loop would carry on.
            async with asyncio.timeout(self.config.ack_timeout + 5):
                errors = await future
        except TimeoutError:
            unknown = TimeoutError("no acknowledgement within ack_timeout: outcome unknown")
            return {r.ref: unknown for r in records}
        outcome: dict[Hashable, BaseException | None] = {}
        for record, error in zip(records, errors, strict=True):
            outcome[record.ref] = error
        return outcome


def _too_large(size: int, limit: int) -> str:
    return f"record of {size} bytes exceeds max_message_bytes {limit}"

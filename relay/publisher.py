"""Kafka side of the relay: publish records in partition batches, report each outcome.

Guarantee: :meth:`KafkaPublisher.publish` reports a record as delivered only
when the broker acknowledged it (acks=all). Anything else — an error, a
timeout, a broker that never answered — is reported as not delivered, and the
caller keeps the outbox row unsent. The outcome of an unanswered send is
unknown; retrying it may duplicate the message, which consumers dedupe.

Records are grouped by (topic, partition) into explicit batches (aiokafka's
batch API: about ten times the rate of one awaited ``send`` per message on the
embedded broker). An occurrence record keyed by its schedule goes to the
partition of its shard's range (``schemas.shard_placement``), as the ahead
lane's librdkafka publisher places it, so a schedule's occurrences share one
partition whichever lane published them; any other record's partition is
chosen by the same murmur2 partitioner as Kafka's Java client.

A failure is confined to the records it is about: a topic that cannot be
created fails only its own records, and a partition batch the broker refuses
for a reason that may be one record's (too large...) is sent again one record
per batch, so only the culprit fails (``relay/publish_refusals.py``).

``PublisherConfig.idempotent`` turns on the idempotent producer: the broker
then recognises a batch the producer retried after a lost response and keeps
one copy (Apache Kafka does; tansu lacks InitProducerId, so it is off by
default). It removes duplicates from retries inside one producer session
only; duplicates across relay restarts remain, and consumers dedupe those.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import InvalidTopicError, KafkaError

from relay.publish_refusals import REFUSED, TOO_LARGE, RecordTooLarge, refusal_reason
from schemas.kafka_security import PLAINTEXT, KafkaSecurity, start_client
from schemas.key_partitioning import key_partition
from schemas.shard_placement import placement
from schemas.topics import DEFAULT_PARTITIONS, ensure_topics, placed_by_shard

# Refusals of a batch that may be one member's fault (unlike a topic's: every member shares it).
_MAYBE_ONE_RECORDS_FAULT = frozenset({TOO_LARGE, REFUSED})

# Kafka's rule for topic names (org.apache.kafka.common.internals.Topic).
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@dataclass(frozen=True)
class OutgoingRecord:
    ref: Hashable  # the caller's handle (outbox row id)
    topic: str
    key: bytes
    value: bytes
    headers: Sequence[tuple[str, bytes]] = ()


@dataclass(frozen=True)
class PublisherConfig:
    """bootstrap: Kafka bootstrap servers ("host:port[,host:port]").
    partitions: partitions of topics this publisher creates (default 8).
    replication_factor: of topics it creates (1 on the embedded broker).
    ack_timeout: seconds to wait for all acknowledgements of one publish call
        before treating the rest as unknown outcomes (default 30).
    max_batch_bytes: upper bound of one partition batch, and of one record (default
        1 MiB, Apache Kafka's default message.max.bytes): a larger record is
        refused before it is sent, on every broker.
    idempotent: use the idempotent producer (default False; needs a broker
        with InitProducerId: Apache Kafka yes, tansu no).
    security: TLS and SASL of the producer and admin client (default PLAINTEXT).
    compression: of every batch (default "lz4", as the librdkafka publisher; None: uncompressed). The broker
        applies its message size limit to the compressed batch; this publisher's own limit (max_batch_bytes)
        is on the record as encoded, so a record it accepts is one every broker accepts.
    """

    bootstrap: str
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = 1
    ack_timeout: float = 30.0
    max_batch_bytes: int = 1024 * 1024
    idempotent: bool = False
    security: KafkaSecurity = PLAINTEXT
    compression: str | None = "lz4"


Outcome = dict[Hashable, BaseException | None]


class KafkaPublisher:
    def __init__(self, config: PublisherConfig) -> None:
        self.config = config
        self.producer = AIOKafkaProducer(
            bootstrap_servers=config.bootstrap,
            acks="all",
            enable_idempotence=config.idempotent,
            max_batch_size=config.max_batch_bytes,
            max_request_size=max(config.max_batch_bytes, 1024 * 1024),
            request_timeout_ms=int(config.ack_timeout * 1000),
            compression_type=config.compression,
            **config.security.client_options(),
        )
        self.admin = AIOKafkaAdminClient(bootstrap_servers=config.bootstrap, **config.security.client_options())
        self._known_topics: set[str] = set()

    async def start(self) -> None:
        """Start both clients, or neither: a failed start leaves nothing running (the caller may retry with a
        new publisher)."""
        await start_client(self.producer, self.config.bootstrap, self.config.security)
        try:
            await start_client(self.admin, self.config.bootstrap, self.config.security)
        except BaseException:
            await self.producer.stop()
            raise

    async def stop(self) -> None:
        await self.producer.stop()
        await self.admin.close()

    async def ensure_topics(self, topics: Iterable[str]) -> None:
        """Create topics that do not exist yet, with the configured partition count."""
        missing = sorted(set(topics) - self._known_topics)
        if missing:
            await ensure_topics(self.admin, missing, self.config.partitions, self.config.replication_factor)
            self._known_topics.update(missing)

    async def _creatable(self, topics: Iterable[str], outcome: dict[str, BaseException]) -> None:
        """Create missing topics; a topic that fails gets its error in ``outcome`` and fails only its rows.

        A name Kafka's rules forbid is refused here, before any broker sees it: tansu would create it,
        Apache Kafka would not, and the relay must behave as production does on either.
        """
        missing = []
        for topic in sorted(set(topics) - self._known_topics):
            if _LEGAL_TOPIC.fullmatch(topic) is None or topic in (".", ".."):
                outcome[topic] = InvalidTopicError(f"{topic[:300]!r} is not a legal Kafka topic name")
            else:
                missing.append(topic)
        if not missing:
            return
        try:
            await self.ensure_topics(missing)
        except KafkaError:
            for topic in missing:  # one at a time, to find which of them cannot be created
                try:
                    await self.ensure_topics([topic])
                except KafkaError as err:
                    outcome[topic] = err

    async def publish(self, records: Sequence[OutgoingRecord]) -> Outcome:
        """Publish all records; return ref → None (acknowledged) or the error."""
        outcome: Outcome = {}
        failed_topics: dict[str, BaseException] = {}
        await self._creatable({r.topic for r in records}, failed_topics)
        sendable = []
        for record in records:
            if record.topic in failed_topics:
                outcome[record.ref] = failed_topics[record.topic]
            else:
                sendable.append(record)
        groups = await self._partition_groups(sendable, outcome)
        refused = await self._send(groups, outcome, one_per_batch=False)
        if refused:
            # The broker refused whole batches for a reason that may be one member's (a record too
            # large...): send those members one per batch, so only the culprits fail.
            for record in refused:
                del outcome[record.ref]
            await self._send(await self._partition_groups(refused, outcome), outcome, one_per_batch=True)
        return outcome

    async def _send(
        self, groups: dict[tuple[str, int], list[OutgoingRecord]], outcome: Outcome, one_per_batch: bool
    ) -> list[OutgoingRecord]:
        """Send partition batches and await them; the members of refused multi-record batches are returned."""
        pending: dict[asyncio.Future[Any], list[OutgoingRecord]] = {}
        submitted: list[list[OutgoingRecord]] = []
        for (topic, partition), group in groups.items():
            batch, members = self.producer.create_batch(), list[OutgoingRecord]()
            for record in group:
                if _size(record) > self.config.max_batch_bytes:
                    # A first record always fits an empty aiokafka batch, whatever its size; tansu then stores
                    # it while Apache Kafka refuses it (message.max.bytes, 1 MiB by default): refuse it here.
                    outcome[record.ref] = RecordTooLarge(
                        f"record of {_size(record)} bytes larger than max_batch_bytes ({self.config.max_batch_bytes})"
                    )
                    continue
                if (one_per_batch and members) or not _append(batch, record):
                    if members:
                        submitted.append(members)
                        await self._submit(batch, topic, partition, members, pending, outcome)
                    batch, members = self.producer.create_batch(), []
                    if not _append(batch, record):
                        outcome[record.ref] = RecordTooLarge(
                            f"record of {len(record.value)} bytes larger than max_batch_bytes"
                            f" ({self.config.max_batch_bytes})"
                        )
                        continue
                members.append(record)
            if members:
                submitted.append(members)
                await self._submit(batch, topic, partition, members, pending, outcome)
        if pending:
            await self._await_acknowledgements(pending, outcome)
        if one_per_batch:
            return []
        return [
            record
            for members in submitted
            if len(members) > 1 and refusal_reason(outcome.get(members[0].ref)) in _MAYBE_ONE_RECORDS_FAULT
            for record in members
        ]

    async def _partition_groups(
        self, records: Sequence[OutgoingRecord], outcome: Outcome
    ) -> dict[tuple[str, int], list[OutgoingRecord]]:
        """Records by (topic, partition): an occurrence record's by its shard's range, any other's by
        Kafka's murmur2 partitioner (``schemas.key_partitioning``); a topic whose partitions cannot be
        learned fails its records."""
        groups: dict[tuple[str, int], list[OutgoingRecord]] = {}
        partitions_of: dict[str, list[int] | BaseException] = {}
        for record in records:
            if record.topic not in partitions_of:
                try:
                    partitions_of[record.topic] = sorted(await self.producer.partitions_for(record.topic))
                except KafkaError as err:
                    partitions_of[record.topic] = err
            partitions = partitions_of[record.topic]
            if isinstance(partitions, BaseException):
                outcome[record.ref] = partitions
                continue
            index = placement(record.key, len(partitions)) if placed_by_shard(record.topic) else None
            if index is not None:
                partition = partitions[index]
            else:
                partition = key_partition(record.key, partitions)
            groups.setdefault((record.topic, partition), []).append(record)
        return groups

    async def _submit(
        self,
        batch: Any,
        topic: str,
        partition: int,
        members: list[OutgoingRecord],
        pending: dict[asyncio.Future[Any], list[OutgoingRecord]],
        outcome: Outcome,
    ) -> None:
        """Send one batch: its future joins ``pending``, or a refusal is every member's outcome."""
        try:
            future = await self.producer.send_batch(batch, topic, partition=partition)
        except KafkaError as err:
            outcome.update((record.ref, err) for record in members)
        else:
            pending[future] = members

    async def _await_acknowledgements(
        self, pending: dict[asyncio.Future[Any], list[OutgoingRecord]], outcome: Outcome
    ) -> None:
        """Each batch's acknowledgement or error; unanswered within ack_timeout is an unknown outcome."""
        done, not_done = await asyncio.wait(pending, timeout=self.config.ack_timeout)
        for future in done:
            error = future.exception()
            outcome.update((record.ref, error) for record in pending[future])
        for future in not_done:
            future.cancel()
            unknown = TimeoutError("no acknowledgement within ack_timeout: outcome unknown")
            outcome.update((record.ref, unknown) for record in pending[future])


def _size(record: OutgoingRecord) -> int:
    """The record's bytes on the wire, near enough (key, value, headers; not the few bytes of framing)."""
    return len(record.key) + len(record.value) + sum(len(k) + len(v or b"") for k, v in record.headers)


def _append(batch: Any, record: OutgoingRecord) -> bool:
    """Append to an aiokafka batch; False when the batch is full."""
    return batch.append(key=record.key, value=record.value, timestamp=None, headers=list(record.headers)) is not None

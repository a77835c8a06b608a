"""Sending the attempt processor's answers to ``started`` (``chronoq.attempt-grants``).

The processor calls :meth:`GrantSink.send` after the transaction that applied the batch committed, so an
answer never runs ahead of the state it reports. Each answer goes to the partition of its consumer group
(``schemas.attempt_grants.grant_partition``), keyed by occurrence; answers to ``started`` events that came
in a group go back as groups (``schemas.attempt_grants``, format 2), the others one record each. A reply
the broker does not take is logged and dropped, never retried and never re-reading the batch: the waiting
runtime hears nothing within its bound, rolls back and sends a new ``started`` (a later claim), whose answer
follows the state again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from opentelemetry import metrics

from schemas import observability as obs
from schemas.attempt_grants import MAX_GROUP_GRANTS, AttemptGrant, encode_grant_group, grant_partition
from schemas.kafka_security import PLAINTEXT, KafkaSecurity, start_client
from schemas.messages import Record
from schemas.produce_batches import SHARED_BATCH_BYTES, send_in_batches, send_shared
from schemas.topics import ATTEMPT_GRANTS_TOPIC

log = logging.getLogger("chronoq.attempts")


class GrantSink(Protocol):
    """Where the processor's answers go (Kafka in production; a list in tests)."""

    async def send(self, grants: Sequence[AttemptGrant], grouped: bool = False) -> None:
        """Deliver ``grants`` (``grouped``: as group records, for runtimes that sent their ``started`` in
        groups)."""


class GrantPublisher:
    """Produces answers to ``chronoq.attempt-grants`` (acks=all) and counts them (``chronoq.attempt_grants_sent``)."""

    def __init__(
        self, bootstrap: str, meter: metrics.Meter, timeout: float = 10.0, security: KafkaSecurity = PLAINTEXT
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.timeout = timeout
        self.sent = 0
        self._counter = meter.create_counter(
            obs.ATTEMPT_GRANTS_SENT, unit="1", description="answers to started sent on chronoq.attempt-grants"
        )
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=False,
            request_timeout_ms=int(self.timeout * 1000),
            # As the relay's: lz4 batches cost the broker a fraction of uncompressed ones (docs/benchmarks.md).
            compression_type="lz4",
            # Answer groups of concurrent transactions share a partition's batch (schemas/produce_batches.py).
            max_batch_size=SHARED_BATCH_BYTES,
            **self.security.client_options(),
        )
        await start_client(producer, self.bootstrap, self.security)
        self._producer = producer

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def send(self, grants: Sequence[AttemptGrant], grouped: bool = False) -> None:
        """Produce every answer and wait for the acknowledgements; a failure is logged, not raised.

        The answers of one consumer group share a partition, so they go as Kafka batches
        (``schemas.produce_batches``) rather than one keyed ``send`` each: one record per answer, or with
        ``grouped`` one group record per consumer group and :data:`MAX_GROUP_GRANTS` answers."""
        if not grants or self._producer is None:
            return
        producer = self._producer
        try:
            async with asyncio.timeout(self.timeout):
                partitions = len(await producer.partitions_for(ATTEMPT_GRANTS_TOPIC))
                by_partition: dict[int, list[AttemptGrant]] = {}
                for grant in grants:
                    by_partition.setdefault(grant_partition(grant.consumer_group, partitions), []).append(grant)
                acknowledgements = []
                for partition, group in by_partition.items():
                    if grouped:
                        sent = await send_shared(producer, ATTEMPT_GRANTS_TOPIC, partition, _group_records(group))
                    else:
                        sent = await send_in_batches(producer, ATTEMPT_GRANTS_TOPIC, partition, _records(group))
                    acknowledgements += sent
                await asyncio.gather(*acknowledgements)
        except (TimeoutError, KafkaError) as err:
            # The runtimes waiting for these retry in place after their bound (a new, later claim).
            log.warning(
                "answers to started not delivered; the waiting consumers retry after their bound",
                extra={"action": "attempt.grants_failed", "grants": len(grants), "error": repr(err)},
            )
            return
        self.sent += len(grants)
        for (result, reason), n in Counter((g.result, g.reason or "") for g in grants).items():
            self._counter.add(n, {"result": result, "reason": reason})


def _records(grants: Sequence[AttemptGrant]) -> Iterator[Record]:
    return ((grant.key, grant.encode(), grant.headers()) for grant in grants)


def _group_records(grants: Sequence[AttemptGrant]) -> Iterator[Record]:
    """Group records of at most MAX_GROUP_GRANTS answers, one consumer group each, the answers in order."""
    by_group: dict[str, list[AttemptGrant]] = {}
    for grant in grants:
        by_group.setdefault(grant.consumer_group, []).append(grant)
    for group in by_group.values():
        for start in range(0, len(group), MAX_GROUP_GRANTS):
            yield encode_grant_group(group[start : start + MAX_GROUP_GRANTS])

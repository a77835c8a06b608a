"""Producing many records to one partition: as aiokafka batches of their own, or into the partition's shared batch.

A keyed ``send`` costs aiokafka a future and an accumulator round per message; ``create_batch`` /
``send_batch`` (:func:`send_in_batches`) fill a batch up to the producer's ``max_batch_size`` and hand it
over whole: the way for many single records. But aiokafka keeps **one produce request in flight per broker,
carrying one batch per partition**, and a batch handed over whole is never shared: every caller's batch for a
partition waits for the previous one's round trip. Group records (``schemas/attempt_events.py``: up to 500
events or 1,000 answers each, a few per call) therefore go through ``send`` (:func:`send_shared`): while a
request is in flight, the group records of every concurrent caller for that partition gather in its open
batch (up to :data:`SHARED_BATCH_BYTES`, the producer's ``max_batch_size``) and leave together in the next
request. Handed over one batch each, a consumer app with 16 handler batches in flight queued its reports
behind each other's round trips until some waited out the 10 s report timeout and were sent again (stop 51,
docs/benchmarks.md). No I/O of its own beyond the producer's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaProducer

from schemas.messages import Record

#: ``max_batch_size`` of the producers that send group records: several groups (each at most 256 KiB, a batch
#: handler's usually tens of KiB) share a partition's batch. Below every broker's default largest batch
#: (1 MiB, ``message.max.bytes``), which applies to the compressed batch; this bounds the uncompressed one.
SHARED_BATCH_BYTES = 512 * 1024


async def send_in_batches(
    producer: AIOKafkaProducer, topic: str, partition: int, records: Iterable[Record]
) -> list[asyncio.Future[Any]]:
    """Hand ``records`` to the producer for ``topic``/``partition`` in order, as full batches; the
    acknowledgement futures, one per batch, for the caller to await."""
    acknowledgements = []
    batch = producer.create_batch()
    for key, value, headers in records:
        if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
            # Full: send it and start the next with this record (a record of these topics, a few hundred
            # bytes, always fits an empty batch).
            acknowledgements.append(await producer.send_batch(batch, topic, partition=partition))
            batch = producer.create_batch()
            batch.append(key=key, value=value, timestamp=None, headers=headers)
    acknowledgements.append(await producer.send_batch(batch, topic, partition=partition))
    return acknowledgements


async def send_shared(
    producer: AIOKafkaProducer, topic: str, partition: int, records: Iterable[Record]
) -> list[asyncio.Future[Any]]:
    """Hand ``records`` to the producer for ``topic``/``partition`` in order, each into the partition's open
    batch (shared with every other caller's records for it); the acknowledgement futures, one per record, for
    the caller to await. For few, large records (groups): a future per record is cheap then, and records of
    concurrent callers leave in one request instead of one round trip each."""
    return [
        await producer.send(topic, value, key=key, headers=headers, partition=partition)
        for key, value, headers in records
    ]

"""Producing many records to one partition as aiokafka batches instead of one ``send`` each.

A keyed ``send`` costs aiokafka a future and an accumulator round per message; ``create_batch`` /
``send_batch`` fill a batch up to the producer's ``max_batch_size`` and hand it over whole. The
consumer runtime's attempt reports and the engine's answers to ``started`` both go this way (single records,
or group records holding many events or answers: ``schemas/attempt_events.py``), so they share this one
loop. No I/O of its own beyond the producer's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaProducer

#: One record: key, value, headers.
Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


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

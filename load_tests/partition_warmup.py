"""Grow every partition's fresh segment before the measured burst (Apache Kafka), and leave no record behind.

Why: on Apache Kafka (as chronoq configures it: a flush per append, ext4 here) the first megabyte or so written
into a partition's fresh segment costs the broker far more kernel time than later writes. Measured 2026-12-05
(``docs/benchmarks.md``, stop 36): two idempotent librdkafka producers, 250,000 records in pages of 8,192 into
four new topics of 8 partitions took 3.6 s with 4.0 core-seconds of the broker's system time, and 1.3 s with
0.35 after these topics were grown by this module first (the same 1.2-1.3 s as a second burst into any topic).
A production topic pays that once per segment (1 GiB or a week per partition); a load test that creates its
topics minutes before the burst paid it inside the burst, where it decided the p99.

:func:`warm_partitions` writes ``records`` incompressible headerless records to every partition, then deletes
them (DeleteRecords moves the log start offset past them; the active segment, grown, stays), so consumer groups
and read-backs start after them. Apache Kafka only: tansu has no DeleteRecords (and no such first-write cost
was measured there).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

WARM_UP_VALUE = b"load test partition warm-up: not an occurrence "


def _warm(bootstrap: str, topics: Sequence[str], records: int, timeout: float) -> int:
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=timeout)
    missing = [topic for topic in topics if topic not in metadata.topics]
    if missing:
        raise RuntimeError(f"partition warm-up: topics {missing} do not exist; create them first")
    partitions = [(topic, partition) for topic in topics for partition in metadata.topics[topic].partitions]
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 1024 * 1024,
        }
    )
    for topic, partition in partitions:
        for _ in range(records):
            # Incompressible, as a burst's compressed batches are: the bytes the segment grows by are what count.
            producer.produce(topic, WARM_UP_VALUE + os.urandom(300), partition=partition)
        producer.poll(0)
    if producer.flush(timeout) != 0:
        raise RuntimeError(f"partition warm-up: records not acknowledged within {timeout} s")
    deleted = admin.delete_records([TopicPartition(t, p, -1) for t, p in partitions], request_timeout=timeout)
    for future in deleted.values():
        future.result()  # raises: a warm-up record left behind would reach consumer apps as a poison message
    return len(partitions)


async def warm_partitions(bootstrap: str, topics: Sequence[str], records: int = 4_000, timeout: float = 60.0) -> int:
    """Append ``records`` records to every partition of ``topics`` and delete them again; returns the partitions
    written."""
    return await asyncio.to_thread(_warm, bootstrap, topics, records, timeout)

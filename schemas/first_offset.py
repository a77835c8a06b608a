"""Reading a partition from its first record: by offset 0, never by the broker's "earliest".

Kafka's ListOffsets(EARLIEST) is meant to answer the log's first offset. tansu
(v0.6.0, memory storage) answers it with the base offset of the batch whose
object was *stored first in time*, and it allocates a batch's offsets before it
stores the batch: when two producers write one partition at once, the batch of
the higher offsets can be stored first, and "earliest" then points past the
other one. Every reader that asks for the beginning (``seek_to_beginning``, a
new group's ``auto_offset_reset="earliest"``, librdkafka's ``OFFSET_BEGINNING``)
silently starts after records that are in the log. Measured 2026-12-08: a
900 kB batch and a one-record batch sent to each of 64 partitions a moment
apart left 1-7 partitions per topic with an "earliest" of 1; the suite's
concurrent-relays test read 198 of 200 published records once in CI.

So chronoq positions such readers at offset 0 itself. A broker whose log starts
later (Apache Kafka after retention deleted the first segments) answers that
fetch with OFFSET_OUT_OF_RANGE, and the consumer's ``auto_offset_reset=
"earliest"`` then moves it to the log start: correct there, because that
broker's "earliest" is the log start. A partition the group has committed an
offset for is left where the group left it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

#: The first offset of a partition that nothing was ever deleted from.
FIRST_OFFSET = 0

log = logging.getLogger("chronoq.kafka")


def seek_to_first(consumer: AIOKafkaConsumer, partitions: Collection[TopicPartition]) -> None:
    """Position an assigning consumer at offset 0 of each partition (the consumer must have been created with
    ``auto_offset_reset="earliest"``, so a log that starts later resolves to its start)."""
    for tp in partitions:
        consumer.seek(tp, FIRST_OFFSET)


async def start_uncommitted_at_first(consumer: AIOKafkaConsumer, partitions: Collection[TopicPartition]) -> None:
    """Position each of ``partitions`` that the consumer's group has no committed offset for at offset 0.
    Called when a group assigns partitions, before the consumer fetches them."""
    chosen = list(partitions)
    committed = await asyncio.gather(*(consumer.committed(tp) for tp in chosen))
    seek_to_first(consumer, [tp for tp, offset in zip(chosen, committed, strict=True) if offset is None])


class FromFirstOffset(ConsumerRebalanceListener):
    """A rebalance listener that starts the group's uncommitted partitions at offset 0 (module docstring),
    then calls ``assigned`` / ``revoked`` when given."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        assigned: Callable[[list[TopicPartition]], Awaitable[None]] | None = None,
        revoked: Callable[[list[TopicPartition]], Awaitable[None]] | None = None,
    ) -> None:
        self.consumer = consumer
        self.assigned = assigned
        self.revoked = revoked

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if self.revoked is not None:
            await self.revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        partitions = list(assigned)
        try:
            await start_uncommitted_at_first(self.consumer, partitions)
        except Exception as err:  # noqa: BLE001 - the group still reads; only tansu's "earliest" is then trusted
            log.warning(
                "could not learn the group's committed offsets; new partitions start at the broker's earliest",
                extra={"action": "kafka.first_offset_unknown", "error": repr(err)},
            )
        if self.assigned is not None:
            await self.assigned(partitions)

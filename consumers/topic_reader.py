"""Reading topics without a consumer group (the schedule-state and target-binding views, the grants).

Each view reads its topic from the beginning on every partition and keeps the
newest record per key; no group, so reading never triggers a rebalance and
every app instance sees every record. A view's reader runs for the app's whole
life (:func:`keep_reading`): a failed read is logged and retried, never the
end of the reader — a view that silently stops reading would turn every later
verdict stale (a tenant's binding never seen, a grant never received).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.capped_backoff import capped_doubling
from schemas.clock import pause
from schemas.first_offset import seek_to_first
from schemas.kafka_security import KafkaSecurity, closed_on_failure, start_client
from schemas.topics import topic_partitions


async def open_from_beginning(
    bootstrap: str, topic: str, deadline: float, security: KafkaSecurity
) -> tuple[AIOKafkaConsumer, list[TopicPartition]]:
    """A started, group-less consumer assigned every partition of ``topic`` at its beginning.

    Waits until the event loop's ``deadline`` for the topic to appear (it may have been created a
    moment ago); the partitions are ``[]`` and nothing is assigned when it did not. The caller stops
    the consumer.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **security.client_options(),
    )
    await start_client(consumer, bootstrap, security)
    async with closed_on_failure(consumer):
        loop = asyncio.get_running_loop()
        # Partitions from an admin client, not consumer.partitions_for_topic: an assigning consumer has
        # no topic metadata on Apache Kafka (schemas.topics.topic_partitions).
        partitions = await topic_partitions(bootstrap, topic, security)
        while not partitions and loop.time() < deadline:
            await asyncio.sleep(0.05)
            partitions = await topic_partitions(bootstrap, topic, security)
        assigned = [TopicPartition(topic, p) for p in partitions]
        if assigned:
            consumer.assign(assigned)
            seek_to_first(consumer, assigned)  # not seek_to_beginning: tansu's can point past records
    return consumer, assigned


async def keep_reading(
    read: Callable[[], Awaitable[None]],
    more: Callable[[], bool],
    stop: asyncio.Event | None,
    log: logging.Logger,
    view: str,
    backoff: float = 0.2,
    backoff_max: float = 5.0,
) -> None:
    """Call ``read`` while ``more()`` and ``stop`` is not set; an error (the broker away, a fetch refused)
    is logged (``action=consumer.view_read_failed``) and retried after a capped backoff."""
    delays = capped_doubling(backoff, backoff_max)
    while (stop is None or not stop.is_set()) and more():
        try:
            await read()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a reader must outlive any one failed read
            wait = next(delays)
            log.warning(
                "reading %s failed; retrying",
                view,
                extra={"action": "consumer.view_read_failed", "view": view, "error": repr(err), "backoff": wait},
            )
            if stop is None:
                await asyncio.sleep(wait)
            else:
                await pause(stop, wait)
        else:
            delays = capped_doubling(backoff, backoff_max)

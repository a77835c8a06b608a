"""An engine Kafka loop whose group joined before its topic was visible still reads it, within seconds.

Found by the suite: `chronoq up --kafka apache` created `chronoq.attempts` and subscribed its attempt
processor at once; Apache Kafka had accepted the creation but its metadata did not show the topic yet, so the
group's leader assigned no partitions, and aiokafka rejoins only when a metadata refresh shows them — after
five minutes by default. The attempt processor read nothing, no `started` was answered, and the consumer
waited in vain. Two things guard it now: the topics chronoq creates are described by the broker before
creation returns (``schemas.topics.ensure_topics``), and the engine's loops refresh metadata every
``METADATA_REFRESH_S``. The fault is made certain here by subscribing before the topic exists at all.
(tansu creates a topic that a metadata request names, so the window does not exist there.)
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from engine.loops.kafka_processor import KafkaLoopSettings, KafkaProcessorLoop
from schemas.topics import METADATA_REFRESH_S, create_missing_topics, topic_partitions
from tests.support.kafka import produce
from tests.support.waiting import wait_for

pytestmark = pytest.mark.on_broker("apache")


async def group_is_stable(bootstrap: str, group: str) -> bool:
    """Whether the broker reports ``group`` joined and settled (its first assignment made); not yet while its
    coordinator is still being chosen."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([group])
    except KafkaError:
        return False
    finally:
        await admin.close()
    (described,) = response.to_object()["groups"]
    return bool(described["state"] == "Stable")


async def test_a_loop_subscribed_before_its_topic_existed_reads_it_once_created(kafka_bootstrap):
    topic = f"test.late.{uuid.uuid4().hex[:10]}"
    handled: list[bytes] = []

    async def handle(records) -> dict[str, int]:
        handled.extend(r.value for r in records)
        return {"applied": len(records)}

    group = f"late-{uuid.uuid4().hex[:8]}"
    settings = KafkaLoopSettings(group, topic, (), 6.0, 1.0, error_backoff=0.1)
    loop = KafkaProcessorLoop("late", kafka_bootstrap, settings, handle, logging.getLogger("test.late"))
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        # The group joins with the topic unknown: it is stable with nothing assigned.
        await wait_for(lambda: group_is_stable(kafka_bootstrap, group), timeout=30)
        assert not task.done()
        await create_missing_topics(kafka_bootstrap, [topic])
        await produce(kafka_bootstrap, topic, [b"after"])
        # A refresh, a rejoin and a fetch; aiokafka's own default would take five minutes.
        await wait_for(lambda: handled == [b"after"], timeout=METADATA_REFRESH_S + 20)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@pytest.mark.on_broker("apache", "tansu")
async def test_created_topics_are_described_with_their_partitions_when_creation_returns(kafka_bootstrap):
    """What a consumer group joining right after the creation relies on: no window in which the broker has
    accepted the topics but describes them as unknown."""
    topics = [f"test.fresh.{uuid.uuid4().hex[:10]}" for _ in range(3)]
    await create_missing_topics(kafka_bootstrap, topics, partitions=4)
    for topic in topics:
        assert await topic_partitions(kafka_bootstrap, topic) == [0, 1, 2, 3]

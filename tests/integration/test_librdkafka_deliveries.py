"""The librdkafka publisher reports each record's own outcome, on a real broker.

Delivery reports carry the message, not the caller's index (one bound callback for a whole batch, no
per-record closure): these tests prove a broker's refusal of one record lands on that record, and only
on it, in a batch of otherwise good ones.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from relay.librdkafka_publisher import DeliveryError
from tests.support.kafka import create_topic_with_limit, librdkafka_publisher

TOPIC_LIMIT = 4_000  # the topic's max.message.bytes: the broker refuses a record batch above it


@pytest.fixture
async def publisher(kafka_bootstrap):
    async with librdkafka_publisher(kafka_bootstrap) as publisher:
        yield publisher


def items(topic: str, sizes: list[int]) -> list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]:
    """Records of about the given sizes even compressed (the publisher compresses batches, and a broker's size
    limit applies to the compressed batch): random bytes, not a repeated character."""
    return [
        (
            topic,
            f"key-{i}".encode(),
            f"{i:08d}".encode() + os.urandom(size),
            [("chronoq-occurrence-id", str(i).encode())],
        )
        for i, size in enumerate(sizes)
    ]


async def test_every_record_of_a_batch_is_reported_in_order(publisher, target):
    batch = items(f"chronoq.occurrences.{target}", [100] * 500)
    errors = await asyncio.wait_for(await publisher.send(batch), 20)
    assert errors == [None] * 500


async def test_a_record_over_the_local_limit_is_refused_and_the_rest_are_delivered(kafka_bootstrap, target):
    async with librdkafka_publisher(kafka_bootstrap, max_message_bytes=2_000) as small:
        errors = await asyncio.wait_for(await small.send(items(f"chronoq.occurrences.{target}", [10, 5_000, 10])), 20)
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], DeliveryError) and errors[1].permanent and errors[1].name == "MSG_SIZE_TOO_LARGE"


async def test_a_record_the_broker_refuses_fails_alone_among_good_ones(broker, publisher, target):
    """The broker's refusal comes back in a delivery report: it must land on the refused record only
    (here the only record of its topic; the good ones go to another topic in the same call)."""
    if broker.kind == "tansu":
        pytest.skip("tansu enforces no message size (max.message.bytes is accepted and ignored)")
    good, strict_limit = f"chronoq.occurrences.{target}", f"chronoq.occurrences.{target}-small"
    await create_topic_with_limit(broker.bootstrap, strict_limit, 1, TOPIC_LIMIT)
    batch = items(good, [50] * 20) + items(strict_limit, [TOPIC_LIMIT * 2]) + items(good, [50] * 20)
    outcome = await asyncio.wait_for(await publisher.send(batch), 30)
    assert [i for i, e in enumerate(outcome) if e is not None] == [20]
    assert isinstance(outcome[20], DeliveryError) and outcome[20].permanent


async def test_identical_records_share_a_failure_rather_than_hide_it(broker, publisher, target):
    """Two items with the same content cannot be told apart in a report: both take the failure (sent
    again, deduped downstream), never neither."""
    if broker.kind == "tansu":
        pytest.skip("tansu enforces no message size (max.message.bytes is accepted and ignored)")
    topic = f"chronoq.occurrences.{target}"
    await create_topic_with_limit(broker.bootstrap, topic, 1, TOPIC_LIMIT)
    big = (topic, b"same", os.urandom(TOPIC_LIMIT * 2), [("chronoq-occurrence-id", uuid.uuid4().hex.encode())])
    outcome = await asyncio.wait_for(await publisher.send([big, big]), 30)
    assert all(isinstance(e, DeliveryError) for e in outcome)

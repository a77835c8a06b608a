"""A consumer app's topic readers close the Kafka consumer they started when a later step of their start fails.

The broker can go away between a consumer's start and its first seek (a restart, a SIGKILL mid-burst: the
Apache Kafka pipeline test hit it). The app retries the step with a new consumer, so a reader that let the
failed one go unclosed leaked one consumer per retry of the outage (aiokafka warns when it is collected).
Each test lets the real broker start the consumer, then fails the step after it the way a vanished broker
does (a connection error), and checks that every consumer the reader created is closed.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaConnectionError

import consumers.attempt_grants
import consumers.topic_reader
from consumers.attempt_grants import GrantWaiter
from consumers.topic_reader import open_from_beginning
from schemas import observability as obs
from schemas.kafka_security import PLAINTEXT
from schemas.topics import ATTEMPT_GRANTS_TOPIC, create_missing_topics


class _Recorded(AIOKafkaConsumer):
    """The real consumer, remembered so the test can see whether it was closed."""

    made: list[AIOKafkaConsumer] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        _Recorded.made.append(self)


class _SeekFails(_Recorded):
    async def seek_to_end(self, *partitions: object) -> None:
        await asyncio.sleep(0)  # the real step waits on the network before it fails
        raise KafkaConnectionError("broker went away after the start")


@pytest.fixture(autouse=True)
def _fresh_record() -> None:
    _Recorded.made = []


async def test_a_reader_whose_partition_lookup_fails_after_the_start_closes_its_consumer(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def vanished(*args: object) -> list[int]:
        await asyncio.sleep(0)  # the real lookup waits on the network before it fails
        raise KafkaConnectionError("broker went away after the start")

    monkeypatch.setattr(consumers.topic_reader, "AIOKafkaConsumer", _Recorded)
    monkeypatch.setattr(consumers.topic_reader, "topic_partitions", vanished)
    with pytest.raises(KafkaConnectionError):
        await open_from_beginning(kafka_bootstrap, ATTEMPT_GRANTS_TOPIC, 0.0, PLAINTEXT)
    assert len(_Recorded.made) == 1
    assert all(consumer._closed for consumer in _Recorded.made)


async def test_the_grant_reader_whose_seek_fails_after_the_start_closes_its_consumer(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create_missing_topics(kafka_bootstrap, [ATTEMPT_GRANTS_TOPIC], 4)
    monkeypatch.setattr(consumers.attempt_grants, "AIOKafkaConsumer", _SeekFails)
    waiter = GrantWaiter("readers-group", obs.get_meter("consumer"))
    with pytest.raises(KafkaConnectionError):
        await waiter.start(kafka_bootstrap, wait_for_topic=5.0)
    assert len(_Recorded.made) == 1
    assert all(consumer._closed for consumer in _Recorded.made)
    await waiter.stop()  # nothing left to stop: the failed start handed no consumer over

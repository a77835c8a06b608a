"""Waiting for the engine's answer to ``started``: the cancel barrier on the consumer side.

The attempt processor answers every ``started`` it applied, after its transaction committed, on
``chronoq.attempt-grants`` (``schemas/attempt_grants.py``). Every answer for one consumer group is on one
partition (``grant_partition(group, partitions)``), so an instance reads only its own group's answers: it
assigns itself that partition (no consumer group: every instance reads it whole and keeps the answers for
the lease tokens it is waiting on) and seeks to its end at start-up, before it sends its first ``started``
— an answer is always produced after the ``started`` it answers, so none is missed and nothing older is
read.

A runner registers the lease tokens it is about to announce (:meth:`GrantWaiter.expect`) *before* sending
``started``, then awaits them together (:meth:`GrantWaiter.wait`, one wait for a whole batch). A record
that is not a well-formed answer (forged, garbled, another format) is logged and counted
(``chronoq.attempt_grants_malformed``), never raised: the reader keeps going. Only the engine may write
this topic (docs/security.md): a forged ``granted`` would defeat the barrier.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from opentelemetry import metrics

from consumers.topic_reader import keep_reading
from schemas import observability as obs
from schemas.attempt_grants import AttemptGrant, decode_attempt_grants, grant_partition
from schemas.errors import MalformedMessage
from schemas.kafka_security import PLAINTEXT, KafkaSecurity, closed_on_failure, start_client
from schemas.topics import ATTEMPT_GRANTS_TOPIC, topic_partitions

log = logging.getLogger("chronoq.consumer.attempt_grants")


class GrantWaiter:
    """The answers for this group's lease tokens, as they arrive."""

    def __init__(self, consumer_group: str, meter: metrics.Meter) -> None:
        self.consumer_group = consumer_group
        self._waiting: dict[uuid.UUID, _Awaited] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self.malformed = 0
        self._malformed = meter.create_counter(
            obs.ATTEMPT_GRANTS_MALFORMED, unit="1", description="records on chronoq.attempt-grants that are no answer"
        )

    # -- the pure part ------------------------------------------------------------------------

    def expect(self, lease_tokens: Iterable[uuid.UUID]) -> None:
        """Register tokens about to be announced in ``started`` (before sending: the answer may be quick).
        The tokens of one call are awaited together: :meth:`wait` for them as one set."""
        awaited = _Awaited(asyncio.get_running_loop().create_future())
        for token in lease_tokens:
            self._waiting[token] = awaited
            awaited.unanswered += 1
        if not awaited.unanswered:
            awaited.done.set_result(None)

    def forget(self, lease_tokens: Iterable[uuid.UUID]) -> None:
        """Stop waiting for these tokens (answered, timed out or rolled back)."""
        for token in lease_tokens:
            awaited = self._waiting.pop(token, None)
            if awaited is not None and token not in awaited.answers:
                awaited.unanswered -= 1
                if not awaited.unanswered and not awaited.done.done():
                    awaited.done.cancel()

    def receive(self, value: bytes | None, partition: int | None = None, offset: int | None = None) -> None:
        """Take one record of the topic (one answer, or a group of them): an answer for a token this instance
        waits on is kept (the first one for a token), and ends the wait once every token of its
        :meth:`expect` has one; any other answer is ignored; a malformed record is logged and counted."""
        try:
            grants = decode_attempt_grants(value)
        except MalformedMessage as err:
            self.malformed += 1
            self._malformed.add(1)
            log.warning(
                "a record on the attempt-grants topic is not an answer; ignored",
                extra={
                    "action": "attempt.grant_malformed",
                    "partition": partition,
                    "offset": offset,
                    "error": str(err),
                },
            )
            return
        if grants[0].consumer_group != self.consumer_group:
            return  # another group sharing this partition (a record's answers are all for one group)
        waiting = self._waiting
        for grant in grants:
            awaited = waiting.get(grant.lease_token)
            if awaited is None or grant.lease_token in awaited.answers:
                continue
            awaited.answers[grant.lease_token] = grant
            awaited.unanswered -= 1
            if not awaited.unanswered and not awaited.done.done():
                awaited.done.set_result(None)

    async def wait(self, lease_tokens: Iterable[uuid.UUID], timeout: float) -> dict[uuid.UUID, AttemptGrant | None]:
        """The answer for each token, None for those without one within ``timeout`` seconds; the tokens are
        forgotten afterwards. One wait for a whole batch: a future per :meth:`expect`, not per token."""
        tokens = list(lease_tokens)
        awaited = {id(a): a for t in tokens if (a := self._waiting.get(t)) is not None}
        try:
            pending = [a.done for a in awaited.values() if not a.done.done()]
            if pending:
                await asyncio.wait(pending, timeout=timeout)
            return {t: (a.answers.get(t) if (a := self._waiting.get(t)) is not None else None) for t in tokens}
        finally:
            self.forget(tokens)

    # -- reading the topic ------------------------------------------------------------------

    async def start(self, bootstrap: str, security: KafkaSecurity = PLAINTEXT, wait_for_topic: float = 30.0) -> None:
        """Assign this group's partition of the topic at its end (read before any ``started`` is sent)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_for_topic
        partitions = await topic_partitions(bootstrap, ATTEMPT_GRANTS_TOPIC, security)
        while not partitions and loop.time() < deadline:
            await asyncio.sleep(0.05)
            partitions = await topic_partitions(bootstrap, ATTEMPT_GRANTS_TOPIC, security)
        if not partitions:
            raise RuntimeError(
                f"topic {ATTEMPT_GRANTS_TOPIC} does not exist: create it (`chronoq kafka acls --apply` or the engine"
                " does), or turn the barrier off with ConsumerConfig(attempt_barrier=False)"
            )
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            fetch_max_wait_ms=100,
            **security.client_options(),
        )
        await start_client(consumer, bootstrap, security)
        tp = TopicPartition(ATTEMPT_GRANTS_TOPIC, grant_partition(self.consumer_group, len(partitions)))
        async with closed_on_failure(consumer):
            consumer.assign([tp])
            await consumer.seek_to_end(tp)
            await consumer.position(tp)  # resolves the end offset now, before any started is sent
        self._consumer = consumer

    async def follow(self, stop: asyncio.Event | None = None) -> None:
        """Read answers until ``stop`` is set (or the task is cancelled, or :meth:`stop`). The app passes no
        event: deliveries draining at shutdown still wait for their answers."""
        await keep_reading(self._read, lambda: self._consumer is not None, stop, log, "attempt grants")

    async def _read(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        batches = await consumer.getmany(timeout_ms=200)
        for records in batches.values():
            for record in records:
                self.receive(record.value, record.partition, record.offset)

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()


class _Awaited:
    """The answers to one :meth:`GrantWaiter.expect`: ``done`` resolves once every token has one."""

    __slots__ = ("answers", "done", "unanswered")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.answers: dict[uuid.UUID, AttemptGrant] = {}
        self.done = done
        self.unanswered = 0

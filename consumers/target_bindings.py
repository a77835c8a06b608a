"""The runtime's view of target bindings: whose occurrences a target may run.

The engine registers every target to the tenant that first schedules onto it
(or that an operator registered it to, plus the tenants granted it) and
announces each change on the compacted topic ``chronoq.target-bindings``
(``schemas/target_bindings.py``). This view reads the topic from the
beginning, without a consumer group, keeps the highest version per target and
answers one question, checked on every occurrence record: may this tenant's
occurrence run on this target?

* the tenant is bound to the target → yes;
* the target has a binding without this tenant → no (the record is
  dead-lettered). Before saying no, the view reads the topic up to its
  current end: a grant committed before the occurrence may still be on its
  way. One read to the end that began well after the record was appended
  (``FRESHNESS_MARGIN_MS``) answers for every such record, so a backlog of
  refused records costs one read, not one per record;
* the target has no binding at all → yes, at once: nothing chronoq 0006+
  schedules reaches Kafka before its target is registered to the tenant
  that scheduled it, so a binding not read yet names this tenant (or the
  record bypassed the engine, which in production the Kafka ACLs prevent).
  Reading to the end here cost a broker round trip per occurrence of an
  unbound target (~30 occurrences/s measured) and could only turn yes into
  no for records the engine never wrote. An app that must never run another
  tenant's work names its tenants in ``ConsumerConfig.tenants`` as well.

Memory: one small entry per target.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.topic_reader import keep_reading, open_from_beginning
from schemas.errors import MalformedMessage
from schemas.kafka_security import PLAINTEXT, KafkaSecurity
from schemas.target_bindings import TargetBindingMessage, decode_target_binding
from schemas.topics import TARGET_BINDINGS_TOPIC

log = logging.getLogger("chronoq.consumer.target_bindings")

# A read to the topic's end that began this long after a record was appended
# has seen every binding the relay published up to then, allowing for clock
# skew between the producer (or broker) stamping the record and this process.
FRESHNESS_MARGIN_MS = 2_000


def needs_catch_up(
    verdict: bool | None, appended_at_ms: int | None, fresh_as_of_ms: int | None, margin_ms: int = FRESHNESS_MARGIN_MS
) -> bool:
    """Whether a verdict must be re-checked after reading the topic to its end.

    Only a "no" is re-checked, and only when no read to the end began at least
    ``margin_ms`` after the record was appended (an unknown append time always
    re-checks).
    """
    if verdict is not False:
        return False
    if appended_at_ms is None or fresh_as_of_ms is None:
        return True
    return fresh_as_of_ms < appended_at_ms + margin_ms


class TargetBindingView:
    def __init__(self, freshness_margin_ms: int = FRESHNESS_MARGIN_MS) -> None:
        self._margin_ms = freshness_margin_ms
        self._bindings: dict[str, TargetBindingMessage] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: list[TopicPartition] = []
        self._progress = asyncio.Condition()
        self._fresh_as_of_ms: int | None = None  # wall-clock ms at which the last complete read to the end began
        self._catching_up: asyncio.Task[bool] | None = None
        self.poison = 0
        self.catch_ups = 0  # reads to the end that allows() started (a refused record's re-check)
        self.reads = 0  # fetches from the topic (each one wakes whoever waits for a version)

    # -- the pure part ------------------------------------------------------------------------

    def apply(self, message: TargetBindingMessage) -> None:
        """Remember a binding if it is the newest version seen for its target."""
        known = self._bindings.get(message.target)
        if known is None or known.version <= message.version:
            self._bindings[message.target] = message

    def verdict(self, target: str, tenant_id: str) -> bool | None:
        """True: bound; False: the target is bound to other tenants only; None: the target has no binding."""
        binding = self._bindings.get(target)
        if binding is None:
            return None
        return tenant_id in binding.tenants

    async def allows(self, target: str, tenant_id: str, wait: float, appended_at_ms: int | None = None) -> bool:
        """Whether ``tenant_id``'s occurrence may run on ``target``.

        A "no" is given only after the topic was read to an end that began after
        the record (appended at ``appended_at_ms``, the record's timestamp) was
        appended plus a margin, waiting at most ``wait`` seconds for that read.
        Concurrent re-checks share one read.
        """
        verdict = self.verdict(target, tenant_id)
        if not needs_catch_up(verdict, appended_at_ms, self._fresh_as_of_ms, self._margin_ms):
            return verdict is not False
        if self._catching_up is None or self._catching_up.done():
            self.catch_ups += 1
            self._catching_up = asyncio.create_task(self.catch_up(wait))
        try:
            await asyncio.wait_for(asyncio.shield(self._catching_up), wait)
        except TimeoutError:
            pass
        return self.verdict(target, tenant_id) is not False

    def __len__(self) -> int:
        return len(self._bindings)

    # -- reading the topic ------------------------------------------------------------------

    async def start(self, bootstrap: str, catch_up_timeout: float, security: KafkaSecurity = PLAINTEXT) -> None:
        """Assign every partition from the beginning and read up to the end offsets seen now."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + catch_up_timeout
        self._consumer, self._assigned = await open_from_beginning(bootstrap, TARGET_BINDINGS_TOPIC, deadline, security)
        if not self._assigned:
            log.warning(
                "target-binding topic not found; every target counts as unbound until it appears",
                extra={"action": "consumer.bindings_missing"},
            )
            return
        reader = asyncio.create_task(self.follow(asyncio.Event()))
        try:
            if not await self.catch_up(max(deadline - loop.time(), 0.0)):
                log.warning(
                    "target-binding topic not read to its end in time; starting anyway",
                    extra={"action": "consumer.bindings_behind", "known": len(self)},
                )
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def catch_up(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until everything on the topic now has been read; False if not in time.

        Needs the reader (``follow``) running; only it fetches.
        """
        consumer = self._consumer
        if consumer is None or not self._assigned:
            return True
        began_ms = int(time.time() * 1000)
        end = await consumer.end_offsets(self._assigned)

        async def reached() -> bool:
            for tp in self._assigned:
                if await consumer.position(tp) < end[tp]:
                    return False
            return True

        try:
            async with asyncio.timeout(timeout):
                while not await reached():
                    async with self._progress:
                        await self._progress.wait()
        except TimeoutError:
            return False
        if self._fresh_as_of_ms is None or began_ms > self._fresh_as_of_ms:
            self._fresh_as_of_ms = began_ms
        return True

    async def _read(self, timeout_ms: int) -> None:
        assert self._consumer is not None
        batches = await self._consumer.getmany(timeout_ms=timeout_ms)
        for records in batches.values():
            for record in records:
                try:
                    self.apply(decode_target_binding(record.value))
                except MalformedMessage as err:
                    self.poison += 1
                    log.error(
                        "undecodable target binding ignored",
                        extra={
                            "action": "consumer.binding_poison",
                            "offset": record.offset,
                            "partition": record.partition,
                            "error": str(err),
                        },
                    )
        self.reads += 1
        async with self._progress:
            self._progress.notify_all()

    async def follow(self, stop: asyncio.Event) -> None:
        """Keep reading new bindings until ``stop`` is set (a failed read is logged and retried)."""
        await keep_reading(
            lambda: self._read(100), lambda: self._consumer is not None and bool(self._assigned), stop, log, "bindings"
        )

    async def stop(self) -> None:
        if self._catching_up is not None:
            self._catching_up.cancel()
            await asyncio.gather(self._catching_up, return_exceptions=True)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

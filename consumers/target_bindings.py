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

Records of engines that stamp each occurrence with the target's binding version
(``binding_version``, ``schemas/messages.py``) are judged against it instead of
against the freshness of the last read (:func:`admission_of`):

* the view has that version (or a newer one) and the tenant is not in it → no,
  at once, without reading the topic: the tenant was bound at that version and
  a later change took it out;
* the view is older than that version → *behind*: the binding the engine wrote
  before the occurrence is not on the topic yet (a relay killed right after
  claiming its row strands it until the claim expires). The app reads the topic
  to its end and, if still behind, parks the record (``consumers/app.py``):
  never dead-lettered for it until ``binding_behind_timeout``.

Memory: one small entry per target.
"""

from __future__ import annotations

import asyncio
import enum
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


class Admission(enum.Enum):
    ALLOWED = "allowed"  # the tenant is bound (or the target has no binding at all)
    REFUSED = "refused"  # the view has the record's version or a newer one, without the tenant
    BEHIND = "behind"  # the view is older than the record's binding version and lacks the tenant


def admission_of(binding: TargetBindingMessage | None, tenant_id: str, binding_version: int | None) -> Admission | None:
    """The verdict on an occurrence dispatched under ``binding_version``, from the view's binding of its
    target alone; None when only a read to the topic's end can say (a record without a binding version,
    of a tenant the view does not bind: today's freshness rule, :func:`needs_catch_up`)."""
    if binding is None or tenant_id in binding.tenants:
        return Admission.ALLOWED
    if binding_version is None:
        return None
    return Admission.REFUSED if binding.version >= binding_version else Admission.BEHIND


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
        await self._shared_catch_up(wait)
        return self.verdict(target, tenant_id) is not False

    async def admit(
        self, target: str, tenant_id: str, binding_version: int | None, wait: float, appended_at_ms: int | None = None
    ) -> Admission:
        """The verdict on ``tenant_id``'s occurrence dispatched under ``binding_version`` (None: an older
        engine's record, judged by :meth:`allows`). A view behind the version reads the topic to its end
        first (at most ``wait`` seconds, shared with concurrent re-checks) and may still be BEHIND."""
        decided = admission_of(self._bindings.get(target), tenant_id, binding_version)
        if decided is None:
            allowed = await self.allows(target, tenant_id, wait, appended_at_ms)
            return Admission.ALLOWED if allowed else Admission.REFUSED
        if decided is not Admission.BEHIND:
            return decided
        await self._shared_catch_up(wait)
        return admission_of(self._bindings.get(target), tenant_id, binding_version) or Admission.BEHIND

    async def until_decided(self, target: str, tenant_id: str, binding_version: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until the view is no longer behind ``binding_version`` for this
        tenant's record (its binding arrived, or one that binds the tenant); False if it still is."""

        def behind() -> bool:
            return admission_of(self._bindings.get(target), tenant_id, binding_version) is Admission.BEHIND

        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                while behind():
                    async with self._progress:
                        await self._progress.wait()
        except TimeoutError:
            return not behind()
        return True

    def version_of(self, target: str) -> int | None:
        """The newest binding version of ``target`` this view has read (None: none yet)."""
        binding = self._bindings.get(target)
        return binding.version if binding is not None else None

    async def _shared_catch_up(self, wait: float) -> None:
        """Read the topic to its end, waiting at most ``wait`` s; concurrent re-checks share one read."""
        if self._catching_up is None or self._catching_up.done():
            self.catch_ups += 1
            self._catching_up = asyncio.create_task(self.catch_up(wait))
        try:
            async with asyncio.timeout(wait):  # not wait_for: it can swallow a cancellation (Python 3.11)
                await asyncio.shield(self._catching_up)
        except TimeoutError:
            pass

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

"""The runtime's view of schedule versions: which deliveries are obsolete.

The engine announces every schedule change (create, update, pause, resume,
cancel — each bumps the version) on the compacted topic
``chronoq.schedule-states``, keyed by schedule_id. The view reads it from the
beginning, without a consumer group (every process needs every schedule),
keeps the latest version and state per schedule, and answers one question:
may an occurrence of (schedule, version) still run?

* an older version than the latest known → skip, ``stale_version``
  (an update or pause invalidated it);
* a canceled schedule → skip, ``schedule_canceled``;
* otherwise (including a schedule it has never heard of) → run.

At start-up the app reads the topic up to its end offsets before handling
occurrences, so a restarted consumer does not run what it skipped before.
While a handler runs, a ``canceled`` state for its schedule sets the
occurrence's cooperative cancellation signal.

Memory: about 150 bytes per schedule that ever changed; fine for millions,
not for tens of millions in one process.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from aiokafka import AIOKafkaConsumer

from consumers.occurrence import Cancellation
from consumers.topic_reader import keep_reading, open_from_beginning
from schemas.kafka_security import PLAINTEXT, KafkaSecurity
from schemas.messages import MalformedMessage, ScheduleStateMessage, decode_schedule_state
from schemas.topics import SCHEDULE_STATES_TOPIC

log = logging.getLogger("chronoq.consumer.schedule_states")

STALE_VERSION = "stale_version"
SCHEDULE_CANCELED = "schedule_canceled"


class ScheduleStateView:
    def __init__(self) -> None:
        self._latest: dict[uuid.UUID, tuple[int, str]] = {}
        self._watchers: dict[uuid.UUID, set[Cancellation]] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self.caught_up = asyncio.Event()

    # -- the pure part ------------------------------------------------------------------------

    def apply(self, message: ScheduleStateMessage) -> None:
        """Remember a state message if it is the newest version seen for its schedule."""
        known = self._latest.get(message.schedule_id)
        if known is not None and known[0] > message.version:
            return
        self._latest[message.schedule_id] = (message.version, message.state)
        if message.state == "canceled":
            for cancellation in self._watchers.get(message.schedule_id, ()):
                cancellation.cancel(SCHEDULE_CANCELED)

    def verdict(self, schedule_id: uuid.UUID, version: int) -> str | None:
        """None if an occurrence of this version may run, else why it must be skipped."""
        known = self._latest.get(schedule_id)
        if known is None:
            return None
        latest_version, state = known
        if state == "canceled":
            return SCHEDULE_CANCELED
        if version < latest_version:
            return STALE_VERSION
        return None

    @contextmanager
    def watch(self, schedule_id: uuid.UUID, cancellation: Cancellation) -> Iterator[None]:
        """Set ``cancellation`` if the schedule is canceled while the block runs."""
        watchers = self._watchers.setdefault(schedule_id, set())
        watchers.add(cancellation)
        try:
            if self.verdict(schedule_id, 0) == SCHEDULE_CANCELED:
                cancellation.cancel(SCHEDULE_CANCELED)
            yield
        finally:
            watchers.discard(cancellation)
            if not watchers:
                self._watchers.pop(schedule_id, None)

    @contextmanager
    def watch_many(self, watched: list[tuple[uuid.UUID, Cancellation]]) -> Iterator[None]:
        """:meth:`watch` for a whole batch at once (one context, not one per occurrence)."""
        for schedule_id, cancellation in watched:
            self._watchers.setdefault(schedule_id, set()).add(cancellation)
            if self.verdict(schedule_id, 0) == SCHEDULE_CANCELED:
                cancellation.cancel(SCHEDULE_CANCELED)
        try:
            yield
        finally:
            for schedule_id, cancellation in watched:
                watchers = self._watchers.get(schedule_id)
                if watchers is not None:
                    watchers.discard(cancellation)
                    if not watchers:
                        del self._watchers[schedule_id]

    def __len__(self) -> int:
        return len(self._latest)

    # -- reading the topic ------------------------------------------------------------------

    async def start(self, bootstrap: str, catch_up_timeout: float, security: KafkaSecurity = PLAINTEXT) -> None:
        """Assign every partition from the beginning and read up to the end offsets seen now."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + catch_up_timeout
        consumer, assigned = await open_from_beginning(bootstrap, SCHEDULE_STATES_TOPIC, deadline, security)
        self._consumer = consumer
        if not assigned:
            log.warning(
                "schedule-state topic not found; skipping no occurrence as obsolete until it appears",
                extra={"action": "consumer.states_missing"},
            )
            self.caught_up.set()
            return
        end = await consumer.end_offsets(assigned)
        while loop.time() < deadline:
            positions = {tp: await consumer.position(tp) for tp in assigned}
            if all(positions[tp] >= end[tp] for tp in assigned):
                break
            await self._read(200)
        else:
            log.warning(
                "schedule-state topic not read to its end in time; starting anyway",
                extra={"action": "consumer.states_behind", "known": len(self)},
            )
        self.caught_up.set()

    async def _read(self, timeout_ms: int) -> None:
        assert self._consumer is not None
        batches = await self._consumer.getmany(timeout_ms=timeout_ms)
        for records in batches.values():
            for record in records:
                try:
                    self.apply(decode_schedule_state(record.value))
                except MalformedMessage as err:
                    log.error(
                        "undecodable schedule state message ignored",
                        extra={
                            "action": "consumer.state_poison",
                            "offset": record.offset,
                            "partition": record.partition,
                            "error": str(err),
                        },
                    )

    async def follow(self, stop: asyncio.Event) -> None:
        """Keep reading new state messages until ``stop`` is set (a failed read is logged and retried)."""
        await keep_reading(lambda: self._read(200), lambda: self._consumer is not None, stop, log, "schedule states")

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

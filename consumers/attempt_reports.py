"""Sending attempt events to the engine (topic ``chronoq.attempts``, keyed by occurrence_id).

Every send waits for the broker's acknowledgement (acks=all): the runtime
moves on only once the engine is certain to see the event. A broker that does
not answer within ``report_timeout`` is an infrastructure error.

An event about an occurrence of a target the app holds an attempt credential
for is signed with it (headers ``chronoq-credential`` and
``chronoq-attempt-signature`` over the exact key and value,
``schemas/attempt_credentials.py``); the engine applies nothing else for a
target that has a credential. Both ways of sending sign the same way.

:meth:`AttemptReporter.send_many` reports a batch handler's events (and a
heartbeat round's) as group records (``schemas/attempt_events.py``, format 2):
per partition records of up to 500 events and 256 KiB each, signed once;
with ``grouped=False`` one record per event, in one Kafka batch per partition.
It picks each event's partition exactly as the keyed single send does (the Java
client's murmur2 of the event's key), so every event of one occurrence still
lands on one partition, in the order it was produced, whichever way it was sent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping, Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from consumers.errors import InfrastructureError
from schemas.attempt_credentials import AttemptCredential
from schemas.attempt_events import AttemptEvent, encode_groups
from schemas.key_partitioning import key_partition
from schemas.messages import Record
from schemas.produce_batches import send_in_batches, send_shared
from schemas.topics import ATTEMPTS_TOPIC

#: Occurrences whose partition is remembered (the started, heartbeat and outcome events of one delivery
#: share it; murmur2 in Python costs about as much as encoding the event).
_PARTITION_MEMORY = 100_000


class AttemptReporter:
    def __init__(
        self,
        producer: AIOKafkaProducer,
        timeout: float,
        enabled: bool = True,
        credentials: Mapping[str, AttemptCredential] | None = None,
        grouped: bool = True,
    ) -> None:
        self.producer = producer
        self.grouped = grouped
        self.timeout = timeout
        self.enabled = enabled
        self.credentials = dict(credentials or {})
        self.sent = 0
        self._partitions: list[int] = []
        self._partition_of: dict[uuid.UUID, int] = {}

    async def send(self, event: AttemptEvent, target: str) -> None:
        """Publish one event about an occurrence of ``target`` (signed if the app holds the target's
        credential) and wait for the acknowledgement; InfrastructureError if the broker fails."""
        if not self.enabled:
            return
        key, value, headers = self._record(event, self.credentials.get(target))
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that arrives as the
            # acknowledgement does, and a heartbeat loop cancelled then would never end (consumers/attempt_leases.py).
            async with asyncio.timeout(self.timeout):
                await self.producer.send_and_wait(ATTEMPTS_TOPIC, value, key=key, headers=headers)
        except (TimeoutError, KafkaError) as err:
            raise InfrastructureError(f"could not report {event.event} for {event.occurrence_id}: {err!r}") from err
        self.sent += 1

    async def send_many(self, events: Sequence[AttemptEvent], target: str) -> None:
        """Publish events about occurrences of ``target`` (signed if the app holds the target's credential),
        as group records per partition (or one record each, ``grouped=False``), and wait for every
        acknowledgement.

        InfrastructureError if any is not acknowledged within ``report_timeout``: some may have been
        delivered, so a retry sends duplicates, which the engine recognises as such.
        """
        if not self.enabled or not events:
            return
        try:
            async with asyncio.timeout(self.timeout):  # not wait_for: see send
                await self._send_batches(events, self.credentials.get(target))
        except (TimeoutError, KafkaError) as err:
            raise InfrastructureError(f"could not report {len(events)} attempt events: {err!r}") from err
        self.sent += len(events)

    async def _send_batches(self, events: Sequence[AttemptEvent], credential: AttemptCredential | None) -> None:
        partitions = sorted(await self.producer.partitions_for(ATTEMPTS_TOPIC))
        if partitions != self._partitions:
            self._partitions, self._partition_of = partitions, {}
        groups: dict[int, list[AttemptEvent]] = {}
        for event in events:
            groups.setdefault(self._partition(event), []).append(event)
        acknowledgements = []
        for partition, group in groups.items():
            if self.grouped:
                records = self._group_records(group, credential)
                acknowledgements += await send_shared(self.producer, ATTEMPTS_TOPIC, partition, records)
            else:
                records = self._records(group, credential)
                acknowledgements += await send_in_batches(self.producer, ATTEMPTS_TOPIC, partition, records)
        await asyncio.gather(*acknowledgements)

    @classmethod
    def _records(cls, events: Sequence[AttemptEvent], credential: AttemptCredential | None) -> Iterator[Record]:
        return (cls._record(event, credential) for event in events)

    @staticmethod
    def _group_records(events: Sequence[AttemptEvent], credential: AttemptCredential | None) -> Iterator[Record]:
        """Group records (``encode_groups``: bounded in events and bytes), in order, each signed over its key
        and value."""
        for key, value, headers in encode_groups(events):
            if credential is not None:
                headers.extend(credential.sign(key, value))
            yield key, value, headers

    @staticmethod
    def _record(event: AttemptEvent, credential: AttemptCredential | None) -> Record:
        """The event's key, value and headers, with the credential's signature over that key and value."""
        key, value, headers = event.key, event.encode(), list(event.headers())
        if credential is not None:
            headers.extend(credential.sign(key, value))
        return key, value, headers

    def _partition(self, event: AttemptEvent) -> int:
        partition = self._partition_of.get(event.occurrence_id)
        if partition is None:
            if len(self._partition_of) >= _PARTITION_MEMORY:
                self._partition_of.clear()
            partition = key_partition(event.key, self._partitions)
            self._partition_of[event.occurrence_id] = partition
        return partition

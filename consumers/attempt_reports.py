"""Sending attempt events to the engine (topic ``chronoq.attempts``, keyed by occurrence_id).

Every send waits for the broker's acknowledgement (acks=all): the runtime
moves on only once the engine is certain to see the event. A broker that does
not answer within ``report_timeout`` is an infrastructure error.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from consumers.errors import InfrastructureError
from schemas.attempt_events import AttemptEvent
from schemas.topics import ATTEMPTS_TOPIC


class AttemptReporter:
    def __init__(self, producer: AIOKafkaProducer, timeout: float, enabled: bool = True) -> None:
        self.producer = producer
        self.timeout = timeout
        self.enabled = enabled
        self.sent = 0

    async def send(self, event: AttemptEvent) -> None:
        """Publish one event and wait for the acknowledgement; InfrastructureError if the broker fails."""
        if not self.enabled:
            return
        try:
            await asyncio.wait_for(
                self.producer.send_and_wait(ATTEMPTS_TOPIC, event.encode(), key=event.key, headers=event.headers()),
                self.timeout,
            )
        except (TimeoutError, KafkaError) as err:
            raise InfrastructureError(f"could not report {event.event} for {event.occurrence_id}: {err!r}") from err
        self.sent += 1

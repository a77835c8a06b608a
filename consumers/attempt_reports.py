"""Sending attempt events to the engine (topic ``chronoq.attempts``, keyed by occurrence_id).

Every send waits for the broker's acknowledgement (acks=all): the runtime
moves on only once the engine is certain to see the event. A broker that does
not answer within ``report_timeout`` is an infrastructure error.

An event about an occurrence of a target the app holds an attempt credential
for is signed with it (headers ``chronoq-credential`` and
``chronoq-attempt-signature`` over the exact key and value,
``schemas/attempt_credentials.py``); the engine applies nothing else for a
target that has a credential.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from consumers.errors import InfrastructureError
from schemas.attempt_credentials import AttemptCredential
from schemas.attempt_events import AttemptEvent
from schemas.topics import ATTEMPTS_TOPIC


class AttemptReporter:
    def __init__(
        self,
        producer: AIOKafkaProducer,
        timeout: float,
        enabled: bool = True,
        credentials: Mapping[str, AttemptCredential] | None = None,
    ) -> None:
        self.producer = producer
        self.timeout = timeout
        self.enabled = enabled
        self.credentials = dict(credentials or {})
        self.sent = 0

    async def send(self, event: AttemptEvent, target: str) -> None:
        """Publish one event about an occurrence of ``target`` (signed if the app holds the target's
        credential) and wait for the acknowledgement; InfrastructureError if the broker fails."""
        if not self.enabled:
            return
        key, value, headers = event.key, event.encode(), event.headers()
        credential = self.credentials.get(target)
        if credential is not None:
            headers = [*headers, *credential.sign(key, value)]
        try:
            await asyncio.wait_for(
                self.producer.send_and_wait(ATTEMPTS_TOPIC, value, key=key, headers=headers), self.timeout
            )
        except (TimeoutError, KafkaError) as err:
            raise InfrastructureError(f"could not report {event.event} for {event.occurrence_id}: {err!r}") from err
        self.sent += 1

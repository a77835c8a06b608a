"""An attempt's lease, held from its ``started`` to its commit: ``LocalLease`` and ``LeaseKeeper``.

The engine starts a lease when it applies ``started`` (its clock plus the lease ttl) and ends it a ttl after
the last heartbeat it applied, judging by every event produced before then (docs/consumer-runtime.md, "The
reaper judges leases by what the engine has read"). So a worker renews from the moment it sends ``started``,
not from the moment its handler runs: the engine's answer to ``started`` (the cancel barrier) can come late
— an attempt processor far behind in a burst, a grant reader starved of CPU — and a worker that first
heartbeats in its handler can find the engine's lease already over. The reaper then times out a healthy
attempt and a retry runs the delivery again (the dedupe row keeps the effect single, but the work, the
attempt and a second round of events are spent).

The worker's own view of the lease (``LocalLease``) counts from just before ``started`` was sent: the engine
cannot have started it earlier, so the worker never acts on a lease the engine may already have ended. A lease
lost that way (the process was paused or starved, or the broker took no heartbeat for a ttl) is not renewed
again, and the runners do not call a handler under it.

Heartbeats stop before the attempt's outcome is reported (a heartbeat already handed to the producer goes out
ahead of it), so an outcome is never followed by a heartbeat of its own lease on the partition. A lease the
runner releases mid-batch (refused, obsolete) may still be named by a heartbeat being sent at that moment;
the engine fences it, changing nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from consumers.attempt_reports import AttemptReporter
from consumers.errors import InfrastructureError
from schemas.attempt_events import AttemptEvent
from schemas.messages import OccurrenceMessage

log = logging.getLogger("chronoq.consumer")


class LocalLease:
    """This worker's own view of its lease: renewed by acknowledged heartbeats, lost once overdue.

    Monotonic time keeps running while a process is stopped (SIGSTOP), so a
    worker that wakes up past its lease knows it lost it.
    """

    def __init__(self, ttl: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.monotonic = monotonic
        self.renewed_at = monotonic()
        self.lost = False

    def renewed(self, at: float) -> None:
        if not self.lost:
            self.renewed_at = at

    def check(self) -> bool:
        if not self.lost and self.monotonic() - self.renewed_at > self.ttl:
            self.lost = True
        return not self.lost


@dataclass(frozen=True)
class HeldLease:
    """What a heartbeat names: one occurrence's delivery and the lease token its ``started`` carried."""

    occurrence_id: uuid.UUID
    attempt: int
    lease_token: uuid.UUID
    scheduled_for: datetime | None

    @classmethod
    def of(cls, message: OccurrenceMessage, lease_token: uuid.UUID) -> HeldLease:
        return cls(message.occurrence_id, message.attempt, lease_token, message.scheduled_for)


class LeaseKeeper:
    """Renews the leases of one attempt (or one batch's attempts) every ``renew_interval`` from ``start`` to
    ``stop``, one Kafka batch per renewal.

    Create it right before sending ``started`` (its ``lease`` counts from then), ``start`` it with the first
    try to send ``started`` (the broker may write a record it does not acknowledge in time, and the engine
    then starts the lease), ``release`` the leases the engine refused or the runner dropped, and ``stop`` it
    before reporting any outcome. A heartbeat that reaches the engine before its ``started`` is fenced and
    changes nothing; the lease it would have renewed begins later than the worker's own view of it.
    ``on_lost`` is called once, with the number of leases held, when the lease is first found overdue
    (``alive``)."""

    def __init__(
        self,
        reporter: AttemptReporter,
        target: str,
        ttl: float,
        renew_interval: float,
        leases: Iterable[HeldLease],
        on_lost: Callable[[int], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease = LocalLease(ttl, monotonic)
        self.reporter = reporter
        self.target = target
        self.renew_interval = renew_interval
        self._held = {held.lease_token: held for held in leases}
        self._task: asyncio.Task[None] | None = None
        self._on_lost = on_lost
        self._reported_lost = False
        self._stopped = False

    def start(self) -> None:
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self._renew(), name="attempt-lease-heartbeats")

    def release(self, tokens: Iterable[uuid.UUID]) -> None:
        """No longer renew these leases (refused by the engine, or dropped from the batch)."""
        for token in tokens:
            self._held.pop(token, None)

    async def stop(self) -> None:
        """Stop renewing. A heartbeat already handed to the producer still goes out, ahead of anything sent
        on its partition after this returns (the outcome). Idempotent.

        Returns even if the cancellation is lost (Python 3.11's ``asyncio.wait_for`` swallows one that arrives
        as its awaitable completes): the loop also stops at the flag. Before the flag, a 500,000 burst had a
        batch wait here for ever after its commit, its heartbeats going on and its outcome never reported."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def alive(self) -> bool:
        """Whether the lease is still this worker's by its own clock; the first time it is not, says so (log,
        ``on_lost``) and stops renewing for good."""
        if self.lease.check():
            return True
        if not self._reported_lost:
            self._reported_lost = True
            log.warning(
                "lease overdue (the process was paused or starved, or no heartbeat was acknowledged for a lease"
                " ttl); no longer renewing it",
                extra={"action": "attempt.lease_lost", "occurrences": len(self._held)},
            )
            if self._on_lost is not None:
                self._on_lost(len(self._held))
        return False

    async def _renew(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.renew_interval)
            if self._stopped or not self.alive():
                return
            if not self._held:
                continue
            sent_at = self.lease.monotonic()
            try:
                await self.reporter.send_many(
                    [
                        AttemptEvent.heartbeat(
                            h.occurrence_id, h.attempt, h.lease_token, self.lease.ttl, h.scheduled_for
                        )
                        for h in self._held.values()
                    ],
                    self.target,
                )
            except InfrastructureError as err:
                log.warning("heartbeat not delivered", extra={"action": "attempt.heartbeat_failed", "error": str(err)})
                continue
            self.lease.renewed(sent_at)

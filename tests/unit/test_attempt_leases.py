"""The lease keeper's guarantees (consumers/attempt_leases.py), without a broker: the heartbeats' sender is a
stand-in whose acknowledgements the test releases, so the instants that matter can be produced exactly."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from consumers.attempt_leases import HeldLease, LeaseKeeper
from consumers.attempt_reports import AttemptReporter
from schemas.attempt_events import HEARTBEAT, AttemptEvent


class Acknowledgements:
    """Sends nothing; each ``send_many`` waits, bounded like the real reporter, until the test acknowledges."""

    def __init__(self) -> None:
        self.sent: list[list[AttemptEvent]] = []
        self.pending: asyncio.Future[None] | None = None
        self.entered = asyncio.Event()

    async def send_many(self, events: Sequence[AttemptEvent], target: str) -> None:
        self.sent.append(list(events))
        self.pending = asyncio.get_running_loop().create_future()
        self.entered.set()
        # wait_for as a sender might use it: on Python 3.11 it swallows a cancellation that arrives as the
        # awaited future completes.
        await asyncio.wait_for(self.pending, 10)


def keeper_for(acks: Acknowledgements, leases: int = 2, ttl: float = 30.0, renew: float = 0.01) -> LeaseKeeper:
    held = [HeldLease(uuid.uuid4(), 1, uuid.uuid4(), datetime(2027, 1, 4, 9, tzinfo=UTC)) for _ in range(leases)]
    return LeaseKeeper(cast(AttemptReporter, acks), "t", ttl, renew, held)


async def test_stop_returns_even_when_the_acknowledgement_and_the_cancellation_arrive_together() -> None:
    acks = Acknowledgements()
    keeper = keeper_for(acks)
    keeper.start()
    await acks.entered.wait()
    assert acks.pending is not None
    acks.pending.set_result(None)  # the acknowledgement lands ...
    async with asyncio.timeout(5):  # ... in the same iteration as the cancellation: stop must still return
        await keeper.stop()
    count = len(acks.sent)
    await asyncio.sleep(0.05)
    assert len(acks.sent) == count  # and nothing is sent after stop


async def test_every_held_lease_is_renewed_in_one_send_and_released_leases_are_not() -> None:
    acks = Acknowledgements()
    keeper = keeper_for(acks, leases=3)
    released = next(iter(cast(dict[uuid.UUID, Any], keeper._held)))
    keeper.release([released])
    keeper.start()
    await acks.entered.wait()
    (batch,) = acks.sent
    assert [e.event for e in batch] == [HEARTBEAT, HEARTBEAT]
    assert released not in {e.lease_token for e in batch}
    assert all(e.lease_ttl == 30.0 for e in batch)
    await keeper.stop()


async def test_a_lease_without_an_acknowledged_renewal_for_a_ttl_is_lost_once_and_counted_from_creation() -> None:
    """The worker's own view counts from the keeper's creation (just before `started` is sent), not from the
    first renewal: the engine's lease cannot have begun earlier."""
    acks, now = Acknowledgements(), [100.0]
    lost: list[int] = []
    held = [HeldLease(uuid.uuid4(), 1, uuid.uuid4(), None)]
    keeper = LeaseKeeper(
        cast(AttemptReporter, acks), "t", 30.0, 0.01, held, on_lost=lost.append, monotonic=lambda: now[0]
    )
    keeper.start()
    await acks.entered.wait()  # the first renewal is never acknowledged
    now[0] += 30.0
    assert keeper.alive() and lost == []  # exactly a ttl: still held
    now[0] += 0.5
    assert not keeper.alive() and lost == [1]
    assert not keeper.alive() and lost == [1]  # said once
    await keeper.stop()


async def test_a_stopped_keeper_does_not_start_again() -> None:
    acks = Acknowledgements()
    keeper = keeper_for(acks)
    await keeper.stop()
    keeper.start()
    await asyncio.sleep(0.05)
    assert acks.sent == []

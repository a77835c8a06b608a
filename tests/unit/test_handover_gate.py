"""The ahead relay's hand-over gate (relay/handover_gate.py): at most N holders; a free slot goes to the waiting
holder of the lowest rank (strict before flexible), first come first served within a rank; a holder cancelled
while waiting holds nothing, and every slot comes back."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.handover_gate import HandoverGate


async def _asking(gate: HandoverGate, rank: int, granted: list[int], name: int) -> asyncio.Task[None]:
    async def ask() -> None:
        await gate.acquire(rank)
        granted.append(name)

    task = asyncio.create_task(ask())
    await asyncio.sleep(0)  # it is in line now
    return task


async def test_a_free_slot_goes_to_the_lowest_rank_waiting_then_in_order_of_asking() -> None:
    gate = HandoverGate(1, ranks=2)
    await gate.acquire(1)
    granted: list[int] = []
    tasks = [
        await _asking(gate, 1, granted, 1),  # a flexible hand-over asked first
        await _asking(gate, 1, granted, 2),
        await _asking(gate, 0, granted, 3),  # a strict one asked after both
        await _asking(gate, 0, granted, 4),
    ]
    assert gate.waiting == 4 and gate.free == 0
    for expected in ([3], [3, 4], [3, 4, 1], [3, 4, 1, 2]):
        gate.release()
        await asyncio.sleep(0)
        assert granted == expected
    await asyncio.gather(*tasks)
    gate.release()
    assert gate.free == 1 and gate.waiting == 0


async def test_a_holder_cancelled_while_waiting_holds_nothing_and_the_next_is_served() -> None:
    gate = HandoverGate(1, ranks=2)
    await gate.acquire(0)
    granted: list[int] = []
    cancelled = await _asking(gate, 0, granted, 1)
    served = await _asking(gate, 1, granted, 2)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert gate.waiting == 1
    gate.release()
    await served
    assert granted == [2]
    gate.release()
    assert gate.free == 1


async def test_a_slot_granted_to_a_holder_cancelled_at_that_moment_is_passed_on() -> None:
    gate = HandoverGate(1)
    await gate.acquire(0)
    granted: list[int] = []
    first = await _asking(gate, 0, granted, 1)
    second = await _asking(gate, 0, granted, 2)
    gate.release()  # granted to the first ...
    first.cancel()  # ... which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert granted == [2]
    gate.release()
    assert gate.free == 1 and gate.waiting == 0


def test_a_gate_needs_a_slot_and_a_rank() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        HandoverGate(0)
    with pytest.raises(ValueError, match="at least one rank"):
        HandoverGate(1, ranks=0)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 3),
    st.lists(
        st.tuples(st.sampled_from(["ask", "release", "cancel"]), st.integers(0, 1), st.integers(0, 20)), max_size=40
    ),
)
def test_never_more_holders_than_slots_lowest_rank_first_and_every_slot_comes_back(
    slots: int, steps: list[tuple[str, int, int]]
) -> None:
    """Any interleaving of asking (at rank 0 or 1), releasing a held slot and cancelling a waiting holder: at
    most ``slots`` hold one at once; nobody waits while a slot is free; a slot is never granted to a holder
    while one of a lower rank, or of its rank that asked earlier, still waits; once everyone is done every
    slot is free again."""

    async def run() -> None:
        gate = HandoverGate(slots, ranks=2)
        holders: list[tuple[int, int, asyncio.Task[None]]] = []  # (rank, order asked, task)
        held: list[tuple[int, int, asyncio.Task[None]]] = []
        served: set[int] = set()  # order asked of every holder ever granted
        for n, (step, rank, pick) in enumerate(steps):
            waiting = [h for h in holders if not h[2].done()]
            if step == "ask" or (not held and not waiting):
                holders.append((rank, n, asyncio.create_task(gate.acquire(rank))))
            elif step == "release" and held:
                held.pop(pick % len(held))
                gate.release()
            elif waiting:
                victim = waiting[pick % len(waiting)][2]
                victim.cancel()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            newly = [h for h in holders if h[2].done() and not h[2].cancelled() and h[1] not in served]
            served |= {h[1] for h in newly}
            still = [h for h in holders if not h[2].done()]
            for granted in newly:
                assert not [w for w in still if (w[0], w[1]) < (granted[0], granted[1])], "served out of turn"
            held += newly
            assert len(held) <= slots
            assert not still or gate.free == 0, "a holder waits while a slot is free"
        for h in holders:
            h[2].cancel()
        await asyncio.gather(*(h[2] for h in holders), return_exceptions=True)
        for _ in held:
            gate.release()
        assert gate.free == slots and gate.waiting == 0

    asyncio.run(run())

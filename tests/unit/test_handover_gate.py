"""The ahead relay's hand-over gate (relay/handover_gate.py): at most N holders, turns granted in the order they
were reserved, and every way a reservation can end gives its slot (or its place in line) back exactly once."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.handover_gate import HandoverGate


async def test_turns_are_granted_in_reservation_order_n_at_a_time() -> None:
    gate = HandoverGate(2)
    turns = [gate.reserve() for _ in range(5)]
    assert [t.done() for t in turns] == [True, True, False, False, False] and gate.free == 0
    gate.give_back(turns[1])
    assert [t.done() for t in turns] == [True, True, True, False, False]
    gate.give_back(turns[0])
    gate.give_back(turns[2])
    assert all(t.done() for t in turns)
    gate.give_back(turns[3])
    gate.give_back(turns[4])
    assert gate.free == 2


async def test_a_place_given_back_before_its_turn_is_skipped_and_frees_nothing() -> None:
    gate = HandoverGate(1)
    first, second, third = gate.reserve(), gate.reserve(), gate.reserve()
    gate.give_back(second)  # its holder was cancelled while waiting
    assert second.cancelled() and not third.done()
    gate.give_back(first)
    assert third.done() and not third.cancelled() and gate.free == 0
    gate.give_back(third)
    assert gate.free == 1


async def test_a_holder_cancelled_while_waiting_for_its_turn_gives_its_place_back() -> None:
    gate = HandoverGate(1)
    held = gate.reserve()
    turn = gate.reserve()

    async def holder() -> None:
        try:
            await turn
        finally:
            gate.give_back(turn)

    task = asyncio.create_task(holder())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.give_back(held)
    assert gate.free == 1


def test_a_gate_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        HandoverGate(0)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(st.booleans(), st.integers(0, 20)), max_size=40))
def test_never_more_holders_than_slots_turns_in_order_and_every_slot_comes_back(
    slots: int, steps: list[tuple[bool, int]]
) -> None:
    """Any interleaving of reservations and give-backs (of holders and of places still in line): at most
    ``slots`` reservations hold a turn at once; a reservation is granted only once every earlier one was
    granted or withdrawn; once all are given back every slot is free again."""

    async def run() -> None:
        gate = HandoverGate(slots)
        reservations: list[asyncio.Future[None]] = []
        open_turns: list[asyncio.Future[None]] = []
        granted: set[int] = set()  # indexes ever granted
        withdrawn: set[int] = set()  # indexes given back while still in line
        for reserve, pick in steps:
            if reserve or not open_turns:
                turn = gate.reserve()
                reservations.append(turn)
                open_turns.append(turn)
            else:
                turn = open_turns.pop(pick % len(open_turns))
                index = reservations.index(turn)
                if not turn.done():
                    withdrawn.add(index)
                gate.give_back(turn)
            granted |= {i for i, t in enumerate(reservations) if t.done() and not t.cancelled()}
            holding = [t for t in open_turns if t.done() and not t.cancelled()]
            assert len(holding) <= slots
            for j in granted:
                assert all(i in granted or i in withdrawn for i in range(j)), "a turn was granted out of order"
            assert holding or not [t for t in open_turns if not t.done()], "turns wait while a slot is free"
        for turn in list(open_turns):
            gate.give_back(turn)
        assert gate.free == slots

    asyncio.run(run())

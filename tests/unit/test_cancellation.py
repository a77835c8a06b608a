"""A handler's cancellation signal: whoever waits, before or after the cancel, learns the reason."""

from __future__ import annotations

import asyncio

import pytest

from consumers.errors import OccurrenceCanceled
from consumers.occurrence import Cancellation


async def test_a_waiting_handler_wakes_with_the_reason() -> None:
    signal = Cancellation()
    waiter = asyncio.ensure_future(signal.wait())
    await asyncio.sleep(0)
    assert not waiter.done() and not signal.is_canceled
    signal.cancel("schedule canceled")
    assert await asyncio.wait_for(waiter, 1) == "schedule canceled"


async def test_waiting_after_the_cancel_returns_at_once_and_the_first_reason_stays() -> None:
    signal = Cancellation()
    signal.cancel("first")
    signal.cancel("second")
    assert signal.is_canceled
    assert await asyncio.wait_for(signal.wait(), 1) == "first"
    with pytest.raises(OccurrenceCanceled, match="first"):
        signal.raise_if_canceled()


async def test_two_waiters_both_wake() -> None:
    signal = Cancellation()
    waiters = [asyncio.ensure_future(signal.wait()) for _ in range(2)]
    await asyncio.sleep(0)
    signal.cancel("paused")
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1) == ["paused", "paused"]


def test_an_uncanceled_signal_raises_nothing() -> None:
    signal = Cancellation()
    signal.raise_if_canceled()
    assert not signal.is_canceled and signal.reason is None

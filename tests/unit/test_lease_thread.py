"""run_on_own_thread: the coroutine runs on another thread's loop, ends (clean-up included) before the caller
returns, hands its exception over, and the caller's loop ticks while it runs."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine.loops.lease_thread import LoopTicks, run_on_own_thread


async def test_it_runs_on_another_thread_and_finishes_its_clean_up_before_returning():
    stop, seen, cleaned = asyncio.Event(), [], []

    async def main(thread_stop: asyncio.Event) -> None:
        seen.append(threading.current_thread().name)
        try:
            await thread_stop.wait()
        finally:
            await asyncio.sleep(0.05)  # a release round trip
            cleaned.append(True)

    runner = asyncio.create_task(run_on_own_thread(main, stop, LoopTicks(), 0.01, "leases-x"))
    await asyncio.sleep(0.1)
    assert seen == ["leases-x"] and not cleaned
    stop.set()
    await runner
    assert cleaned == [True]


async def test_cancelling_the_caller_still_waits_for_the_clean_up():
    cleaned = []

    async def main(thread_stop: asyncio.Event) -> None:
        try:
            await thread_stop.wait()
        finally:
            await asyncio.sleep(0.05)
            cleaned.append(True)

    runner = asyncio.create_task(run_on_own_thread(main, asyncio.Event(), LoopTicks(), 0.01, "t"))
    await asyncio.sleep(0.05)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert cleaned == [True]


async def test_its_exception_is_raised_in_the_caller():
    async def main(thread_stop: asyncio.Event) -> None:
        raise LookupError("lease table missing")

    with pytest.raises(LookupError, match="lease table missing"):
        await run_on_own_thread(main, asyncio.Event(), LoopTicks(), 0.01, "t")


async def test_the_ticks_follow_the_callers_loop_not_the_thread():
    ticks, stop, stalls = LoopTicks(), asyncio.Event(), []

    async def main(thread_stop: asyncio.Event) -> None:
        while not thread_stop.is_set():
            stalls.append(ticks.stalled_for())
            await asyncio.sleep(0.02)

    runner = asyncio.create_task(run_on_own_thread(main, stop, ticks, 0.02, "t"))
    await asyncio.sleep(0.1)
    assert max(stalls) < 0.2
    time.sleep(0.4)  # the caller's loop held: the thread goes on and sees the ticks stop
    assert ticks.stalled_for() >= 0.4 and max(stalls) >= 0.3
    stop.set()
    await runner

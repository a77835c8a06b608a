"""The event-loop probe reports a stall with how much of it the garbage collector took."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from engine.loops.loop_lag import LoopLagProbe
from tests.support.telemetry import Telemetry


async def test_a_loop_held_by_code_and_by_the_collector_is_a_stall_that_says_which(caplog):
    telemetry = Telemetry()
    probe = LoopLagProbe(interval=0.05, warn_after=0.2, node_id="node-a", meter=telemetry.instruments("t")["meter"])
    caplog.set_level(logging.WARNING, logger="chronoq.loop_lag")
    gc.callbacks.append(probe._on_gc)
    try:
        assert await probe.probe_once() < 0.2  # a free loop wakes the probe on time

        async def hold_the_loop() -> None:  # what a page handed over in one go, or a full collection, does
            await asyncio.sleep(0.01)
            time.sleep(0.3)
            gc.collect()

        holder = asyncio.create_task(hold_the_loop())
        lag = await probe.probe_once()
        await holder
    finally:
        gc.callbacks.remove(probe._on_gc)
    assert lag >= 0.25
    [stall] = [r for r in caplog.records if getattr(r, "action", None) == "loop.stalled"]
    assert stall.lag_s >= 0.25 and 0 < stall.gc_s < stall.lag_s and stall.node_id == "node-a"
    assert stall.gc_generation == 2  # gc.collect() is a full collection
    [points] = telemetry.points("chronoq.event_loop_lag")
    assert points.count == 2 and points.max >= 0.25


async def test_the_probe_leaves_no_collector_callback_behind():
    stop = asyncio.Event()
    before = list(gc.callbacks)
    task = asyncio.create_task(LoopLagProbe(interval=0.01).run(stop))
    await asyncio.sleep(0.05)
    assert len(gc.callbacks) == len(before) + 1
    stop.set()
    await task
    assert gc.callbacks == before


async def test_a_stall_without_a_collection_names_no_generation(caplog):
    probe = LoopLagProbe(interval=0.05, warn_after=0.1)
    caplog.set_level(logging.WARNING, logger="chronoq.loop_lag")
    gc.callbacks.append(probe._on_gc)
    threshold = gc.get_threshold()
    gc.disable()  # nothing but this test's own code may hold the loop
    try:

        async def hold_the_loop() -> None:
            await asyncio.sleep(0.01)
            time.sleep(0.2)

        holder = asyncio.create_task(hold_the_loop())
        await probe.probe_once()
        await holder
    finally:
        gc.enable()
        gc.set_threshold(*threshold)
        gc.callbacks.remove(probe._on_gc)
    [stall] = [r for r in caplog.records if getattr(r, "action", None) == "loop.stalled"]
    assert stall.gc_s == 0 and stall.gc_generation is None

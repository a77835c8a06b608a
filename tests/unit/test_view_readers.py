"""A view's reader outlives any one failed read (consumers/topic_reader.py::keep_reading).

Why: the schedule-state, target-binding and grant readers looped on ``getmany`` with nothing around it, so
one raised read ended the background task for good and the view stopped moving without a word: every
later binding "no" then stood (occurrences dead-lettered as poison), every later grant timed out.
"""

from __future__ import annotations

import asyncio
import logging

from consumers.topic_reader import keep_reading

log = logging.getLogger("test.view_readers")


async def test_a_failed_read_is_logged_and_retried_and_reading_goes_on(caplog):
    stop = asyncio.Event()
    outcomes = iter([RuntimeError("broker away"), ConnectionError("reset"), None, None])
    reads = []

    async def read() -> None:
        reads.append(1)
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome
        if len(reads) == 4:
            stop.set()

    caplog.set_level(logging.WARNING, logger=log.name)
    await asyncio.wait_for(keep_reading(read, lambda: True, stop, log, "bindings", backoff=0.001), 5)
    assert len(reads) == 4
    failures = [r for r in caplog.records if getattr(r, "action", None) == "consumer.view_read_failed"]
    assert [r.view for r in failures] == ["bindings", "bindings"]
    assert "broker away" in failures[0].error


async def test_reading_ends_when_there_is_nothing_more_to_read_or_on_stop():
    calls = []

    async def read() -> None:
        calls.append(1)

    await asyncio.wait_for(keep_reading(read, lambda: len(calls) < 3, None, log, "grants"), 5)
    assert len(calls) == 3
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(keep_reading(read, lambda: True, stop, log, "grants"), 5)
    assert len(calls) == 3


async def test_cancelling_the_reader_cancels_it():
    async def read() -> None:
        await asyncio.sleep(10)

    task = asyncio.create_task(keep_reading(read, lambda: True, None, log, "states"))
    await asyncio.sleep(0.01)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    assert task.cancelled()

"""A node's shard leases renewed on a thread of their own: its own event loop, its own connection.

Why: the node's event loop carries the relay's pages, the settle pass and the materializer, and at the
top of a burst it runs every task late: a renewal came 1.5 s after its interval on top of 0.7 s of
statements in an Apache Kafka 500,000 run (3.1 s between renewals), and in stop 33 a node went more than
``lease_ttl`` without renewing and lost every shard (373,024 duplicates). A renewal on the node's loop
waits behind every callback queued before it, once per round trip. On a thread of its own it waits only
for the database and for the interpreter lock, which a thread asking for it gets within the switch
interval (5 ms) — except while the garbage collector runs, which stops every thread alike.

The precedent is Kafka's consumer (KIP-62): heartbeats from a background thread, so processing time no
longer costs the group membership, plus ``max.poll.interval.ms`` so that a consumer whose processing
stopped leaves anyway. The same here: the node's loop ticks (:class:`LoopTicks`), and a lease thread that
has seen no tick for ``loop_stall_limit`` stops heartbeating and renewing
(``engine.loops.shard_leases.ShardLeases``), so the shards of a wedged node move as a dead node's do.
A paused process (SIGSTOP) pauses this thread with it: its leases expire as before.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any


class LoopTicks:
    """When the node's event loop last ran a task of ours (monotonic seconds), read from the lease thread."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def tick(self) -> None:
        self.last = time.monotonic()

    def stalled_for(self) -> float:
        """Seconds since the node's loop last ticked."""
        return time.monotonic() - self.last


async def run_on_own_thread(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    stop: asyncio.Event,
    ticks: LoopTicks,
    tick_every: float,
    name: str,
) -> None:
    """Run ``main(thread_stop)`` in a new thread's event loop until ``stop`` (of the calling loop) is set or
    ``main`` ends; meanwhile tick ``ticks`` from the calling loop every ``tick_every`` seconds.

    Guarantees: when this returns (also when cancelled), ``main`` has finished — its own clean-up (a
    lease release) included — and its exception, if any, is raised here.
    """
    home = asyncio.get_running_loop()
    finished: asyncio.Future[None] = home.create_future()
    started = threading.Event()
    handles: dict[str, Any] = {}

    def report(outcome: BaseException | None) -> None:
        if finished.done():
            return
        if outcome is None:
            finished.set_result(None)
        else:
            finished.set_exception(outcome)

    async def thread_main() -> None:
        handles["loop"], handles["stop"] = asyncio.get_running_loop(), asyncio.Event()
        started.set()
        await main(handles["stop"])

    def body() -> None:
        try:
            asyncio.run(thread_main())
        except BaseException as err:  # noqa: BLE001 - handed to the calling loop, raised there
            started.set()
            home.call_soon_threadsafe(report, err)
        else:
            home.call_soon_threadsafe(report, None)

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set() and not finished.done():
            ticks.tick()
            await asyncio.wait((finished, stopped), timeout=tick_every, return_when=asyncio.FIRST_COMPLETED)
        ticks.tick()
    finally:
        stopped.cancel()
        await asyncio.to_thread(started.wait)
        if not finished.done() and "loop" in handles:
            try:
                handles["loop"].call_soon_threadsafe(handles["stop"].set)
            except RuntimeError:  # its loop closed meanwhile: main has ended, its outcome is on its way
                pass
        await asyncio.shield(finished)

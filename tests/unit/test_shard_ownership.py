"""ShardOwnership changed from the lease thread: readers see whole sets, and the node's loop is woken."""

from __future__ import annotations

import asyncio
import threading

from schemas.shard_ownership import ShardOwnership


async def test_a_change_made_on_another_thread_wakes_the_waiters_of_the_node_loop():
    ownership = ShardOwnership("node-a")
    ownership.bind_loop(asyncio.get_running_loop())
    waiter = asyncio.create_task(ownership.changed.wait())
    await asyncio.sleep(0)

    def lease_thread() -> None:  # the lease loop's own event loop
        async def lease_round() -> None:
            ownership.replace({1: 7, 2: 7})

        asyncio.run(lease_round())

    thread = threading.Thread(target=lease_thread)
    thread.start()
    await asyncio.wait_for(waiter, 5)
    thread.join()
    assert ownership.snapshot() == {1: 7, 2: 7} and ownership.version == 1


async def test_readers_always_see_a_whole_set_while_another_thread_replaces_it():
    ownership = ShardOwnership("node-a")
    ownership.bind_loop(asyncio.get_running_loop())
    sets = [{s: epoch for s in range(256)} for epoch in range(1, 200)]
    done = threading.Event()

    def replace_all() -> None:
        for epochs in sets:
            ownership.replace(epochs)
        done.set()

    thread = threading.Thread(target=replace_all)
    thread.start()
    seen = []
    while not done.is_set():
        seen.append(ownership.snapshot())
        await asyncio.sleep(0)
    thread.join()
    assert all(len(s) in (0, 256) and len(set(s.values())) <= 1 for s in seen)  # never half of one, half another

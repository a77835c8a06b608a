"""Engine nodes as real processes sharing the shards: killed, paused past their leases, at the data plane's
handoffs. Every occurrence still reaches Kafka; a crash after the broker's ack is a duplicate, never a loss;
a paused node's late writes change nothing and its locks do not hold up the next owner."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from engine.control.schedules import ControlPlane
from engine.control.tenants import TenantQuotas, create_tenant
from schemas.messages import decode_occurrence
from schemas.topics import create_missing_topics, occurrence_topic
from tests.support.kafka import read_topic
from tests.support.waiting import wait_for

# Process faults (kill, pause past a lease): run on the production broker only, for the suite's time budget.
pytestmark = [pytest.mark.slow, pytest.mark.on_broker("apache")]
ROOT = Path(__file__).resolve().parents[2]


class Node:
    """An engine node process (tests/e2e/engine_node_process.py), read line by line."""

    def __init__(self, process: asyncio.subprocess.Process, node_id: str) -> None:
        self.process, self.node_id = process, node_id
        self.lines: list[str] = []

    @classmethod
    async def start(cls, database_url: str, bootstrap: str, node_id: str, pause_at: str | None = None) -> Node:
        args = ["--database-url", database_url, "--bootstrap", bootstrap, "--node-id", node_id]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.e2e.engine_node_process",
            *args,
            *(["--pause-at", pause_at] if pause_at else []),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        node = cls(process, node_id)
        await node.expect("READY")
        return node

    async def expect(self, line: str, timeout: float = 30.0) -> None:
        async def read() -> None:
            assert self.process.stdout is not None
            while True:
                raw = await self.process.stdout.readline()
                if not raw:
                    raise AssertionError(f"{self.node_id} exited before printing {line!r}; saw {self.lines[-5:]}")
                self.lines.append(raw.decode().strip())
                if self.lines[-1].startswith(line):
                    return

        await asyncio.wait_for(read(), timeout)

    async def resume(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()

    def signal(self, sig: int) -> None:
        os.kill(self.process.pid, sig)

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.signal(signal.SIGCONT)
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


@pytest.fixture
async def nodes(engine_db, kafka_bootstrap):
    started: list[Node] = []

    async def start(node_id: str, pause_at: str | None = None) -> Node:
        node = await Node.start(engine_db, kafka_bootstrap, node_id, pause_at)
        started.append(node)
        return node

    yield start
    for node in started:
        await node.stop()


async def due_soon(pool: asyncpg.Pool, target: str, count: int, seconds: float, kafka_bootstrap: str) -> datetime:
    """``count`` one-time schedules due ``seconds`` from the database's now (a whole second)."""
    # max_running out of the way: no consumer reports attempts here, so the tenant gate would hold all but 100.
    quotas = TenantQuotas(max_active_schedules=100_000, max_fires_per_minute=1e9, max_running=100_000)
    await create_tenant(pool, "acme", quotas)
    await create_missing_topics(kafka_bootstrap, [occurrence_topic(target)], 4)
    now: datetime = await pool.fetchval("SELECT now()")
    at = (now + timedelta(seconds=seconds)).replace(microsecond=0)
    control = ControlPlane(pool)
    for _ in range(count):
        await control.create_schedule("acme", {"kind": "once", "target": target, "expression": at.isoformat()})
    return at


async def owners(pool: asyncpg.Pool) -> dict[str | None, int]:
    rows = await pool.fetch("SELECT owner, count(*) AS n FROM shard_leases WHERE expires_at > now() GROUP BY owner")
    return {r["owner"]: r["n"] for r in rows}


async def occurrence_ids_in_kafka(bootstrap: str, target: str, expected: int) -> list[uuid.UUID]:
    records = await read_topic(bootstrap, occurrence_topic(target), expected=expected, timeout=30, settle=1.0)
    return [decode_occurrence(r.value).occurrence_id for r in records]


async def test_a_node_killed_after_the_ack_before_its_cursor_moved_causes_a_duplicate_never_a_loss(
    pool, nodes, kafka_bootstrap, target
):
    await due_soon(pool, target, 5, 4, kafka_bootstrap)
    first = await nodes("node-1", pause_at="after_publish")
    await first.expect("AT after_publish", timeout=40)  # the broker acknowledged the page; cursor not moved
    first.signal(signal.SIGKILL)
    await first.process.wait()
    assert await pool.fetchval("SELECT count(*) FROM dispatch_log") == 0
    assert len(await occurrence_ids_in_kafka(kafka_bootstrap, target, 5)) == 5
    killed_at = time.monotonic()
    await nodes("node-2")
    await wait_for(lambda: pool.fetchval("SELECT count(*) = 5 FROM occurrences WHERE state = 'ENQUEUED'"), 40)
    moved_after = time.monotonic() - killed_at
    ids = await occurrence_ids_in_kafka(kafka_bootstrap, target, 10)
    expected = {r["occurrence_id"] for r in await pool.fetch("SELECT occurrence_id FROM occurrences")}
    assert set(ids) == expected and len(ids) == 10  # every occurrence twice: republished from the cursor
    assert moved_after < 2.5 + 10  # the lease TTL, plus the new node's start and a few rounds
    print(f"shards moved and republished {moved_after:.1f} s after the kill")


async def test_a_node_paused_in_its_materializer_transaction_past_its_lease_blocks_nothing_and_changes_nothing(
    pool, nodes, kafka_bootstrap, target
):
    await due_soon(pool, target, 20, 8, kafka_bootstrap)
    paused = await nodes("node-1", pause_at="after_lock")
    await paused.expect("AT after_lock", timeout=40)  # inside the transaction, shards locked FOR SHARE
    paused.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    stale = {
        (r["shard"], r["epoch"])
        for r in await pool.fetch("SELECT shard, epoch FROM shard_leases WHERE owner = 'node-1'")
    }
    await nodes("node-2")
    # Acquisitions never wait for a materializer (the lease row is not locked). The stopped node's open
    # transaction holds its shards' seals FOR SHARE until the server ends it (idle_in_transaction_session_timeout,
    # 5 s); node-2's seal waits that long at most, then it publishes everything.
    await wait_for(lambda: _all_owned_by(pool, "node-2"), 30)
    moved_after = time.monotonic() - stopped_at
    await wait_for(lambda: pool.fetchval("SELECT count(*) = 20 FROM occurrences WHERE state = 'ENQUEUED'"), 40)
    paused.signal(signal.SIGCONT)
    await paused.resume()  # it goes on with the transaction the server has ended meanwhile
    await asyncio.sleep(2.0)  # let the woken node try whatever it was about to do: it must change nothing
    ids = await occurrence_ids_in_kafka(kafka_bootstrap, target, 20)
    assert len(ids) == 20 and len(set(ids)) == 20  # nothing lost, nothing twice
    assert await pool.fetchval("SELECT count(*) FROM occurrences") == 20
    logged = {(r["shard"], r["epoch"]) for r in await pool.fetch("SELECT shard, epoch FROM dispatch_log")}
    assert logged and not logged & stale  # no cursor move under the paused node's stale epochs
    assert moved_after < 2.5 + 5 + 10
    print(f"a paused node's shards moved {moved_after:.1f} s after SIGSTOP")


async def _all_owned_by(pool: asyncpg.Pool, node: str) -> bool:
    return (await owners(pool)).get(node, 0) == 256


async def test_three_nodes_one_killed_one_paused_lose_nothing_and_double_nothing(pool, nodes, kafka_bootstrap, target):
    at = await due_soon(pool, target, 300, 40, kafka_bootstrap)
    a, b, c = await nodes("node-a"), await nodes("node-b"), await nodes("node-c")
    await wait_for(lambda: _split_three(pool), 30)
    now: datetime = await pool.fetchval("SELECT now()")
    # Materialized ahead, nothing read yet (the top's bucket is sealed only at the top): the faults land
    # between pages, so nothing may be doubled either.
    assert (at - now).total_seconds() > 4, "setting up took too long for the faults to land before the top"
    await asyncio.sleep((at - now).total_seconds() - 3)
    a.signal(signal.SIGKILL)
    b.signal(signal.SIGSTOP)
    failed_at = time.monotonic()
    await wait_for(lambda: _all_owned_by(pool, "node-c"), 30)
    moved_after = time.monotonic() - failed_at
    await wait_for(lambda: pool.fetchval("SELECT count(*) = 300 FROM occurrences WHERE state = 'ENQUEUED'"), 60)
    b.signal(signal.SIGCONT)
    await asyncio.sleep(2.0)
    ids = await occurrence_ids_in_kafka(kafka_bootstrap, target, 300)
    assert len(set(ids)) == 300 and len(ids) == 300
    print(f"shards of a killed and a paused node moved to the third {moved_after:.1f} s after the faults")
    assert c.process.returncode is None


async def _split_three(pool: asyncpg.Pool) -> bool:
    counts = await owners(pool)
    return sorted(counts.get(n, 0) for n in ("node-a", "node-b", "node-c")) == [85, 85, 86]

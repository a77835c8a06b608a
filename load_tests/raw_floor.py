"""The raw floor: how fast this machine does the dispatch work with nothing of chronoq in the way.

    python -m load_tests.raw_floor [--rows 200000] [--bootstrap HOST:PORT]

Measured in the same run as a chronoq benchmark (``load_tests.hour_top``
calls :func:`measure_floor_apart`: the same steps in a process of their own),
so that chronoq's dispatch rate can be reported as a fraction of the fastest
raw pipeline on the same machine, under the same load. Each step is the simplest correct way to do it:

- ``copy_rows_per_s``: COPY of outbox-sized rows (~300 B message) into a
  table with a primary key;
- ``range_read_rows_per_s``: reading them back in key order, batches of 5,000;
- ``aiokafka_msgs_per_s``: aiokafka's batch API (``create_batch`` /
  ``send_batch``), acks=all, one batch per partition at a time;
- ``confluent_msgs_per_s``: librdkafka (confluent-kafka) ``produce`` +
  ``flush``, acks=all, linger 5 ms; ``confluent_lz4_msgs_per_s`` the same with
  lz4-compressed batches (the relay's setting);
- ``pipeline_rows_per_s``: read a batch + produce it (fastest client) + one
  cursor UPDATE per batch, in one asyncio loop: the floor of a cursor relay;
  ``pipeline_lz4_rows_per_s`` the same with lz4. :func:`fastest_pipeline` is
  the faster of the two: what chronoq's dispatch rate is compared with, so
  that compression the relay uses is never a gain the floor lacks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import orjson

FLOOR_TABLE = "raw_floor_rows"
FLOOR_CURSOR_TABLE = "raw_floor_cursor"
FLOOR_TOPIC_PREFIX = "raw-floor-"
DATABASE_URL_VARIABLE = "CHRONOQ_RAW_FLOOR_DATABASE_URL"
BATCH = 5000


def sample_message(i: int) -> bytes:
    """An occurrence-message-sized body (the real encoder's field set, ~300 bytes)."""
    return orjson.dumps(
        {
            "format": 1,
            "occurrence_id": str(uuid.uuid4()),
            "schedule_id": str(uuid.uuid4()),
            "schedule_version": 1,
            "tenant_id": f"tenant-{i % 100}",
            "target": "load.target-1",
            "scheduled_for": "2027-01-04T09:00:00Z",
            "available_at": "2027-01-04T09:00:00Z",
            "attempt": 1,
            "priority": "strict",
            "deadline": None,
            "payload": {"n": i},
        }
    )


async def copy_rows(conn: asyncpg.Connection, rows: int) -> float:
    """COPY ``rows`` rows into a fresh table; rows/s."""
    await conn.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
    await conn.execute(
        f"CREATE TABLE {FLOOR_TABLE} (id bigint PRIMARY KEY, message_key bytea NOT NULL, message bytea NOT NULL)"
    )
    records = [(i, str(i).encode(), sample_message(i)) for i in range(rows)]
    started = time.perf_counter()
    await conn.copy_records_to_table(FLOOR_TABLE, records=records)
    return rows / (time.perf_counter() - started)


async def range_read(conn: asyncpg.Connection, rows: int) -> float:
    """Read the table back in key order, BATCH rows per query; rows/s."""
    started = time.perf_counter()
    last, seen = -1, 0
    while True:
        batch = await conn.fetch(
            f"SELECT id, message_key, message FROM {FLOOR_TABLE} WHERE id > $1 ORDER BY id LIMIT $2", last, BATCH
        )
        if not batch:
            break
        seen += len(batch)
        last = batch[-1]["id"]
    return seen / (time.perf_counter() - started)


async def aiokafka_produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> float:
    """aiokafka batch API, acks=all; msgs/s."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.partitioner import DefaultPartitioner

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=False,
        max_batch_size=1024 * 1024,
        max_request_size=1024 * 1024,
    )
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic))
        partitioner = DefaultPartitioner()
        started = time.perf_counter()
        for offset in range(0, len(messages), BATCH):
            groups: dict[int, list[tuple[bytes, bytes]]] = {}
            for key, value in messages[offset : offset + BATCH]:
                groups.setdefault(partitioner(key, partitions, partitions), []).append((key, value))
            futures = []
            for partition, group in groups.items():
                batch = producer.create_batch()
                for key, value in group:
                    if batch.append(key=key, value=value, timestamp=None) is None:
                        futures.append(await producer.send_batch(batch, topic, partition=partition))
                        batch = producer.create_batch()
                        batch.append(key=key, value=value, timestamp=None)
                futures.append(await producer.send_batch(batch, topic, partition=partition))
            await asyncio.gather(*futures)
        return len(messages) / (time.perf_counter() - started)
    finally:
        await producer.stop()


def confluent_config(bootstrap: str, idempotent: bool = False, compression: str = "none") -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": compression,
        "enable.idempotence": idempotent,
        "batch.num.messages": 10000,
        "batch.size": 1024 * 1024,
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 1024 * 1024,
        "message.max.bytes": 2 * 1024 * 1024,
    }


async def confluent_produce(
    bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], compression: str = "none"
) -> float:
    """librdkafka produce + flush (in a thread: flush releases the GIL), acks=all; msgs/s."""
    from confluent_kafka import Producer

    producer = Producer(confluent_config(bootstrap, compression=compression))
    failures: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    loop = asyncio.get_running_loop()
    producer.produce(topic, key=b"warm-up", value=b"{}", on_delivery=delivered)
    await loop.run_in_executor(None, producer.flush, 30)
    started = time.perf_counter()
    for offset in range(0, len(messages), BATCH):
        for key, value in messages[offset : offset + BATCH]:
            producer.produce(topic, key=key, value=value, on_delivery=delivered)
        await loop.run_in_executor(None, producer.flush, 30)
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed, first {failures[0]}")
    return len(messages) / elapsed


async def pipeline(conn: asyncpg.Connection, bootstrap: str, topic: str, compression: str = "none") -> float:
    """Read a batch + produce it with librdkafka + one cursor UPDATE per batch; rows/s."""
    from confluent_kafka import Producer

    await conn.execute(f"CREATE TABLE IF NOT EXISTS {FLOOR_CURSOR_TABLE} (id int PRIMARY KEY, position bigint)")
    await conn.execute(f"INSERT INTO {FLOOR_CURSOR_TABLE} VALUES (1, -1) ON CONFLICT (id) DO UPDATE SET position = -1")
    producer = Producer(confluent_config(bootstrap, compression=compression))
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    last, seen = -1, 0
    while True:
        batch = await conn.fetch(
            f"SELECT id, message_key, message FROM {FLOOR_TABLE} WHERE id > $1 ORDER BY id LIMIT $2", last, BATCH
        )
        if not batch:
            break
        for row in batch:
            producer.produce(topic, key=row["message_key"], value=row["message"])
        await loop.run_in_executor(None, producer.flush, 30)
        last = batch[-1]["id"]
        await conn.execute(f"UPDATE {FLOOR_CURSOR_TABLE} SET position = $1 WHERE id = 1", last)
        seen += len(batch)
    return seen / (time.perf_counter() - started)


def fastest_pipeline(floor: dict[str, float]) -> float | None:
    """The floor's fastest read + produce + cursor pipeline, compressed or not (None: not measured)."""
    rates = [floor[key] for key in ("pipeline_rows_per_s", "pipeline_lz4_rows_per_s") if floor.get(key)]
    return max(rates) if rates else None


async def _timed(step: Callable[[], Awaitable[float]]) -> float:
    return round(await step())


async def measure_floor(
    database_url: str, bootstrap: str, rows: int = 200_000, partitions: int = 8
) -> dict[str, float]:
    """Every floor figure, measured now on this machine. Leaves nothing behind, also when a step fails: its
    tables are dropped and its topic deleted (a million messages would otherwise stay in an in-memory
    broker's heap through the run it is the floor of)."""
    from aiokafka.admin import AIOKafkaAdminClient

    from schemas.topics import ensure_topics

    topic = f"{FLOOR_TOPIC_PREFIX}{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, [topic], partitions)
        messages = [(uuid.uuid4().bytes, sample_message(i)) for i in range(rows)]
        conn = await asyncpg.connect(database_url)
        try:
            return {
                "rows": rows,
                "copy_rows_per_s": await _timed(lambda: copy_rows(conn, rows)),
                "range_read_rows_per_s": await _timed(lambda: range_read(conn, rows)),
                "aiokafka_msgs_per_s": await _timed(lambda: aiokafka_produce(bootstrap, topic, messages)),
                "confluent_msgs_per_s": await _timed(lambda: confluent_produce(bootstrap, topic, messages)),
                "confluent_lz4_msgs_per_s": await _timed(lambda: confluent_produce(bootstrap, topic, messages, "lz4")),
                "pipeline_rows_per_s": await _timed(lambda: pipeline(conn, bootstrap, topic)),
                "pipeline_lz4_rows_per_s": await _timed(lambda: pipeline(conn, bootstrap, topic, "lz4")),
            }
        finally:
            await conn.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
            await conn.execute(f"DROP TABLE IF EXISTS {FLOOR_CURSOR_TABLE}")
            await conn.close()
    finally:
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()


async def measure_floor_apart(
    database_url: str, bootstrap: str, rows: int = 200_000, partitions: int = 8
) -> dict[str, float]:
    """:func:`measure_floor` in a process of its own, against the same server and broker.

    The floor's clients leave ~1.7 GB resident in the process that ran them (the messages, librdkafka's
    and aiokafka's buffers: freed to the allocator, not to the kernel), which a benchmark that ran them
    itself carried through the run it measures; a child's memory goes back to the machine when it exits.
    The server's URL goes to the child in its environment, not on a command line others can read."""
    command = [
        sys.executable, "-m", "load_tests.raw_floor", "--rows", str(rows), "--partitions", str(partitions),
        "--bootstrap", bootstrap,
    ]  # fmt: skip
    child = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, env={**os.environ, DATABASE_URL_VARIABLE: database_url}
    )
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the floor's process exited with {child.returncode}: its error is on stderr above")
    figures: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return figures


async def _main(args: argparse.Namespace) -> dict[str, float]:
    from load_tests.stack_for_load import load_stack

    if args.bootstrap:
        url = os.environ.get(DATABASE_URL_VARIABLE)
        if not url:
            raise SystemExit(f"--bootstrap measures on a running stack: set {DATABASE_URL_VARIABLE} to its server")
        return await measure_floor(url, args.bootstrap, args.rows, args.partitions)
    async with load_stack("floor") as (url, bootstrap):
        return await measure_floor(url, bootstrap, args.rows, args.partitions)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--bootstrap",
        help=f"measure on this broker and the server ${DATABASE_URL_VARIABLE} names (default: an embedded stack)",
    )
    # One line: the caller (measure_floor_apart) reads the last line of stdout.
    print(json.dumps(asyncio.run(_main(parser.parse_args()))), flush=True)
    os._exit(0)

"""Benchmark: produce rate with acks=all on Apache Kafka (flush per append or not) and on tansu.

    python -m load_tests.broker_produce [--broker tansu|apache] [--messages 200000] [--batch 5000] [--json PATH]

What it answers: what does ``log.flush.interval.messages=1`` (fsync of a
partition's log before every produce response, the durability choice in
engine/cli/embedded/apache_kafka/server.properties) cost the relay? Each
broker variant starts fresh in a temporary directory and gets:

- ``relay batches``: the relay's own publisher (relay.publisher.KafkaPublisher,
  explicit per-partition batches, acks=all) publishing ``--messages`` records
  of 300 bytes over 50 tenant keys in calls of ``--batch`` records;
- ``awaited sends``: one awaited ``send`` per message (acks=all), the slowest
  pattern, which shows the per-request cost (each request is one fsync when
  flushing);
- ``idempotent awaited sends``: the same with ``enable_idempotence=True``
  (Apache Kafka only: tansu has no InitProducerId).

Variants: Apache Kafka as configured (flush per append), Apache Kafka with
flushing left to the OS, Apache Kafka with the C2 compiler too (the launcher
stops at C1 to start faster), and tansu; ``--broker`` runs one kind's only
(default: both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

from engine.cli.embedded.apache_kafka import FULL_JIT_JVM_OPTIONS, JVM_OPTIONS, ApacheKafka
from engine.cli.embedded.brokers import BROKER_KINDS
from engine.cli.embedded.tansu import EmbeddedKafka
from relay.publisher import KafkaPublisher, OutgoingRecord, PublisherConfig

NO_FLUSH = {"log.flush.interval.messages": str(2**63 - 1)}


async def relay_batches(bootstrap: str, messages: int, batch: int) -> float:
    publisher = KafkaPublisher(PublisherConfig(bootstrap=bootstrap))
    await publisher.start()
    try:
        topic = f"bench.{uuid.uuid4().hex[:8]}"
        await publisher.ensure_topics([topic])
        value = b"x" * 300
        records = [OutgoingRecord(i, topic, f"tenant-{i % 50}".encode(), value) for i in range(messages)]
        await publisher.publish(records[:batch])  # warm-up: metadata, connections
        began = time.perf_counter()
        for start in range(0, messages, batch):
            outcome = await publisher.publish(records[start : start + batch])
            failed = [error for error in outcome.values() if error is not None]
            if failed:
                raise RuntimeError(f"{len(failed)} records not acknowledged: {failed[0]!r}")
        return messages / (time.perf_counter() - began)
    finally:
        await publisher.stop()


async def awaited_sends(bootstrap: str, messages: int, idempotent: bool) -> float:
    publisher = KafkaPublisher(PublisherConfig(bootstrap=bootstrap))
    await publisher.start()
    topic = f"bench.{uuid.uuid4().hex[:8]}"
    await publisher.ensure_topics([topic])
    await publisher.stop()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=idempotent)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"warm-up", key=b"tenant-0")
        began = time.perf_counter()
        for i in range(messages):
            await producer.send_and_wait(topic, b"x" * 300, key=f"tenant-{i % 50}".encode())
        return messages / (time.perf_counter() - began)
    finally:
        await producer.stop()


async def measure(bootstrap: str, args: argparse.Namespace, idempotence: bool) -> dict[str, float]:
    figures = {
        "relay batches": await relay_batches(bootstrap, args.messages, args.batch),
        "awaited sends": await awaited_sends(bootstrap, args.single, idempotent=False),
    }
    if idempotence:
        figures["idempotent awaited sends"] = await awaited_sends(bootstrap, args.single, idempotent=True)
    return figures


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    variants = (
        []
        if args.broker == "tansu"
        else [
            ("apache kafka, flush per append (configured)", {}, JVM_OPTIONS),
            ("apache kafka, flush left to the OS", NO_FLUSH, JVM_OPTIONS),
            ("apache kafka, flush per append, C2 compiler too", {}, FULL_JIT_JVM_OPTIONS),
        ]
    )
    for name, overrides, jvm in variants:
        base = Path(tempfile.mkdtemp(prefix="chronoq-bench-kafka-"))
        broker = ApacheKafka(base, overrides=overrides, jvm_options=jvm)
        try:
            bootstrap = broker.start()
            results[name] = await measure(bootstrap, args, idempotence=True)
        finally:
            broker.stop()
            shutil.rmtree(base, ignore_errors=True)
        print(name, {k: round(v) for k, v in results[name].items()}, flush=True)
    if args.broker == "apache":
        return results
    tansu = EmbeddedKafka()
    try:
        results["tansu (memory)"] = await measure(tansu.start(), args, idempotence=False)
    finally:
        tansu.stop()
    print("tansu (memory)", {k: round(v) for k, v in results["tansu (memory)"].items()}, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=BROKER_KINDS, help="run only this broker's variants (default: both)")
    parser.add_argument("--messages", type=int, default=200_000, help="records in the relay-batch run")
    parser.add_argument("--batch", type=int, default=5_000, help="records per publish call (the relay's batch)")
    parser.add_argument("--single", type=int, default=2_000, help="messages in the awaited-send runs")
    parser.add_argument("--json", type=Path, help="also write the figures (msgs/s) here")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""Fuzz every consumed topic at volume: N generated hostile records each, then valid records must be applied.

    python -m load_tests.fuzz_topics [--records 10000] [--json PATH]

On the embedded stack (or CHRONOQ_DATABASE_URL / CHRONOQ_KAFKA_BOOTSTRAP): an
engine (command and attempt processors, relay, reaper) and a consumer app run
in this process. Hypothesis generates ``--records`` hostile records for each
topic they consume — chronoq.commands, chronoq.attempts,
chronoq.schedule-states, chronoq.target-bindings and an occurrence topic —
(random bytes, right-shaped JSON with wrong types, NUL, huge and negative
numbers, NaN, extreme instants, null and non-UTF-8 header values), produced
after a first valid occurrence was applied. Then valid records follow: a
signed command and an occurrence published by the relay. The run reports how
long the valid records took to be applied after the last hostile record was
acknowledged, and fails (exit 1) if any loop stopped, a valid record was not
applied within ``--deadline`` seconds, or an occurrence accepted before the
hostile records is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from aiokafka import AIOKafkaProducer

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.cli.embedded import EmbeddedKafka, EmbeddedPostgres
from engine.control.tenants import create_tenant
from engine.loops.service import PIPELINE_ROLES, Role, ServiceConfig, run_services
from schemas.commands import HEADER_SIGNATURE, Command, sign
from schemas.connections import create_pool
from schemas.migrations import apply_migrations
from schemas.topics import (
    ATTEMPTS_TOPIC,
    COMMANDS_TOPIC,
    SCHEDULE_STATES_TOPIC,
    TARGET_BINDINGS_TOPIC,
    create_missing_topics,
    occurrence_topic,
)
from tests.support.hostile_records import hostile
from tests.support.rows import due_occurrence

KINDS = {
    COMMANDS_TOPIC: "command",
    ATTEMPTS_TOPIC: "attempt_event",
    SCHEDULE_STATES_TOPIC: "schedule_state",
    TARGET_BINDINGS_TOPIC: "target_binding",
}


async def wait(predicate, timeout: float, since: float | None = None) -> float:
    """Seconds from ``since`` (default: now) until ``predicate()`` held; TimeoutError after ``timeout``."""
    started = time.perf_counter() if since is None else since
    while not await predicate():
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"not reached within {timeout} s")
        await asyncio.sleep(0.05)
    return time.perf_counter() - started


def _seconds(value: float | None) -> float | str:
    return "not within the deadline" if value is None else round(value, 2)


async def settled(predicate, timeout: float, since: float) -> float | None:
    """Like ``wait``, but None instead of TimeoutError (the run reports what did not happen in time)."""
    try:
        return await wait(predicate, timeout, since)
    except TimeoutError:
        return None


def _all_dead_lettered(app: ConsumerApp, count: int):
    # Some generated records may happen to be valid occurrences of another target: dead-lettered too.
    async def done() -> bool:
        return app.stats.dead_lettered + app.stats.applied >= count + 2

    return done


async def run(args: argparse.Namespace, admin_url: str, bootstrap: str) -> dict:
    database = f"fuzz_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{database}"')
    app_database = f"fuzz_app_{uuid.uuid4().hex[:8]}"
    await admin.execute(f'CREATE DATABASE "{app_database}"')
    url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{database}"))
    app_url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{app_database}"))
    pool = await create_pool(url, min_size=2, max_size=8)
    try:
        async with pool.acquire() as conn:
            await apply_migrations(conn, "engine")
        acme = await create_tenant(pool, "acme")
        target = f"fuzz.{uuid.uuid4().hex[:8]}"
        t = time.perf_counter()
        batches = await asyncio.to_thread(
            lambda: {
                **{topic: hostile(kind, args.records) for topic, kind in KINDS.items()},
                occurrence_topic(target): hostile("occurrence", args.records),
            }
        )
        generated_s = time.perf_counter() - t
        await create_missing_topics(bootstrap, list(batches))
        effects = await asyncpg.connect(app_url)
        await effects.execute("CREATE TABLE effects (occurrence_id uuid PRIMARY KEY)")
        app = ConsumerApp(ConsumerConfig(f"fuzz-{uuid.uuid4().hex[:8]}", bootstrap, app_url, binding_wait=1.0))

        @app.handler(target)
        async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
            await conn.execute("INSERT INTO effects VALUES ($1)", occurrence.occurrence_id)

        async def applied(occurrence_id: uuid.UUID) -> bool:
            return bool(await effects.fetchval("SELECT count(*) FROM effects WHERE occurrence_id = $1", occurrence_id))

        async def succeeded(occurrence_id: uuid.UUID) -> bool:
            return (
                await pool.fetchval("SELECT state FROM occurrences WHERE occurrence_id = $1", occurrence_id)
                == "SUCCEEDED"
            )

        stop, app_stop = asyncio.Event(), asyncio.Event()
        services = asyncio.create_task(
            run_services(
                url, bootstrap, stop, ServiceConfig(roles=PIPELINE_ROLES - {Role.MATERIALIZER} | {Role.COMMANDS})
            )
        )
        consumer = asyncio.create_task(app.run(app_stop))
        try:
            before = await due_occurrence(pool, "acme", target, datetime.now(UTC))
            await wait(lambda: succeeded(before.occurrence_id), args.deadline)

            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                acks="all",
                enable_idempotence=False,
                max_request_size=4 * 1024 * 1024,
                linger_ms=5,
            )
            await producer.start()
            t = time.perf_counter()
            try:
                for topic, batch in batches.items():
                    futures = [
                        await producer.send(topic, value, key=key, headers=headers) for key, value, headers in batch
                    ]
                    await asyncio.gather(*futures)
                produced_s = time.perf_counter() - t
                since = time.perf_counter()  # every hostile record is acknowledged by the broker
                command = Command(
                    uuid.uuid4(),
                    "acme",
                    "create",
                    datetime.now(UTC),
                    body={"kind": "cron", "expression": "0 9 * * *", "target": f"{target}-cmd"},
                )
                value = command.encode()
                await producer.send_and_wait(
                    COMMANDS_TOPIC,
                    value,
                    key=b"acme",
                    headers=[(HEADER_SIGNATURE, sign(acme.tenant.signing_key, value).encode())],
                )
            finally:
                await producer.stop()
            after = await due_occurrence(pool, "acme", target, datetime.now(UTC))

            async def command_applied() -> bool:
                return bool(await pool.fetchval("SELECT count(*) FROM schedules WHERE target = $1", f"{target}-cmd"))

            hostile_occurrences = len(batches[occurrence_topic(target)])
            # Watched at once, so each figure is its own (from the moment the hostile records were acknowledged).
            command_s, occurrence_s, reported_s, dead_lettered_s = await asyncio.gather(
                settled(command_applied, args.deadline, since),
                settled(lambda: applied(after.occurrence_id), args.deadline, since),
                settled(lambda: succeeded(after.occurrence_id), args.deadline, since),
                settled(_all_dead_lettered(app, hostile_occurrences), args.deadline * 5, since),
            )
            alive = not services.done() and not consumer.done()
            kept = await applied(before.occurrence_id) and await succeeded(before.occurrence_id)
        finally:
            stop.set()
            app_stop.set()
            results = await asyncio.gather(services, consumer, return_exceptions=True)
            await effects.close()
        errors = [repr(r) for r in results if isinstance(r, BaseException)]
        return {
            "records_per_topic": args.records,
            "topics": len(batches),
            "hostile_records": sum(len(b) for b in batches.values()),
            "generate_s": round(generated_s, 1),
            "produce_s": round(produced_s, 1),
            "valid_command_applied_after_s": _seconds(command_s),
            "valid_occurrence_applied_after_s": _seconds(occurrence_s),
            "valid_occurrence_succeeded_in_engine_after_s": _seconds(reported_s),
            "all_hostile_occurrences_dead_lettered_after_s": _seconds(dead_lettered_s),
            "consumer_dead_lettered": app.stats.dead_lettered,
            "consumer_applied": app.stats.applied,
            "loops_alive": alive and not errors,
            "earlier_occurrence_kept": kept,
            "errors": errors,
        }
    finally:
        await pool.close()
        for name in (database, app_database):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def main(args: argparse.Namespace) -> dict:
    admin_url = os.environ.get("CHRONOQ_DATABASE_URL")
    bootstrap = os.environ.get("CHRONOQ_KAFKA_BOOTSTRAP")
    if admin_url and bootstrap:
        return await run(args, admin_url, bootstrap)
    home = Path(tempfile.mkdtemp(prefix="chronoq-fuzz-"))
    postgres, kafka = EmbeddedPostgres(home / "postgres"), EmbeddedKafka(home / "kafka.log")
    postgres.start()
    try:
        bootstrap = kafka.start()
        try:
            return await run(args, await postgres.ensure_database("fuzz"), bootstrap)
        finally:
            kafka.stop()
    finally:
        postgres.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000, help="hostile records per topic")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds a valid record may take")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    arguments = parser.parse_args()
    # Every hostile record is logged where it is set aside; the figures below count them instead.
    logging.getLogger("chronoq").setLevel(logging.CRITICAL)
    figures = asyncio.run(main(arguments))
    print(json.dumps(figures, indent=2))
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2))
    applied_in_time = all(
        isinstance(figures[name], float)
        for name in (
            "valid_command_applied_after_s",
            "valid_occurrence_applied_after_s",
            "valid_occurrence_succeeded_in_engine_after_s",
        )
    )
    sys.exit(0 if figures["loops_alive"] and figures["earlier_occurrence_kept"] and applied_in_time else 1)

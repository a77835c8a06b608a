"""Faults on real processes: a consumer killed (SIGKILL), paused past its lease (SIGSTOP), stopped (SIGTERM).

The engine side (relay, attempt processor, reaper, overlap gate) runs in this
process on the manual clock; the consumer under test runs in its own process
(``tests/e2e/consumer_process.py``) and stops at a handoff on request. After
each fault: no occurrence is lost, no effect is applied twice, and the engine
ends in the right state.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.control.schedules import ControlPlane
from engine.loops.materializer import MaterializerConfig
from engine.loops.service import run_services
from schemas.attempt_events import decode_attempt_record
from schemas.topics import ATTEMPTS_TOPIC
from tests.support.kafka import decodable, read_topic
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row
from tests.support.services import Running, fast_services
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


class ConsumerProcess:
    """The consumer under test, in a subprocess, read line by line."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log
        self.lines: list[str] = []

    @classmethod
    async def start(
        cls, tmp_path: Path, kafka_bootstrap: str, consumer_db: str, group: str, target: str, *options: str
    ) -> ConsumerProcess:
        log = tmp_path / f"consumer-{uuid.uuid4().hex[:6]}.log"
        with log.open("wb") as stderr:  # the child keeps its own descriptor
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.e2e.consumer_process",
                "--bootstrap",
                kafka_bootstrap,
                "--database-url",
                consumer_db,
                "--group",
                group,
                "--target",
                target,
                *options,
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        return cls(process, log)

    async def expect(self, prefix: str, timeout: float = 20.0) -> list[str]:
        """Read stdout until a line starts with ``prefix``; return that line's words."""
        stdout = self.process.stdout
        assert stdout is not None

        async def read() -> list[str]:
            while True:
                raw = await stdout.readline()
                if not raw:
                    raise AssertionError(f"consumer exited before {prefix!r}: {self.lines}\n{self.log.read_text()}")
                line = raw.decode().strip()
                self.lines.append(line)
                if line.startswith(prefix):
                    return line.split()

        return await asyncio.wait_for(read(), timeout)

    async def resume(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()

    def send(self, sig: int) -> None:
        try:
            self.process.send_signal(sig)
        except ProcessLookupError:
            pass  # exited already; a cleanup SIGCONT must not hide why the test failed

    async def exit_code(self, timeout: float = 20.0) -> int:
        """Wait for the exit; the rest of stdout joins ``lines``."""
        assert self.process.stdout is not None
        rest = await asyncio.wait_for(self.process.stdout.read(), timeout)
        self.lines.extend(rest.decode().splitlines())
        return await asyncio.wait_for(self.process.wait(), timeout)

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def recovering_app(kafka_bootstrap: str, consumer_db: str, group: str, target: str) -> ConsumerApp:
    """A second member of the same group, in this process, with the same effect."""
    app = ConsumerApp(
        ConsumerConfig(
            group, kafka_bootstrap, consumer_db, session_timeout=2.0, heartbeat_interval=0.4, redelivery_backoff=0.05
        )
    )

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await conn.execute(
            "INSERT INTO effects (occurrence_id, attempt, lease_token) VALUES ($1, $2, $3)",
            occurrence.occurrence_id,
            occurrence.attempt,
            occurrence.lease_token,
        )

    return app


async def state(pool, ident) -> str:
    return (await occurrence_row(pool, ident))["state"]


async def events_of(kafka_bootstrap: str, ident: uuid.UUID) -> list:
    records = await read_topic(kafka_bootstrap, ATTEMPTS_TOPIC, expected=0, settle=0.1)
    return [
        e for e in [e for r in decodable(records, decode_attempt_record) for e in r.events] if e.occurrence_id == ident
    ]


async def test_a_consumer_killed_at_any_handoff_loses_nothing_and_applies_nothing_twice(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path
):
    """SIGKILL before the effect (after_started), after the database commit but before reporting it
    (after_commit), and after reporting it but before the offset commit (after_report): one consumer
    process per kill point, side by side (own target and group each)."""
    await asyncio.gather(
        *(
            killed_at(point, pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path)
            for point in ("after_started", "after_commit", "after_report")
        )
    )


async def killed_at(point, pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path) -> None:
    target = f"test.{uuid.uuid4().hex[:10]}"
    occurrences = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(2)]
    ids = {o.occurrence_id for o in occurrences}
    group = f"crash-{uuid.uuid4().hex[:8]}"
    victim = await ConsumerProcess.start(tmp_path, kafka_bootstrap, consumer_db, group, target, "--pause-at", point)
    try:
        _, _, first, token = await victim.expect(f"AT {point}")
        victim.send(signal.SIGKILL)
        await victim.exit_code()
    finally:
        await victim.kill()
    committed = await effects.fetchval("SELECT count(*) FROM effects WHERE occurrence_id = ANY($1)", list(ids))
    if point == "after_started":
        assert committed == 0, point  # killed before any effect
    else:
        assert 1 <= committed <= 2, point  # killed after one (or both, in flight together) committed

    async with Running(recovering_app(kafka_bootstrap, consumer_db, group, target)) as app:
        # After a kill past the effect, the engine may already know both occurrences SUCCEEDED; the
        # redelivery (the offset was never committed) must still come and be recognised as a duplicate.
        await wait_for(lambda: all_succeeded(pool, ids), timeout=30)
        if point != "after_started":
            await wait_for(lambda: app.stats.duplicates >= 1, timeout=30)
    rows = await effects.fetch("SELECT occurrence_id FROM effects WHERE occurrence_id = ANY($1)", list(ids))
    assert sorted(r["occurrence_id"] for r in rows) == sorted(ids), point  # every one, each exactly once
    killed_attempts = await attempt_rows(pool, uuid.UUID(first))
    if point == "after_started":
        # The redelivery took the same delivery over with a new lease; the dead worker's attempt is fenced.
        assert [a["result"] for a in killed_attempts] == ["fenced", "succeeded"], point
        assert app.stats.applied == 2, point
    else:
        # The effect was the killed worker's: the redelivery found its dedupe row and said so.
        assert [(a["lease_token"], a["result"]) for a in killed_attempts] == [(uuid.UUID(token), "succeeded")]
        assert app.stats.duplicates >= 1, point


async def all_succeeded(pool, ids) -> bool:
    states = await pool.fetch("SELECT state FROM occurrences WHERE occurrence_id = ANY($1)", list(ids))
    return len(states) == len(ids) and all(r["state"] == "SUCCEEDED" for r in states)


async def test_a_worker_paused_past_its_lease_is_fenced_when_it_wakes_and_the_effect_exists_once(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target, tmp_path
):
    """SIGSTOP inside the open transaction (effect and dedupe row uncommitted), the retry runs elsewhere."""
    message = await due_occurrence(pool, "acme", target, clock.now(), base=1.0, cap=1.0)
    group = f"pause-{uuid.uuid4().hex[:8]}"
    paused = await ConsumerProcess.start(
        tmp_path,
        kafka_bootstrap,
        consumer_db,
        group,
        target,
        "--pause-at",
        "before_commit",
        "--lease-ttl",
        "3",
        "--handler-timeout",
        "1",  # the handler itself is instant; the pause is after it, before the commit
        "--idle-timeout",
        "2",
    )
    try:
        _, _, _, token = await paused.expect("AT before_commit")
        paused.send(signal.SIGSTOP)
        paused_at = asyncio.get_running_loop().time()
        stale = uuid.UUID(token)
        await wait_for(lambda: state(pool, message.occurrence_id), timeout=10)
        await wait_for(
            lambda: pool.fetchval(
                "SELECT lease_token = $2 FROM occurrences WHERE occurrence_id = $1", message.occurrence_id, stale
            )
        )

        clock.advance(timedelta(seconds=4))  # past the 3 s lease: the reaper retries it
        await wait_for(lambda: pool.fetchval("SELECT count(*) FROM attempts WHERE result = 'timed_out'"))
        clock.advance(timedelta(seconds=1))  # past the retry's backoff: the relay publishes attempt 2

        # The retry elsewhere: blocked on the paused worker's dedupe row lock until PostgreSQL ends that
        # idle transaction (idle_in_transaction_session_timeout, tied to the lease), then it proceeds.
        async with Running(recovering_app(kafka_bootstrap, consumer_db, group, target)):
            await wait_for(lambda: all_succeeded(pool, {message.occurrence_id}), timeout=30)

        # The premise: the worker slept past its 3 s lease by its own clock too (monotonic time runs on
        # under SIGSTOP), so on waking it knows the lease is lost. The steps above take less than that
        # when the retry's group join is quick (about 0.1 s on Apache Kafka, 1 s on tansu): the worker
        # then reports its ended session as a transient failure, fenced all the same.
        await asyncio.sleep(max(0.0, paused_at + 3.5 - asyncio.get_running_loop().time()))
        paused.send(signal.SIGCONT)
        await paused.resume()  # it commits late: its transaction is gone
        late = await wait_for(lambda: late_report(kafka_bootstrap, message.occurrence_id, stale), timeout=20)
        assert (late.event, late.error_class) == ("failed", "LeaseExpired")
        await asyncio.sleep(0.5)  # the engine reads it and rejects it
    finally:
        paused.send(signal.SIGCONT)
        await paused.kill()

    assert await effects.fetchval("SELECT count(*) FROM effects") == 1  # the effect exists once
    assert await effects.fetchval("SELECT lease_token FROM effects") != stale  # and not from the paused worker
    row = await occurrence_row(pool, message.occurrence_id)
    assert row["state"] == "SUCCEEDED"
    (first, *_) = await attempt_rows(pool, message.occurrence_id)
    assert (first["lease_token"], first["result"]) == (stale, "timed_out")  # the late failure changed nothing


async def late_report(kafka_bootstrap, ident, token):
    for event in await events_of(kafka_bootstrap, ident):
        if event.lease_token == token and event.event in ("succeeded", "failed"):
            return event
    return None


async def test_sigterm_finishes_the_running_handler_and_a_second_sigterm_aborts(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path
):
    await asyncio.gather(
        graceful_stop(pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path),
        aborted_stop(pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path),
    )


async def graceful_stop(pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path) -> None:
    target, group = f"test.{uuid.uuid4().hex[:10]}", f"term-{uuid.uuid4().hex[:8]}"
    occurrence = await due_occurrence(pool, "acme", target, clock.now())
    consumer = await ConsumerProcess.start(
        tmp_path, kafka_bootstrap, consumer_db, group, target, "--handler-seconds", "1.5"
    )
    try:
        await consumer.expect("HANDLER")
        consumer.send(signal.SIGTERM)  # stop fetching, finish the handler, commit, leave
        await consumer.expect("HANDLER_DONE")
        assert await consumer.exit_code() == 0
        assert any(line.startswith("RESULT applied=1") for line in consumer.lines), consumer.lines
    finally:
        await consumer.kill()
    await wait_for(lambda: all_succeeded(pool, {occurrence.occurrence_id}))
    assert (
        await effects.fetchval("SELECT count(*) FROM effects WHERE occurrence_id = $1", occurrence.occurrence_id) == 1
    )


async def aborted_stop(pool, clock, kafka_bootstrap, consumer_db, effects, tmp_path) -> None:
    target, group = f"test.{uuid.uuid4().hex[:10]}", f"term-{uuid.uuid4().hex[:8]}"
    occurrence = await due_occurrence(pool, "acme", target, clock.now())
    consumer = await ConsumerProcess.start(
        tmp_path, kafka_bootstrap, consumer_db, group, target, "--handler-seconds", "60"
    )
    try:
        await consumer.expect("HANDLER")
        consumer.send(signal.SIGTERM)
        await asyncio.sleep(0.3)
        consumer.send(signal.SIGTERM)  # the second one aborts: no waiting for 60 s
        assert await consumer.exit_code(timeout=10) == 0
    finally:
        await consumer.kill()
    # Rolled back and not acknowledged: the occurrence is not lost, the next member applies it once.
    assert (
        await effects.fetchval("SELECT count(*) FROM effects WHERE occurrence_id = $1", occurrence.occurrence_id) == 0
    )
    async with Running(recovering_app(kafka_bootstrap, consumer_db, group, target)):
        await wait_for(lambda: all_succeeded(pool, {occurrence.occurrence_id}), timeout=30)
    assert (
        await effects.fetchval("SELECT count(*) FROM effects WHERE occurrence_id = $1", occurrence.occurrence_id) == 1
    )


async def test_skip_if_running_skips_while_a_slow_handler_runs_and_never_runs_two(
    engine_db, pool, clock, kafka_bootstrap, consumer_db, target, acme
):
    config = fast_services(materializer=MaterializerConfig(horizon=timedelta(seconds=1), idle_interval=0.05))
    schedule = await ControlPlane(pool, clock).create_schedule(
        "acme", {"kind": "rate", "expression": "1s", "target": target, "overlap_policy": "skip_if_running"}
    )
    running, most, release = set(), [0], asyncio.Event()
    app = ConsumerApp(
        ConsumerConfig(
            f"overlap-{uuid.uuid4().hex[:8]}", kafka_bootstrap, consumer_db, session_timeout=2.0, heartbeat_interval=0.4
        )
    )

    @app.handler(target, concurrency=8)  # the runtime would run several at once: the policy must prevent it
    async def slow(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        running.add(occurrence.occurrence_id)
        most[0] = max(most[0], len(running))
        await release.wait()
        running.discard(occurrence.occurrence_id)

    stop = asyncio.Event()
    services = asyncio.create_task(run_services(engine_db, kafka_bootstrap, stop, config, clock))
    consumer = asyncio.create_task(app.run(stop))

    async def count(state: str, expected: int) -> bool:
        return (
            await pool.fetchval(
                "SELECT count(*) FROM occurrences WHERE schedule_id = $1::uuid AND state = $2",
                schedule["schedule_id"],
                state,
            )
            == expected
        )

    try:
        clock.advance(1)
        await wait_for(lambda: len(running) == 1, timeout=30)  # the first one runs, slower than 1 s
        for _ in range(3):
            clock.advance(1)
        await wait_for(lambda: count("SKIPPED_OVERLAP", 3))
        release.set()
        await wait_for(lambda: count("SUCCEEDED", 1))
        clock.advance(1)  # nothing in flight: the next one runs
        await wait_for(lambda: count("SUCCEEDED", 2))
    finally:
        release.set()
        stop.set()
        await asyncio.gather(services, consumer)
    assert most[0] == 1 and app.stats.applied == 2
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM occurrences WHERE schedule_id = $1::uuid AND dispatched_at IS NOT NULL",
            schedule["schedule_id"],
        )
        == 2
    )

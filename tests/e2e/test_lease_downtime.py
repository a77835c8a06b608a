"""Leases across engine downtime, on the real stack: `chronoq engine` in its own process, a consumer app
in this one, the database's clock (production's), short lease ttl.

Why: issue 11, "False DEAD after an engine restart". On the old reaper (expiry judged by when the engine
*processed* heartbeats) an engine frozen 75 s while a heartbeating handler ran with ``max_attempts=1``
ended DEAD with a dead letter. The reaper now judges leases only up to the attempt processor's applied
progress (``attempt_event_progress``), so the heartbeats sent while the engine was away are read first.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from datetime import datetime, timedelta

import asyncpg
import pytest

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.loops.service import Role
from schemas.topics import DEAD_LETTER_TOPIC
from tests.support.engine_process import start_engine, stop_engine
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row
from tests.support.services import Running, fast_services, services_running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

#: Twice this is longer than the engine's attempt-group session (10 s): on waking, or restarted, the
#: engine also rejoins its group, a rebalance on top of the downtime.
LEASE_TTL = 6.0


@pytest.mark.parametrize("downtime", ["sigstop", "restart"])
async def test_an_engine_away_for_twice_the_lease_ttl_times_out_no_heartbeating_handler(
    downtime, engine_db, pool, kafka_bootstrap, consumer_db, effects, target, acme, tmp_path
):
    """The engine process (attempt processor, reaper, ...) is frozen with SIGSTOP, or terminated and
    started again, for twice the lease ttl while a handler heartbeats; it comes back to a lease that looks
    expired by the database clock and an attempt group that must rejoin. max_attempts=1: one false timeout
    would be DEAD plus a dead letter. Promised: the handler's success is recorded, no retry is spent, no
    dead letter appears, the effect exists once."""
    now = await pool.fetchval("SELECT now()")
    message = await due_occurrence(pool, "acme", target, now, max_attempts=1)
    release, handling = asyncio.Event(), asyncio.Event()
    app = ConsumerApp(
        ConsumerConfig(
            f"downtime-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            lease_ttl=LEASE_TTL,
            handler_timeout=120.0,
            transaction_idle_timeout=150.0,  # explicit: only the engine's judgement of the lease is tested
        )
    )

    @app.handler(target)
    async def slow(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        handling.set()
        await release.wait()
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)

    log = tmp_path / "engine.log"
    engine = await start_engine(engine_db, kafka_bootstrap, log)
    relay = fast_services(roles=frozenset({Role.RELAY}))  # the relay stays up: only the engine is away
    try:
        async with services_running(engine_db, kafka_bootstrap, relay), Running(app):
            await wait_for(lambda: state_is(pool, message.occurrence_id, "RUNNING"), timeout=60)
            # The handler runs once the engine answered `started` (the barrier): away only after that.
            await wait_for(handling.wait, timeout=60)
            if downtime == "sigstop":
                engine.send_signal(signal.SIGSTOP)
            else:
                engine.send_signal(signal.SIGTERM)
                await asyncio.wait_for(engine.wait(), 30)
            away_at = await pool.fetchval("SELECT now()")
            await wait_for(lambda: database_clock_past(pool, away_at + timedelta(seconds=2 * LEASE_TTL)), 30)
            row = await occurrence_row(pool, message.occurrence_id)
            assert row["state"] == "RUNNING"
            assert row["lease_expires_at"] < await pool.fetchval("SELECT now()")  # it looks expired
            if downtime == "sigstop":
                engine.send_signal(signal.SIGCONT)
            else:
                engine = await start_engine(engine_db, kafka_bootstrap, log)
            back_at = await pool.fetchval("SELECT now()")
            # The heartbeats sent meanwhile are applied and the lease is renewed, never timed out first.
            await wait_for(lambda: renewed_after(pool, message.occurrence_id, back_at), timeout=60)
            release.set()
            await wait_for(lambda: state_is(pool, message.occurrence_id, "SUCCEEDED"), timeout=30)
    finally:
        await stop_engine(engine)
    attempts = await attempt_rows(pool, message.occurrence_id)
    # One attempt number: a `started` the engine answered too late for the consumer's barrier (a loaded
    # machine, an engine still starting) is rolled back and retried in place, recorded, not a spent retry.
    assert {a["attempt_number"] for a in attempts} == {1}
    assert attempts[-1]["result"] == "succeeded"
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE topic = $1", DEAD_LETTER_TOPIC) == 0
    assert await pool.fetchval("SELECT count(*) FROM tenant_retry_usage") == 0
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1


async def state_is(pool: asyncpg.Pool, ident: uuid.UUID, state: str) -> bool:
    return (await occurrence_row(pool, ident))["state"] == state


async def database_clock_past(pool: asyncpg.Pool, instant: datetime) -> bool:
    return bool(await pool.fetchval("SELECT now() > $1", instant))


async def renewed_after(pool: asyncpg.Pool, ident: uuid.UUID, instant: datetime) -> bool:
    row = await occurrence_row(pool, ident)
    if row["state"] != "RUNNING":
        attempts = [(a["result"], a["error_class"]) for a in await attempt_rows(pool, ident)]
        raise AssertionError(f"the occurrence went {row['state']} while its handler was heartbeating: {attempts}")
    return bool(row["lease_expires_at"] > instant + timedelta(seconds=1))

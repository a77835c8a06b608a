"""The schedule lifecycle as a new user drives it over HTTP, observed at the consumer."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
import pytest

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.api.server import bind
from engine.client import ChronoqClient
from engine.loops.service import PIPELINE_ROLES, Role, run_services
from tests.support.services import fast_services
from tests.support.waiting import wait_for


@pytest.fixture
async def stack(engine_db, pool, consumer_db, kafka_bootstrap, clock, acme, target):
    """Engine, relay and API on the test clock, plus a consumer recording what it applies."""
    stop = asyncio.Event()
    sock = bind("127.0.0.1", 0)
    services = asyncio.create_task(
        run_services(
            engine_db, kafka_bootstrap, stop, fast_services(roles=PIPELINE_ROLES | {Role.API}, api_socket=sock), clock
        )
    )
    applied: list[Occurrence] = []
    app = ConsumerApp(
        ConsumerConfig(
            f"life-{uuid.uuid4().hex[:8]}", kafka_bootstrap, consumer_db, session_timeout=2.0, heartbeat_interval=0.4
        )
    )

    @app.handler(target)
    async def record(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        applied.append(occurrence)

    consumer = asyncio.create_task(app.run(stop))
    client = ChronoqClient(f"http://127.0.0.1:{sock.getsockname()[1]}", acme.api_token)
    yield client, applied
    stop.set()
    await asyncio.gather(services, consumer)


async def succeeded(pool, occurrence: Occurrence) -> bool:
    return (
        await pool.fetchval("SELECT state FROM occurrences WHERE occurrence_id = $1", occurrence.occurrence_id)
        == "SUCCEEDED"
    )


async def settle(pool, seconds: float = 1.0) -> None:
    """Let the loops run a few passes at the current clock instant."""
    await asyncio.sleep(seconds)


async def test_create_update_pause_resume_cancel_as_seen_by_a_consumer(stack, pool, clock, target):
    client, applied = stack
    body = {
        "kind": "cron",
        "expression": "* * * * *",
        "target": target,
        "payload": {"plan": "basic"},
        "misfire_policy": "skip",
        "max_lateness": "20s",
    }
    schedule = await client.create_schedule(body, idempotency_key="life-1")
    assert (await client.create_schedule(body, idempotency_key="life-1"))["schedule_id"] == schedule["schedule_id"]
    sid = schedule["schedule_id"]

    clock.advance(timedelta(seconds=45))  # 10:00:45: v1 @ 10:01 materialized
    await wait_for(lambda: pool.fetchval("SELECT count(*) FROM occurrences WHERE schedule_version = 1"))
    updated = await client.update_schedule(sid, {"payload": {"plan": "pro"}})
    assert updated["version"] == 2 and updated["canceled_occurrences"] == 1

    clock.advance(timedelta(seconds=15))  # 10:01: v2 @ 10:01 is due
    await wait_for(lambda: len(applied) == 1)
    assert (applied[0].schedule_version, applied[0].payload) == (2, {"plan": "pro"})
    await wait_for(lambda: succeeded(pool, applied[0]))  # the consumer's report reached the engine

    await client.pause_schedule(sid)
    clock.advance(timedelta(minutes=3))  # 10:04: three fires while paused
    await settle(pool)
    assert len(applied) == 1

    await client.resume_schedule(sid)  # skip: the paused fires are MISSED
    clock.advance(timedelta(seconds=60))  # 10:05 fires
    await wait_for(lambda: len(applied) == 2)
    assert applied[1].scheduled_for.minute == 5 and applied[1].schedule_version == 4
    await wait_for(lambda: succeeded(pool, applied[1]))

    await client.cancel_schedule(sid)
    clock.advance(timedelta(minutes=3))
    await settle(pool)
    assert len(applied) == 2
    occurrences = (await client.list_occurrences(sid))["items"]
    states = [(o["schedule_version"], o["state"]) for o in occurrences]
    assert sorted(states) == [
        (1, "CANCELED"),
        (2, "SUCCEEDED"),
        (4, "MISSED"),
        (4, "MISSED"),
        (4, "MISSED"),
        (4, "SUCCEEDED"),
    ]  # v1 never published, never consumed
    assert (await client.get_schedule(sid))["state"] == "canceled"
    assert len({o.occurrence_id for o in applied}) == 2

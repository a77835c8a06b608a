"""Control plane + materializer against real PostgreSQL, with an injected clock."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engine.control.schedules import ControlPlane
from engine.loops.materializer import Materializer, MaterializerConfig, MaterializerHooks
from schemas import observability as obs
from schemas.errors import Conflict, InvalidInput
from schemas.identity import occurrence_id
from schemas.messages import decode_occurrence
from tests.support.telemetry import Telemetry

UTC = UTC


@pytest.fixture(autouse=True)
async def tenants(pool):
    from engine.control.tenants import create_tenant

    for name in ("acme", "globex"):
        await create_tenant(pool, name)


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 29, hour, minute, second, tzinfo=UTC)


async def occurrences(pool, schedule_id):
    return await pool.fetch("SELECT * FROM occurrences WHERE schedule_id = $1 ORDER BY scheduled_for", schedule_id)


async def test_a_cron_schedule_yields_consecutive_occurrences_with_distinct_ids(pool, clock, target):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        "acme", {"kind": "cron", "expression": "* * * * *", "target": target, "payload": {"k": 1}}
    )
    assert schedule["next_run_at"] == "2026-11-29T10:01:00Z" and schedule["version"] == 1
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)

    assert (await materializer.run_once()).schedules == 0  # 10:01 is beyond the horizon
    for minute in (1, 2, 3):
        clock.set(at(10, minute) - timedelta(seconds=20))  # within the 30 s horizon
        assert (await materializer.run_once()).occurrences == 1

    rows = await occurrences(pool, schedule["schedule_id"])
    assert [r["scheduled_for"] for r in rows] == [at(10, 1), at(10, 2), at(10, 3)]
    assert len({r["occurrence_id"] for r in rows}) == 3
    for row in rows:
        assert row["occurrence_id"] == occurrence_id(row["schedule_id"], 1, row["scheduled_for"])
        assert row["state"] == "SCHEDULED" and row["available_at"] == row["scheduled_for"]
    outbox = await pool.fetch("SELECT message FROM outbox WHERE occurrence_id IS NOT NULL ORDER BY scheduled_for")
    assert [decode_occurrence(r["message"]).scheduled_for for r in outbox] == [at(10, 1), at(10, 2), at(10, 3)]
    assert decode_occurrence(outbox[0]["message"]).payload == {"k": 1}
    assert await pool.fetchval("SELECT next_run_at FROM schedules_effective") == at(10, 4)


def checked_inserts(telemetry: Telemetry) -> list[bool]:
    """Per pass that wrote, whether its statement ran checked (after the unchecked one was refused)."""
    attributes = [dict(span.attributes or {}) for span in telemetry.spans(obs.SPAN_MATERIALIZE)]
    return [bool(a["chronoq.checked_insert"]) for a in attributes if "chronoq.checked_insert" in a]


async def test_overlapping_materializers_never_duplicate_an_occurrence(pool, clock, target):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", {"kind": "cron", "expression": "* * * * *", "target": target})
    telemetry = Telemetry()
    config = MaterializerConfig(horizon=timedelta(seconds=30))
    materializer = Materializer(pool, config, clock, **telemetry.instruments("engine"))
    clock.set(at(10, 0, 45))
    assert (await materializer.run_once()).occurrences == 1
    # An old node that read the schedule before the cursor moved replays the same fire.
    # (the schedule shares its cohort's cursor, migration 0026: the cohort is what moves back)
    await pool.execute("UPDATE schedule_cohorts SET next_run_at = $1", at(10, 1))
    # A schedule created meanwhile, due at the same fire, is in the same pass.
    other = await control.create_schedule("acme", {"kind": "cron", "expression": "* * * * *", "target": target})
    report = await materializer.run_once()
    assert (report.schedules, report.occurrences, report.conflicts) == (2, 1, 1)
    # The first pass's statement ran unchecked; the second one's was refused (the replayed occurrence
    # exists) and ran again checked: the existing occurrence is left alone, the new one is written.
    assert checked_inserts(telemetry) == [False, True]
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE occurrence_id IS NOT NULL") == 2
    assert len(await occurrences(pool, schedule["schedule_id"])) == 1
    assert [r["state"] for r in await occurrences(pool, other["schedule_id"])] == ["SCHEDULED"]
    assert await pool.fetchval("SELECT count(DISTINCT next_run_at) FROM schedules_effective") == 1
    assert (await materializer.run_once()).schedules == 0  # both cursors moved on


async def test_a_one_time_schedule_fires_once_then_completes(pool, clock, target):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        "acme", {"kind": "once", "expression": "2026-11-29T10:00:05Z", "target": target}
    )
    materializer = Materializer(pool, MaterializerConfig(), clock)
    assert (await materializer.run_once()).occurrences == 1
    clock.advance(timedelta(hours=1))
    assert (await materializer.run_once()).schedules == 0
    stored = await control.get_schedule("acme", schedule["schedule_id"])
    assert stored["state"] == "completed" and stored["next_run_at"] is None


@pytest.mark.parametrize(
    "policy, enqueued, missed",
    [
        ("skip", 0, 60),
        ("fire_once", 1, 59),
        ("catch_up:5", 5, 55),
    ],
)
async def test_an_outage_is_resolved_by_the_misfire_policy_from_the_durable_cursor(
    pool, clock, target, policy, enqueued, missed
):
    control = ControlPlane(pool, clock)
    await control.create_schedule(
        "acme",
        {"kind": "cron", "expression": "* * * * *", "target": target, "misfire_policy": policy, "max_lateness": "30s"},
    )
    clock.set(at(11, 0, 40))  # the engine was down from 10:00 to 11:00:40: 60 fires are late
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(0)), clock)
    report = await materializer.run_once()
    states = await pool.fetch("SELECT state, count(*) FROM occurrences GROUP BY state")
    assert dict(states) == {k: v for k, v in {"SCHEDULED": enqueued, "MISSED": missed}.items() if v}
    assert report.missed == missed
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE occurrence_id IS NOT NULL") == enqueued
    assert await pool.fetchval("SELECT next_run_at FROM schedules_effective") == at(11, 1)


async def test_idempotent_create_returns_the_same_schedule_and_rejects_a_different_body(pool, clock, target):
    control = ControlPlane(pool, clock)
    body = {"kind": "cron", "expression": "0 9 * * *", "time_zone": "Asia/Tokyo", "target": target}
    first = await control.create_schedule("acme", body, "key-1")
    again = await control.create_schedule("acme", body, "key-1")
    assert again == first
    with pytest.raises(Conflict):
        await control.create_schedule("acme", {**body, "expression": "0 10 * * *"}, "key-1")
    # Keys are scoped by tenant (the target too: each tenant schedules onto its own).
    other_tenant = await control.create_schedule("globex", {**body, "target": f"{target}.globex"}, "key-1")
    assert other_tenant["schedule_id"] != first["schedule_id"]
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 2


async def test_rejected_requests_write_nothing(pool, clock, target):
    control = ControlPlane(pool, clock)
    for bad in (
        {"kind": "cron", "expression": "0 0 30 2 *", "target": target},
        {"kind": "cron", "expression": "0 9 * * *", "time_zone": "Nowhere/City", "target": target},
        {"kind": "once", "expression": "2020-01-01T00:00:00Z", "target": target},
    ):
        with pytest.raises(InvalidInput):
            await control.create_schedule("acme", bad)
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 0


async def test_flexible_schedules_get_deterministic_jitter_inside_the_window(pool, clock, target):
    control = ControlPlane(pool, clock)
    await control.create_schedule(
        "acme",
        {
            "kind": "cron",
            "expression": "*/5 * * * *",
            "target": target,
            "priority": "flexible",
            "flexible_window": "5m",
        },
    )
    clock.set(at(10, 4, 50))
    await Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock).run_once()
    row = await pool.fetchrow("SELECT * FROM occurrences")
    offset = row["available_at"] - row["scheduled_for"]
    assert timedelta(0) <= offset < timedelta(minutes=5)
    from engine.rules.timing import jitter_offset

    assert offset == jitter_offset(row["occurrence_id"], timedelta(minutes=5))


@pytest.mark.parametrize("racer", ["commits", "rolls back"])
async def test_an_occurrence_inserted_by_a_racing_transaction_is_waited_for_and_never_doubled(
    pool, clock, target, racer
):
    """Another writer (a backfill's id, the pass's slot) inserts an occurrence of the slot the pass materializes,
    and ends its transaction only once the pass's statement waits for it: if it commits, the unchecked statement
    is refused and the checked one leaves its occurrence alone; if it rolls back, the unchecked statement writes
    the pass's own."""
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", {"kind": "cron", "expression": "* * * * *", "target": target})
    clock.set(at(10, 0, 45))
    ident, racer_ident = occurrence_id(schedule["schedule_id"], 1, at(10, 1)), uuid.uuid4()
    async with pool.acquire() as racer_conn:
        racing = racer_conn.transaction()

        async def insert_meanwhile() -> None:
            await racing.start()
            await racer_conn.execute(
                "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target,"
                " scheduled_for, available_at, origin) VALUES ($1, $2::uuid, 1, 'acme', $3, $4, $4, 'backfill')",
                racer_ident, schedule["schedule_id"], target, at(10, 1),
            )  # fmt: skip

        telemetry = Telemetry()
        config = MaterializerConfig(horizon=timedelta(seconds=30))
        hooks = MaterializerHooks(after_read=insert_meanwhile)
        materializer = Materializer(pool, config, clock, hooks=hooks, **telemetry.instruments("engine"))
        passing = asyncio.create_task(materializer.run_once())
        racer_pid = racer_conn.get_server_pid()
        while not await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", racer_pid
        ):
            assert not passing.done(), passing
            await asyncio.sleep(0.01)  # polling the server for the pass's wait, not waiting for the clock
        await (racing.commit() if racer == "commits" else racing.rollback())
        report = await passing

    rows = await occurrences(pool, schedule["schedule_id"])
    outbox = await pool.fetchval("SELECT count(*) FROM outbox WHERE occurrence_id IS NOT NULL")
    if racer == "commits":
        assert (report.occurrences, report.conflicts, checked_inserts(telemetry)) == (0, 1, [True])
        assert [(r["occurrence_id"], r["origin"]) for r in rows] == [(racer_ident, "backfill")] and outbox == 0
    else:
        assert (report.occurrences, report.conflicts, checked_inserts(telemetry)) == (1, 0, [False])
        assert [(r["occurrence_id"], r["origin"]) for r in rows] == [(ident, "schedule")] and outbox == 1
    assert await pool.fetchval("SELECT next_run_at FROM schedules_effective") == at(10, 2)

"""One row per (schedule, version, instant): what the primary key enforces since engine migration 0023.

The slot's per-version uniqueness has no index of its own: every occurrence that is not manual carries the id
uuid5(schedule, version, instant), so a second row of the same triple has the same primary key
(occurrence_id, scheduled_for). These tests pin both halves: every writer of slot occurrences (the
materializer on time and after an outage, an update's re-materialization, a backfill) gives the derived id,
and a second write of a triple — even after its slot was released by a newer version — writes nothing.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from engine.control.requested_occurrences import RequestedOccurrences
from engine.control.schedules import ControlPlane
from engine.loops.materializer import Materializer, MaterializerConfig
from schemas.identity import is_slot_occurrence

MINUTELY = {"kind": "cron", "expression": "* * * * *", "target": "demo.minutely", "misfire_policy": "skip"}
T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


async def test_every_writer_of_slot_occurrences_gives_the_derived_id(pool, acme, clock):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", MINUTELY)
    clock.advance(timedelta(minutes=5, seconds=30))  # an outage: MISSED slots, then one on time
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(minutes=2)), clock)
    await materializer.run_once()
    await control.update_schedule("acme", schedule["schedule_id"], {"payload": {"v": 2}})  # version 2
    await materializer.run_once()
    requested = RequestedOccurrences(pool, clock)
    await requested.backfill("acme", schedule["schedule_id"], T0, T0 + timedelta(minutes=4), "tenant:acme")
    await requested.trigger_now("acme", schedule["schedule_id"], "tenant:acme")

    rows = await pool.fetch(
        "SELECT occurrence_id, schedule_id, schedule_version, scheduled_for, origin, state FROM occurrences"
    )
    assert {r["origin"] for r in rows} == {"schedule", "backfill", "manual"}
    assert {r["schedule_version"] for r in rows if r["origin"] == "schedule"} == {1, 2}
    assert "MISSED" in {r["state"] for r in rows}
    for row in rows:
        derived = is_slot_occurrence(
            row["occurrence_id"], row["schedule_id"], row["schedule_version"], row["scheduled_for"]
        )
        assert derived == (row["origin"] != "manual"), dict(row)


async def test_a_released_slot_of_a_version_is_never_written_again(pool, acme, clock):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", MINUTELY)
    await Materializer(pool, MaterializerConfig(horizon=timedelta(minutes=3)), clock).run_once()
    ahead = await pool.fetch(
        "SELECT occurrence_id FROM occurrences WHERE schedule_id = $1 AND schedule_version = 1",
        schedule["schedule_id"],
    )
    assert ahead
    await control.update_schedule("acme", schedule["schedule_id"], {"payload": {"v": 2}})
    released = await pool.fetch(
        "SELECT occurrence_id FROM occurrences WHERE schedule_version = 1 AND slot_released_at IS NOT NULL"
    )
    assert {r["occurrence_id"] for r in released} == {r["occurrence_id"] for r in ahead}

    # A node that planned version 1 before the update (paused, or behind on its lease) writes its plan late:
    # the same rows, the same ids. The database keeps the first of each and writes nothing.
    written = await pool.fetchval(
        """WITH again AS (INSERT INTO occurrences
                          SELECT * FROM occurrences WHERE schedule_version = 1
                          ON CONFLICT DO NOTHING RETURNING 1)
           SELECT count(*) FROM again"""
    )
    assert written == 0
    per_triple = await pool.fetchval(
        """SELECT max(n) FROM (SELECT count(*) AS n FROM occurrences
                               GROUP BY schedule_id, schedule_version, scheduled_for) t"""
    )
    assert per_triple == 1


async def _insert(pool, schedule_id, version: int, origin: str = "schedule", released: bool = False) -> None:
    await pool.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, origin, slot_released_at) VALUES (gen_random_uuid(), $1, $2, 'acme', 'demo.t', $3::timestamptz,"
        " $3::timestamptz, $4, CASE WHEN $5::boolean THEN $3::timestamptz END)",
        schedule_id, version, T0, origin, released,
    )  # fmt: skip


async def test_one_index_keeps_one_holder_per_slot_and_serves_a_schedules_reads(pool, acme):
    """Migration 0028's occurrences_slot: a second holder of a (schedule, instant) is refused; a released or
    manual row of the same instant is not; and a schedule's reads find every row through it."""
    schedule_id = uuid.uuid4()
    await _insert(pool, schedule_id, 1)
    with pytest.raises(asyncpg.UniqueViolationError, match="occurrences"):
        await _insert(pool, schedule_id, 2)
    await _insert(pool, schedule_id, 2, origin="manual")
    await _insert(pool, schedule_id, 3, released=True)
    await pool.execute(
        "UPDATE occurrences SET slot_released_at = $2 WHERE schedule_id = $1 AND schedule_version = 1", schedule_id, T0
    )
    await _insert(pool, schedule_id, 4)  # the slot was given up: a newer version may hold it
    with pytest.raises(asyncpg.UniqueViolationError):
        await _insert(pool, schedule_id, 5)
    await _insert(pool, uuid.uuid4(), 1)  # another schedule's slot at the same instant

    read = "SELECT schedule_version FROM occurrences WHERE schedule_id = $1 ORDER BY scheduled_for, schedule_version"
    assert [r["schedule_version"] for r in await pool.fetch(read, schedule_id)] == [1, 2, 3, 4]
    async with pool.acquire() as conn:
        await conn.execute("SET enable_seqscan = off")  # a tiny table: ask which index the planner would take
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + read, schedule_id))
        await conn.execute("RESET enable_seqscan")
    assert "occurrences_slot" in plan or "schedule_id_scheduled_for" in plan, plan

"""Schedule cohorts (migration 0026) against real PostgreSQL, with an injected clock: members share one
cursor, their rows are never written by a pass, and every change of a member, racing a pass or not, leaves
no occurrence of an old version and loses no slot."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engine.control.schedule_batches import BatchItem, ScheduleBatches
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.materializer import Materializer, MaterializerConfig, MaterializerHooks
from schemas import observability as obs
from schemas.identity import occurrence_id

HORIZON = timedelta(seconds=30)
BATCH = 100_000  # every due cohort of a test in one pass


pytestmark = pytest.mark.usefixtures("acme")


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 29, hour, minute, second, tzinfo=UTC)


def every_minute(target: str, **extra) -> dict:
    return {"kind": "cron", "expression": "* * * * *", "target": target, "payload": {"k": 1}, **extra}


def materializer_of(pool, clock, **extra) -> Materializer:
    """A materializer without shard leases taking every due cohort of a test in one pass."""
    return Materializer(pool, MaterializerConfig(horizon=HORIZON, batch_size=BATCH), clock, **extra)


async def create_many(control: ControlPlane, tenant: str, count: int, definition: dict) -> list[uuid.UUID]:
    """``count`` schedules of one definition in one batch (enough of them that shards hold several)."""
    results = await ScheduleBatches(control).create_schedules(
        tenant, [BatchItem(f"{tenant}-{uuid.uuid4().hex}", dict(definition)) for _ in range(count)]
    )
    assert all(r["status"] == 201 for r in results), results[:3]
    return [uuid.UUID(r["schedule"]["schedule_id"]) for r in results]


async def materialize_minute(materializer: Materializer, clock, minute: int) -> None:
    """Move the clock to 20 s before 10:``minute`` and materialize until nothing is due."""
    clock.set(at(10, minute) - timedelta(seconds=20))
    while (await materializer.run_once()).schedules:
        pass


async def live_occurrences(pool, schedule_id: uuid.UUID) -> list:
    return await pool.fetch(
        "SELECT scheduled_for, schedule_version, state, occurrence_id FROM occurrences"
        " WHERE schedule_id = $1 AND state NOT IN ('CANCELED') ORDER BY scheduled_for",
        schedule_id,
    )


async def test_schedules_that_fire_alike_share_one_cursor_and_their_rows_are_not_written(pool, clock, target):
    control = ControlPlane(pool, clock)
    ids = await create_many(control, "acme", 300, every_minute(target))
    cohorts = await pool.fetch("SELECT cohort_id, shard, members, next_run_at FROM schedule_cohorts")
    members = await pool.fetch("SELECT schedule_id, shard, cohort_id, xmin::text AS xmin FROM schedules")
    assert all(m["cohort_id"] is not None for m in members)
    # One cohort per shard the 300 landed in (one tenant, one spec, one first fire): fewer cohorts than schedules.
    assert len(cohorts) == len({m["shard"] for m in members}) < 300
    assert sum(c["members"] for c in cohorts) == 300 and {c["next_run_at"] for c in cohorts} == {at(10, 1)}

    materializer = materializer_of(pool, clock)
    for minute in (1, 2):
        await materialize_minute(materializer, clock, minute)

    for schedule_id in ids:
        rows = await live_occurrences(pool, schedule_id)
        assert [(r["scheduled_for"], r["schedule_version"]) for r in rows] == [(at(10, 1), 1), (at(10, 2), 1)]
        assert all(r["occurrence_id"] == occurrence_id(schedule_id, 1, r["scheduled_for"]) for r in rows)
    # The members' rows were never written: the cohorts moved instead.
    after = {
        r["schedule_id"]: r["xmin"] for r in await pool.fetch("SELECT schedule_id, xmin::text AS xmin FROM schedules")
    }
    assert after == {m["schedule_id"]: m["xmin"] for m in members}
    assert {r["next_run_at"] for r in await pool.fetch("SELECT next_run_at FROM schedule_cohorts")} == {at(10, 3)}
    # What the API shows is what the schedule would show alone.
    shown = await control.get_schedule("acme", ids[0])
    assert shown["next_run_at"] == "2026-11-29T10:03:00Z" and shown["runs"] == 2
    listed = await control.list_schedules("acme")
    assert {item["next_run_at"] for item in listed.items} == {"2026-11-29T10:03:00Z"}


async def test_only_schedules_judged_alike_share_a_cohort(pool, clock, target):
    control = ControlPlane(pool, clock)
    plain = await control.create_schedule("acme", every_minute(target))
    kept = [
        await control.create_schedule("acme", every_minute(target, max_runs=5)),
        await control.create_schedule("acme", every_minute(target, end_at="2026-11-30T00:00:00Z")),
        await control.create_schedule("acme", every_minute(target, overlap_policy="skip_if_running")),
        await control.create_schedule(
            "acme", {"kind": "once", "expression": "2026-11-29T11:00:00Z", "target": target, "payload": {}}
        ),
    ]
    other_policy = await control.create_schedule("acme", every_minute(target, misfire_policy="skip"))
    await create_tenant(pool, "globex")
    other_tenant = await control.create_schedule("globex", every_minute(f"{target}.globex"))

    async def cohort_of(schedule):
        return await pool.fetchrow(
            "SELECT c.tenant_id, c.spec_key FROM schedules s JOIN schedule_cohorts c USING (cohort_id)"
            " WHERE s.schedule_id = $1",
            uuid.UUID(schedule["schedule_id"]),
        )

    for schedule in kept:
        assert await cohort_of(schedule) is None, schedule
    mine, theirs, other = await cohort_of(plain), await cohort_of(other_tenant), await cohort_of(other_policy)
    assert mine is not None and theirs is not None and other is not None
    assert mine["spec_key"] == theirs["spec_key"] and (mine["tenant_id"], theirs["tenant_id"]) == ("acme", "globex")
    assert other["spec_key"] != mine["spec_key"]


async def test_a_change_committed_before_a_pass_locks_the_cohort_takes_the_schedule_out_of_it(pool, clock, target):
    control = ControlPlane(pool, clock)
    ids = await create_many(control, "acme", 300, every_minute(target))
    changed = ids[0]
    cohort = await pool.fetchval("SELECT cohort_id FROM schedules WHERE schedule_id = $1", changed)
    neighbours = [
        r["schedule_id"]
        for r in await pool.fetch("SELECT schedule_id FROM schedules WHERE cohort_id = $1 AND schedule_id <> $2",
                                  cohort, changed)
    ]  # fmt: skip
    updates: list[dict] = []

    async def update_meanwhile() -> None:
        if not updates:  # the first pass only: it has read which cohorts are due, not yet locked them
            updates.append(await control.update_schedule("acme", changed, {"payload": {"k": 2}}))

    materializer = materializer_of(pool, clock, hooks=MaterializerHooks(after_read=update_meanwhile))
    clock.set(at(10, 1) - timedelta(seconds=20))
    first = await materializer.run_once()
    assert updates and updates[0]["version"] == 2
    # The pass read its members after locking the cohort: the others, not the one that left (its own cursor
    # now; the pass had read the schedules with their own cursors before the change).
    # (a cohort the change left empty is deleted)
    assert first.skipped == 0 and first.dissolved == (0 if neighbours else 1)
    assert await pool.fetchval("SELECT count(*) FROM occurrences WHERE schedule_id = $1", changed) == 0
    for schedule_id in neighbours:
        assert [r["scheduled_for"] for r in await live_occurrences(pool, schedule_id)] == [at(10, 1)]
    while (await materializer.run_once()).schedules:
        pass
    rows = await live_occurrences(pool, changed)
    assert [(r["scheduled_for"], r["schedule_version"]) for r in rows] == [(at(10, 1), 2)]
    for schedule_id in neighbours:
        assert [r["scheduled_for"] for r in await live_occurrences(pool, schedule_id)] == [at(10, 1)]
    # It left its cohort for the change, advanced on its own cursor once, and joined a cohort again there.
    rejoined = await pool.fetchrow(
        "SELECT c.next_run_at, s.runs, s.cohort_base, c.fires"
        " FROM schedules s JOIN schedule_cohorts c USING (cohort_id)"
        " WHERE s.schedule_id = $1",
        changed,
    )
    assert rejoined is not None and rejoined["next_run_at"] == at(10, 2)
    shown = await control.get_schedule("acme", changed)
    assert shown["next_run_at"] == "2026-11-29T10:02:00Z" and shown["runs"] == 1


async def test_a_change_waits_for_a_pass_holding_the_cohort_then_cancels_what_it_wrote(pool, clock, target):
    control = ControlPlane(pool, clock)
    ids = await create_many(control, "acme", 300, every_minute(target))
    changed = ids[0]
    change: list[asyncio.Task] = []

    async def change_while_written() -> None:
        if change:
            return
        change.append(asyncio.ensure_future(control.update_schedule("acme", changed, {"payload": {"k": 2}})))
        # The change waits on the cohort's row, which this pass's statement holds until it commits.
        for _ in range(400):
            waiting = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE '%schedule_cohorts%'"
            )
            if waiting:
                break
            await asyncio.sleep(0.01)
        assert waiting == 1 and not change[0].done()

    materializer = materializer_of(pool, clock, hooks=MaterializerHooks(after_write=change_while_written))
    clock.set(at(10, 1) - timedelta(seconds=20))
    await materializer.run_once()
    updated = await change[0]
    assert updated["version"] == 2 and updated["next_run_at"] == "2026-11-29T10:01:00Z"
    # The pass's version-1 occurrence was never published: the change canceled it and released its slot.
    old = await pool.fetchrow(
        "SELECT state FROM occurrences WHERE occurrence_id = $1", occurrence_id(changed, 1, at(10, 1))
    )
    assert old is not None and old["state"] == "CANCELED"
    while (await materializer.run_once()).schedules:
        pass
    rows = await live_occurrences(pool, changed)
    assert [(r["scheduled_for"], r["schedule_version"]) for r in rows] == [(at(10, 1), 2)]


async def test_a_cohort_that_falls_behind_dissolves_and_its_members_are_judged_as_alone(pool, clock, target, telemetry):
    control = ControlPlane(pool, clock)
    member = await control.create_schedule("acme", every_minute(target))
    alone = await control.create_schedule("acme", every_minute(target, max_runs=1000))  # same firing, own cursor
    materializer = materializer_of(pool, clock, **telemetry.instruments("engine"))
    await materialize_minute(materializer, clock, 1)
    # An outage of ten minutes: the cohort's next fire is long past; fire_once enqueues one, records the rest.
    clock.set(at(10, 11, 10))
    for _ in range(4):
        await materializer.run_once()
    assert await pool.fetchval("SELECT count(*) FROM schedule_cohorts") == 0
    assert (
        await pool.fetchval("SELECT cohort_id FROM schedules WHERE schedule_id = $1", uuid.UUID(member["schedule_id"]))
        is None
    )

    async def history(schedule) -> list[tuple[datetime, str]]:
        rows = await pool.fetch(
            "SELECT scheduled_for, state FROM occurrences WHERE schedule_id = $1 ORDER BY scheduled_for",
            uuid.UUID(schedule["schedule_id"]),
        )
        return [(r["scheduled_for"], r["state"]) for r in rows]

    assert await history(member) == await history(alone)
    counted = {p.attributes["result"]: p.value for p in telemetry.points(obs.COHORTS)}
    assert counted == {"advanced": 1, "dissolved": 1}
    assert (await control.get_schedule("acme", member["schedule_id"]))["runs"] == (
        await control.get_schedule("acme", alone["schedule_id"])
    )["runs"]


async def test_a_member_paused_resumed_updated_and_canceled_behaves_as_a_schedule_alone(pool, clock, target):
    control = ControlPlane(pool, clock)
    member = (await create_many(control, "acme", 300, every_minute(target)))[0]
    twin = uuid.UUID((await control.create_schedule("acme", every_minute(target, max_runs=1000)))["schedule_id"])
    materializer = materializer_of(pool, clock)

    async def alike() -> None:
        views = [await control.get_schedule("acme", s) for s in (member, twin)]
        for field in ("state", "next_run_at", "runs", "version"):
            assert views[0][field] == views[1][field], field
        histories = [
            [(r["scheduled_for"], r["schedule_version"], r["state"]) for r in await pool.fetch(
                "SELECT scheduled_for, schedule_version, state FROM occurrences WHERE schedule_id = $1"
                " ORDER BY scheduled_for, schedule_version", s)]
            for s in (member, twin)
        ]  # fmt: skip
        assert histories[0] == histories[1]

    for minute in (1, 2):
        await materialize_minute(materializer, clock, minute)
    await alike()
    for schedule_id in (member, twin):
        await control.pause_schedule("acme", schedule_id)
    await materialize_minute(materializer, clock, 3)
    await alike()
    clock.set(at(10, 3, 30))
    for schedule_id in (member, twin):
        await control.resume_schedule("acme", schedule_id)
    await materialize_minute(materializer, clock, 4)
    await alike()
    for schedule_id in (member, twin):
        await control.update_schedule("acme", schedule_id, {"payload": {"k": 3}})
    await materialize_minute(materializer, clock, 5)
    await alike()
    for schedule_id in (member, twin):
        await control.cancel_schedule("acme", schedule_id)
    await materialize_minute(materializer, clock, 6)
    await alike()


async def test_an_empty_cohort_is_deleted_at_its_next_due_pass(pool, clock, target):
    control = ControlPlane(pool, clock)
    await create_many(control, "acme", 300, every_minute(target))
    materializer = materializer_of(pool, clock)
    await materialize_minute(materializer, clock, 1)
    lonely = await pool.fetchrow("SELECT cohort_id, members FROM schedule_cohorts ORDER BY members, cohort_id LIMIT 1")
    for row in await pool.fetch("SELECT schedule_id FROM schedules WHERE cohort_id = $1", lonely["cohort_id"]):
        await control.cancel_schedule("acme", row["schedule_id"])
    assert await pool.fetchval("SELECT members FROM schedule_cohorts WHERE cohort_id = $1", lonely["cohort_id"]) == 0
    cohorts = await pool.fetchval("SELECT count(*) FROM schedule_cohorts")
    clock.set(at(10, 2) - timedelta(seconds=20))
    assert (await materializer.run_once()).dissolved == 1
    assert await pool.fetchval("SELECT count(*) FROM schedule_cohorts WHERE cohort_id = $1", lonely["cohort_id"]) == 0
    assert await pool.fetchval("SELECT count(*) FROM schedule_cohorts") == cohorts - 1

"""A tenant's quota usage is a counter kept by triggers on schedules and by the materializer's statement for
its completions (migration 0024), not a count.

Each test attacks one way the counter could part from the truth — a writer that does not go through the
control plane, a change committed behind a fold, two folds at once, a TRUNCATE, a database migrated with
schedules already in it — and compares it with the count the quota check used to make.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import asdict
from datetime import timedelta

import asyncpg
import pytest

from engine.control.quotas import TenantQuotas, current_usage, every_usage, usage_of
from engine.control.schedule_batches import BatchItem, ScheduleBatches
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.tenant_usage_folds import TenantUsageFolds
from schemas import observability as obs
from schemas.errors import NotFound, QuotaExceeded
from schemas.migrations import apply_migrations
from schemas.queries import QUERIES
from tests.integration.test_target_migration import apply_up_to
from tests.support.databases import create_database, drop_database

TENANTS = ("acme", "globex")
ROOM = TenantQuotas(max_active_schedules=10_000, max_fires_per_minute=1e9)
SHAPES = (
    {"kind": "cron", "expression": "0 * * * *", "time_zone": "Europe/Berlin"},
    {"kind": "cron", "expression": "*/7 * * * *"},
    {"kind": "rate", "expression": "13s"},
    {"kind": "cron", "expression": "* * * * *", "max_runs": 2},
)


async def counted(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: str) -> tuple[int, float]:
    """The truth: what the quota check counted before the counter (live schedules and their rate sum)."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n, coalesce(sum(fires_per_minute::numeric), 0)::float8 AS rate FROM schedules"
        " WHERE tenant_id = $1 AND state IN ('active', 'paused')",
        tenant_id,
    )
    return row["n"], row["rate"]


async def folded(conn: asyncpg.Connection, tenant_id: str, exclude: uuid.UUID | None = None) -> tuple[int, float]:
    row = await conn.fetchrow(*QUERIES.tenant_usage(tenant_id=tenant_id, exclude_schedule_id=exclude))
    return row["schedules"], row["fires_per_minute"]


async def usage(pool: asyncpg.Pool, tenant_id: str) -> tuple[int, float]:
    """The counter as the quota check reads it: folded under the tenant's row lock."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM tenants WHERE tenant_id = $1 FOR UPDATE", tenant_id)
        return await folded(conn, tenant_id)


def assert_same(actual: tuple[int, float], expected: tuple[int, float]) -> None:
    assert actual[0] == expected[0]
    assert actual[1] == pytest.approx(expected[1], rel=1e-12, abs=1e-9)


async def copy_schedule(conn: asyncpg.Connection | asyncpg.Pool, source: str, copies: int, state: str | None = None):
    """Copies of a schedule row with fresh ids, straight into the table (an operator's SQL, a restore)."""
    changed = "jsonb_build_object('schedule_id', gen_random_uuid(), 'created_by_key', NULL)"
    if state is not None:
        changed += f" || jsonb_build_object('state', '{state}')"
    await conn.execute(
        f"INSERT INTO schedules SELECT (jsonb_populate_record(s, {changed})).* FROM schedules s,"
        " generate_series(1, $2) WHERE s.schedule_id = $1::uuid",
        source,
        copies,
    )


class Walk:
    """One random step at a time through every writer of a schedule, for two tenants."""

    def __init__(self, pool: asyncpg.Pool, clock, seed: int) -> None:
        self.pool, self.clock, self.rng = pool, clock, random.Random(seed)
        self.control = ControlPlane(pool, clock)
        self.batches = ScheduleBatches(self.control)
        self.materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=90)), clock)
        self.ids: dict[str, list[str]] = {tenant: [] for tenant in TENANTS}

    def shape(self, tenant: str) -> dict:
        return {**self.rng.choice(SHAPES), "target": f"usage.{tenant}"}

    async def step(self) -> None:
        tenant = self.rng.choice(TENANTS)
        name = self.rng.choice(("create", "batch", "change", "change", "fire", "sql_delete", "sql_copy"))
        await getattr(self, name if self.ids[tenant] else "create")(tenant)

    async def create(self, tenant: str) -> None:
        self.ids[tenant].append((await self.control.create_schedule(tenant, self.shape(tenant)))["schedule_id"])

    async def batch(self, tenant: str) -> None:
        items = [BatchItem(f"k-{uuid.uuid4()}", self.shape(tenant)) for _ in range(self.rng.randint(1, 5))]
        self.ids[tenant].extend(
            r["schedule"]["schedule_id"] for r in await self.batches.create_schedules(tenant, items)
        )

    async def change(self, tenant: str) -> None:
        """Update (a new rate), pause, resume or cancel, whichever the schedule's state allows."""
        schedule_id = self.rng.choice(self.ids[tenant])
        state = await self.pool.fetchval("SELECT state FROM schedules WHERE schedule_id = $1::uuid", schedule_id)
        allowed = {"active": ("update", "pause", "cancel"), "paused": ("update", "resume", "cancel")}.get(state, ())
        if not allowed:
            return
        action = self.rng.choice(allowed)
        if action == "update":
            changes = {k: v for k, v in self.shape(tenant).items() if k != "target"}
            await self.control.update_schedule(tenant, schedule_id, changes)
        else:
            await getattr(self.control, f"{action}_schedule")(tenant, schedule_id)

    async def fire(self, tenant: str) -> None:
        """The materializer's writes: cursors advanced, run-limited schedules completed."""
        self.clock.advance(timedelta(seconds=self.rng.choice((30, 61, 150))))
        await self.materializer.run_once()

    async def sql_delete(self, tenant: str) -> None:
        """An operator removing a schedule, its history first."""
        await self.pool.execute(
            "WITH v AS (DELETE FROM schedule_versions WHERE schedule_id = $1::uuid),"
            " m AS (DELETE FROM missed_ranges WHERE schedule_id = $1::uuid)"
            " DELETE FROM schedules WHERE schedule_id = $1::uuid",
            self.ids[tenant].pop(self.rng.randrange(len(self.ids[tenant]))),
        )

    async def sql_copy(self, tenant: str) -> None:
        """Copies in any state; not changed through the control plane afterwards (no version history)."""
        state = self.rng.choice(("active", "paused", "canceled"))
        await copy_schedule(self.pool, self.rng.choice(self.ids[tenant]), self.rng.randint(1, 3), state)


@pytest.mark.parametrize("seed", [7, 8, 9])
async def test_the_counter_follows_every_writer_of_a_schedule(pool, clock, seed):
    """Random lifecycles through every writer: creates, batches, rate-changing updates, pause, resume,
    cancel, the materializer completing run-limited schedules, and SQL that bypasses the control plane."""
    for tenant in TENANTS:
        await create_tenant(pool, tenant, ROOM)
    walk = Walk(pool, clock, seed)
    for _ in range(40):
        await walk.step()
        for tenant in TENANTS:
            truth = await counted(pool, tenant)
            shown = await current_usage(pool, tenant)  # read only, before the fold: counter plus changes
            assert_same((shown.schedules, shown.fires_per_minute), truth)
            assert_same(await usage(pool, tenant), truth)
    completed = await pool.fetchval("SELECT count(*) FROM schedules WHERE state = 'completed'")
    assert completed or seed != 7, "seed 7's walk completes a run-limited schedule (the materializer's writes)"


async def test_the_check_of_an_update_leaves_out_the_schedule_it_replaces(pool, clock, telemetry, monkeypatch):
    monkeypatch.setattr(obs.metrics, "get_meter_provider", lambda: telemetry.meter_provider)
    await create_tenant(pool, "small", TenantQuotas(max_active_schedules=2, max_fires_per_minute=3))
    control = ControlPlane(pool, clock)
    hourly = {"kind": "cron", "expression": "0 * * * *", "target": "x"}
    first = (await control.create_schedule("small", hourly))["schedule_id"]
    await control.create_schedule("small", hourly)
    with pytest.raises(QuotaExceeded, match="max_active_schedules"):
        await control.create_schedule("small", hourly)
    async with pool.acquire() as conn:
        n, rate = await folded(conn, "small", exclude=uuid.UUID(first))
    assert_same((n, rate), (1, 1 / 60))
    # Two per minute fit beside the other's hourly rate; three would not.
    await control.update_schedule("small", first, {"kind": "rate", "expression": "30s"})
    with pytest.raises(QuotaExceeded, match="max_fires_per_minute"):
        await control.update_schedule("small", first, {"kind": "rate", "expression": "20s"})
    await control.pause_schedule("small", first)
    with pytest.raises(QuotaExceeded, match="max_active_schedules"):  # a paused schedule still counts
        await control.create_schedule("small", hourly)
    await control.cancel_schedule("small", first)
    await control.create_schedule("small", hourly)
    assert_same(await usage(pool, "small"), await counted(pool, "small"))
    batch = await ScheduleBatches(control).create_schedules("small", [BatchItem("k1", hourly)])
    assert batch[0]["status"] == 429
    refusals = {
        point.attributes["quota"]: point.value
        for point in telemetry.points(obs.QUOTA_REFUSALS)
        if point.attributes["tenant_id"] == "small"
    }
    assert refusals == {"max_active_schedules": 3, "max_fires_per_minute": 1}


async def test_a_change_committed_behind_a_fold_is_counted_by_the_next_fold_once(pool, clock, acme):
    control = ControlPlane(pool, clock)
    template = (await control.create_schedule("acme", {**SHAPES[0], "target": "usage.t"}))["schedule_id"]
    assert (await usage(pool, "acme"))[0] == 1
    writer = await pool.acquire()
    try:
        late = writer.transaction()
        await late.start()
        await copy_schedule(writer, template, 3)
        assert (await usage(pool, "acme"))[0] == 1  # not committed: not seen, and not lost either
        await late.commit()
    finally:
        await pool.release(writer)
    assert (await usage(pool, "acme"))[0] == 4
    assert (await usage(pool, "acme"))[0] == 4  # folded once, not again
    assert await pool.fetchval("SELECT count(*) FROM tenant_usage_changes WHERE tenant_id = 'acme'") == 0


async def test_two_folds_at_once_each_add_what_they_took(pool, clock, acme):
    """A fold without the tenant's lock (a caller's mistake, or a future reader) racing one that holds
    it: the second waits for the first's rows and counter, and both answer the same total."""
    control = ControlPlane(pool, clock)
    for _ in range(3):
        await control.create_schedule("acme", {**SHAPES[2], "target": "usage.t"})
    first, second = await pool.acquire(), await pool.acquire()
    try:
        held = first.transaction()
        await held.start()
        assert (await folded(first, "acme"))[0] == 3
        racing = asyncio.create_task(folded(second, "acme"))
        pid = second.get_server_pid()
        for _ in range(500):  # until the racing fold waits on the first one's locks
            waiting = await pool.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid)
            if waiting == "Lock":
                break
            await asyncio.sleep(0.01)
        assert waiting == "Lock"
        await held.commit()
        assert (await racing)[0] == 3
    finally:
        await pool.release(first)
        await pool.release(second)
    assert_same(await usage(pool, "acme"), await counted(pool, "acme"))


async def test_truncate_empties_every_tenants_usage(pool, clock, acme):
    await ControlPlane(pool, clock).create_schedule("acme", {**SHAPES[1], "target": "usage.t"})
    assert (await usage(pool, "acme"))[0] == 1
    await pool.execute("TRUNCATE schedules CASCADE")
    assert await usage(pool, "acme") == (0, 0.0)


async def test_a_recount_repairs_a_counter_that_writes_bypassing_triggers_left_behind(pool, clock, acme):
    control = ControlPlane(pool, clock)
    kept = (await control.create_schedule("acme", {**SHAPES[2], "target": "usage.t"}))["schedule_id"]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")  # a restore's --disable-triggers
        await copy_schedule(conn, kept, 2)
    assert (await usage_of(pool, "acme"))["usage"]["schedules"] == 1  # the counter missed them
    report = await usage_of(pool, "acme", recount=True)
    assert report["usage"]["schedules"] == 3 and report["drift"] == {
        "schedules": 2,
        "fires_per_minute": pytest.approx(2 * 60 / 13),
        "open_occurrences": 0,
    }
    assert report["quotas"] == asdict(TenantQuotas())
    again = await usage_of(pool, "acme", recount=True)
    assert again["drift"] == {"schedules": 0, "fires_per_minute": 0.0, "open_occurrences": 0}
    assert_same(await usage(pool, "acme"), await counted(pool, "acme"))
    with pytest.raises(NotFound, match="chronoq tenant create"):
        await usage_of(pool, "nobody")


async def test_reading_the_usage_neither_waits_for_a_create_nor_folds(pool, clock, acme):
    await ControlPlane(pool, clock).create_schedule("acme", {**SHAPES[1], "target": "usage.t"})
    pending = "SELECT count(*) FROM tenant_usage_changes WHERE tenant_id = 'acme'"
    assert await pool.fetchval(pending) == 1  # the create's own change: folded by the next check
    async with pool.acquire() as creating, creating.transaction():
        await creating.execute("SELECT 1 FROM tenants WHERE tenant_id = 'acme' FOR UPDATE")  # a create, mid-way
        async with asyncio.timeout(10):
            report = await usage_of(pool, "acme")
    assert report["usage"] == {"schedules": 1, "fires_per_minute": 0.15, "open_occurrences": 0}  # */7: 9 an hour
    assert await pool.fetchval(pending) == 1


async def test_every_tenants_usage_lists_the_nearest_to_its_quota_first(pool, clock):
    await create_tenant(pool, "roomy", TenantQuotas(max_active_schedules=100))
    await create_tenant(pool, "tight", TenantQuotas(max_active_schedules=2))
    await create_tenant(pool, "idle")
    # One schedule of 100: far from max_active_schedules, but 4.6 of its 5 fires a minute (13 s rate).
    await create_tenant(pool, "hot", TenantQuotas(max_active_schedules=100, max_fires_per_minute=5))
    control = ControlPlane(pool, clock)
    for tenant, count in (("roomy", 3), ("tight", 1)):
        for _ in range(count):
            await control.create_schedule(tenant, {**SHAPES[0], "target": f"usage.{tenant}"})
    await control.create_schedule("hot", {**SHAPES[2], "target": "usage.hot"})
    listed = await every_usage(pool)
    assert [(t["tenant_id"], t["usage"]["schedules"]) for t in listed] == [
        ("hot", 1),  # nearest a quota (92 % of its rate), though 1 % of its schedules
        ("tight", 1),
        ("roomy", 3),
        ("idle", 0),
    ]
    assert listed[1] == await usage_of(pool, "tight")


async def pending_changes(pool: asyncpg.Pool, tenant_id: str) -> int:
    return await pool.fetchval("SELECT count(*) FROM tenant_usage_changes WHERE tenant_id = $1", tenant_id)


async def test_the_periodic_fold_empties_the_log_of_a_tenant_that_stopped_creating(pool, clock, telemetry):
    """Cancels and the materializer's completions append to the log with no create to fold it: the
    periodic pass does, and what a reader sees (counter plus log) is the truth before and after."""
    await create_tenant(pool, "quiet", ROOM)
    control = ControlPlane(pool, clock)
    ids = [
        (await control.create_schedule("quiet", {**shape, "target": "usage.quiet"}))["schedule_id"]
        for shape in SHAPES * 3
    ]
    await usage(pool, "quiet")  # the creates' own changes folded, as the last create's check would
    for schedule_id in ids[:3]:
        await control.cancel_schedule("quiet", schedule_id)
    await control.pause_schedule("quiet", ids[4])  # a paused schedule still counts: nothing logged
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=90)), clock)
    for _ in range(3):  # the run-limited ones (max_runs 2) complete: the materializer's statement logs it
        clock.advance(timedelta(seconds=61))
        await materializer.run_once()
    assert await pool.fetchval("SELECT count(*) FROM schedules WHERE state = 'completed'") >= 1
    before = await pending_changes(pool, "quiet")
    assert before >= 4  # three cancels and at least one pass's completions
    shown = await current_usage(pool, "quiet")
    assert_same((shown.schedules, shown.fires_per_minute), await counted(pool, "quiet"))

    folds = TenantUsageFolds(pool, meter=telemetry.meter_provider.get_meter("test"))
    outcome = await folds.run_pass()
    assert outcome.counts == {"tenants": 1, "changes": before, "busy": 0} and not outcome.more
    assert await pending_changes(pool, "quiet") == 0
    shown = await current_usage(pool, "quiet")
    assert_same((shown.schedules, shown.fires_per_minute), await counted(pool, "quiet"))
    assert_same(await usage(pool, "quiet"), await counted(pool, "quiet"))
    assert sum(point.value for point in telemetry.points(obs.TENANT_USAGE_FOLDED)) == before
    assert (await folds.run_pass()).counts == {"tenants": 0, "changes": 0, "busy": 0}  # nothing left


async def test_the_periodic_fold_leaves_a_busy_tenant_to_its_create_and_takes_the_longest_logs_first(pool, clock):
    control = ControlPlane(pool, clock)
    for tenant, creates, cancels in (("small", 1, 0), ("large", 3, 2), ("busy", 2, 1)):
        await create_tenant(pool, tenant, ROOM)
        ids = [
            (await control.create_schedule(tenant, {**SHAPES[2], "target": f"usage.{tenant}"}))["schedule_id"]
            for _ in range(creates)
        ]
        for schedule_id in ids[:cancels]:  # a create folds what came before it; a cancel folds nothing
            await control.cancel_schedule(tenant, schedule_id)
    assert [await pending_changes(pool, t) for t in ("small", "large", "busy")] == [1, 3, 2]
    folds = TenantUsageFolds(pool, batch=2)
    async with pool.acquire() as creating, creating.transaction():
        await creating.execute("SELECT 1 FROM tenants WHERE tenant_id = 'busy' FOR UPDATE")  # a create, mid-way
        async with asyncio.timeout(10):  # never waits for it
            outcome = await folds.run_pass()
        # The two longest logs were taken (large: 3, busy: 2); busy was skipped, so a pass runs again at once.
        assert outcome.counts == {"tenants": 1, "changes": 3, "busy": 1} and outcome.more
        assert [await pending_changes(pool, t) for t in ("small", "large", "busy")] == [1, 0, 2]
    outcome = await folds.run_pass()
    assert outcome.counts == {"tenants": 2, "changes": 3, "busy": 0} and outcome.more  # a full batch
    assert (await folds.run_pass()).counts == {"tenants": 0, "changes": 0, "busy": 0}
    for tenant in ("small", "large", "busy"):
        assert await pending_changes(pool, tenant) == 0
        assert_same(await usage(pool, tenant), await counted(pool, tenant))


async def test_the_migration_counts_the_schedules_already_there(servers):
    name = f"chronoq_usage_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(await create_database(servers, name))
    try:
        await apply_up_to(conn, 24)
        rows = [
            ("acme", "active", 1 / 60),
            ("acme", "paused", 0.5),
            ("acme", "canceled", 60.0),
            ("acme", "completed", 1.0),
            ("globex", "active", 4.0),
        ]
        for tenant, state, rate in rows:
            await conn.execute(
                "INSERT INTO schedules (schedule_id, tenant_id, kind, expression, target, shard, state,"
                " fires_per_minute) VALUES ($1, $2, 'cron', '0 * * * *', 'x', 0, $3, $4)",
                uuid.uuid4(),
                tenant,
                state,
                rate,
            )
        await apply_migrations(conn, "engine")
        async with conn.transaction():
            assert_same(await folded(conn, "acme"), (2, 1 / 60 + 0.5))
            assert_same(await folded(conn, "globex"), (1, 4.0))
            assert await folded(conn, "nobody") == (0, 0.0)
    finally:
        await conn.close()
        await drop_database(servers, name)

"""A tenant's max_running is enforced at dispatch: further first deliveries are held, then released in due
order as its occurrences finish; never dropped (real PostgreSQL, the ahead lane, the manual clock)."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

from engine.control.quotas import open_count_drift
from engine.control.schedules import ControlPlane
from engine.loops.attempt_processor import AttemptProcessor
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.shard_leases import ShardLeaseConfig, ShardLeases
from engine.loops.tenant_gate import TENANT_GATE_TOKEN, TenantGate
from relay.outbox import OutboxStore
from schemas import observability as obs
from schemas.attempt_events import AttemptEvent as Ev
from schemas.identity import occurrence_id
from schemas.shard_ownership import ShardOwnership

SLOT = datetime(2026, 11, 29, 10, 1, tzinfo=UTC)
TTL = 30.0


async def held(pool) -> list[uuid.UUID]:
    """Occurrences whose delivery waits for the tenant gate, earliest due first."""
    rows = await pool.fetch(
        "SELECT occurrence_id FROM outbox WHERE claim_token = $1 AND claim_expires_at = 'infinity'"
        " AND sent_at IS NULL AND discarded_at IS NULL ORDER BY available_at, id",
        TENANT_GATE_TOKEN,
    )
    return [r["occurrence_id"] for r in rows]


async def test_first_deliveries_beyond_max_running_are_held_and_released_in_order_as_occurrences_finish(
    pool, clock, target, acme, telemetry
):
    """Why: "Tenant max_running is stored and never enforced". With max_running 2, five occurrences due at
    10:01 (on main: all five in the ahead lane, published at once): two are admitted, three wait held in
    the outbox, and each finished occurrence lets the earliest waiting one go; all five run."""
    await pool.execute("UPDATE tenants SET max_running = 2 WHERE tenant_id = 'acme'")
    control = ControlPlane(pool, clock)
    schedules = []
    for minute_offset in range(5):  # 10:01:00, 10:01:01, ... so the due order is known
        created = await control.create_schedule(
            "acme",
            {"kind": "cron", "expression": "* * * * *", "target": target, "payload": {"n": minute_offset}},
        )
        schedules.append(uuid.UUID(created["schedule_id"]))
    ids = [occurrence_id(s, 1, SLOT) for s in schedules]
    clock.advance(timedelta(seconds=45))
    ownership = ShardOwnership("node-a")
    leases = ShardLeases(pool, ownership, ShardLeaseConfig(interval=1.0, lease_ttl=6.0, max_moves=256), clock)
    await leases.run_once()
    materializer = Materializer(
        pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock, ownership=ownership,
        **telemetry.instruments("engine"),
    )  # fmt: skip

    report = await materializer.run_once()

    assert (report.occurrences, report.ahead, report.late) == (5, 2, 3)
    waiting = await held(pool)
    assert len(waiting) == 3 and set(waiting) <= set(ids)
    assert [(p.attributes["tenant_id"], p.value) for p in telemetry.points(obs.TENANT_THROTTLED)] == [("acme", 3)]
    admitted = [i for i in ids if i not in waiting]

    gate = TenantGate(pool, meter=telemetry.instruments("engine")["meter"])
    assert (await gate.run_once()).waiting == 3  # two admitted and open: no room
    assert await held(pool) == waiting
    assert [p.value for p in telemetry.points(obs.TENANT_HELD)] == [3]

    # An admitted occurrence is published, runs and succeeds: room for one, the earliest due.
    clock.set(SLOT)
    processor = AttemptProcessor(pool, clock=clock, rng=random.Random(3))
    token = uuid.uuid4()
    await processor.apply_events([Ev.started(admitted[0], 1, token, TTL), Ev.succeeded(admitted[0], 1, token)])
    report_1 = await gate.run_once()
    assert (dict(report_1.released), report_1.waiting) == ({"acme": 1}, 2)
    assert await held(pool) == waiting[1:]
    claim = await OutboxStore(pool, clock).claim(100, timedelta(seconds=60))
    assert [r.occurrence_id for r in claim.rows if r.occurrence_id is not None] == [waiting[0]]  # the relay takes it

    # Later deliveries of the same tenant queue behind the held ones (in due order), never ahead of them.
    clock.set(SLOT + timedelta(seconds=45))
    await leases.run_once()
    later = await materializer.run_once()
    assert (later.occurrences, later.ahead, later.late) == (5, 0, 5)
    next_slot = [occurrence_id(s, 1, SLOT + timedelta(minutes=1)) for s in schedules]
    assert (await held(pool))[:2] == waiting[1:] and sorted((await held(pool))[2:]) == sorted(next_slot)

    # Everything finishes in turn: every held delivery is released, none dropped.
    for ident in [admitted[1], waiting[0]]:
        token = uuid.uuid4()
        await processor.apply_events([Ev.started(ident, 1, token, TTL), Ev.succeeded(ident, 1, token)])
    assert dict((await gate.run_once()).released) == {"acme": 2}
    assert sorted(await held(pool)) == sorted(next_slot)  # 10:02 waits its turn
    states = await pool.fetch("SELECT state, count(*) FROM occurrences GROUP BY state ORDER BY state")
    assert [tuple(r) for r in states] == [("SCHEDULED", 7), ("SUCCEEDED", 3)]  # nothing dropped
    assert await open_count_drift(pool) == {}  # the gate's counter saw every write (migration 0027)


async def test_a_tenant_below_max_running_is_not_held(pool, clock, target, acme):
    control = ControlPlane(pool, clock)
    for _ in range(3):
        await control.create_schedule("acme", {"kind": "cron", "expression": "* * * * *", "target": target})
    clock.advance(timedelta(seconds=45))
    ownership = ShardOwnership("node-a")
    await ShardLeases(pool, ownership, ShardLeaseConfig(interval=1.0, lease_ttl=6.0, max_moves=256), clock).run_once()
    report = await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()
    assert (report.ahead, report.late) == (3, 0)  # the default max_running (100) leaves room
    assert await held(pool) == []
    assert (await TenantGate(pool).run_once()).waiting == 0

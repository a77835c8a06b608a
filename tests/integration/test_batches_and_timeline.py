"""Batch create (set-based, per-item results) and the schedule timeline, on a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engine.control.quotas import TenantQuotas
from engine.control.requested_occurrences import RequestedOccurrences
from engine.control.schedule_batches import BatchItem, ScheduleBatches
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.control.timeline import schedule_timeline
from engine.loops.materializer import Materializer, MaterializerConfig

DAILY = {"kind": "cron", "expression": "0 9 * * *", "time_zone": "Europe/Berlin", "target": "billing.invoice"}
MINUTELY = {"kind": "cron", "expression": "* * * * *", "target": "demo.minutely"}
T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


async def test_a_batch_has_one_result_per_item_and_importing_again_creates_none(pool, acme, clock):
    batches = ScheduleBatches(ControlPlane(pool, clock))
    items = [BatchItem(f"k{i}", {**DAILY, "payload": {"n": i}}) for i in range(1000)]
    items[3] = BatchItem("k3", {**DAILY, "expression": "0 0 30 2 *"})  # never fires
    items[4] = BatchItem(None, DAILY)  # no key
    items[5] = BatchItem("k0", {**DAILY, "payload": {"n": 0}})  # the same key and body as item 0
    items[6] = BatchItem("k1", {**DAILY, "payload": {"other": True}})  # item 1's key, another body

    results = await batches.create_schedules("acme", items)

    assert [r["index"] for r in results] == list(range(1000))
    statuses = [r["status"] for r in results]
    assert statuses[3] == 422 and results[3]["error"]["field"] == "expression"
    assert statuses[4] == 422 and results[4]["error"]["field"] == "Idempotency-Key"
    assert statuses[5] == 200 and results[5]["schedule"]["schedule_id"] == results[0]["schedule"]["schedule_id"]
    assert statuses[6] == 409
    assert statuses.count(201) == 996
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 996
    assert await pool.fetchval("SELECT count(*) FROM schedule_versions") == 996
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE topic = 'chronoq.schedule-states'") == 996
    first = results[0]["schedule"]
    assert (first["version"], first["state"], first["next_run_at"]) == (1, "active", "2026-11-30T08:00:00Z")

    again = await batches.create_schedules("acme", items)
    assert [r["status"] for r in again].count(200) == 997
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 996


async def test_a_batch_stops_at_the_quota_item_by_item(pool, clock):
    await create_tenant(pool, "small", TenantQuotas(max_active_schedules=3))
    batches = ScheduleBatches(ControlPlane(pool, clock))
    results = await batches.create_schedules("small", [BatchItem(f"k{i}", DAILY) for i in range(5)])
    assert [r["status"] for r in results] == [201, 201, 201, 429, 429]
    assert results[3]["error"]["field"] == "max_active_schedules"


async def test_the_timeline_explains_every_slot_of_a_pause(pool, acme, clock):
    control = ControlPlane(pool, clock)
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    schedule = await control.create_schedule("acme", MINUTELY)  # fire_once, max lateness 1 min
    sid = schedule["schedule_id"]

    async def run_until(instant: datetime) -> None:
        while clock.now() < instant:
            clock.advance(timedelta(seconds=10))
            await materializer.run_once()
            # a consumer would report these; here they simply succeed once published
            await pool.execute(
                "UPDATE occurrences SET state = 'SUCCEEDED', attempt_count = 1, enqueued_at ="
                " scheduled_for WHERE state = 'SCHEDULED' AND scheduled_for <= $1",
                clock.now(),
            )

    await run_until(T0 + timedelta(minutes=3, seconds=40))  # 10:01, 10:02, 10:03 fire; 10:04 materialized
    await control.pause_schedule("acme", sid)  # version 2: cancels 10:04
    clock.advance(timedelta(minutes=5))  # 10:08:40
    await control.resume_schedule("acme", sid)  # version 3
    await run_until(T0 + timedelta(minutes=10, seconds=10))

    timeline = await schedule_timeline(pool, "acme", sid, T0, T0 + timedelta(minutes=12), clock.now())
    verdicts = {e.scheduled_for.strftime("%H:%M"): (e.verdict, e.explanation) for e in timeline.entries}

    assert [verdicts[f"10:0{m}"][0] for m in (1, 2, 3)] == ["SUCCEEDED"] * 3
    assert "after 1 attempt" in verdicts["10:01"][1]
    # 10:04 was materialized ahead, canceled by the pause, and judged late on resume
    assert verdicts["10:04"][0] == "MISSED"
    assert "CANCELED by version 2 (pause" in verdicts["10:04"][1] and "paused" in verdicts["10:04"][1]
    for minute in ("10:05", "10:06", "10:07"):
        assert verdicts[minute][0] == "MISSED" and "paused" in verdicts[minute][1]
        assert "fire_once (max lateness 60s) skipped it" in verdicts[minute][1]
    # 10:08 fell in the pause but was still on time at the resume (10:08:50): fire_once runs it, and so
    # the late ones are not caught up (a catch-up run would be a second run for the same outage)
    assert [verdicts[f"10:{m}"][0] for m in ("08", "09", "10")] == ["SUCCEEDED"] * 3
    assert verdicts["10:11"][0] in ("UPCOMING", "SCHEDULED")
    assert timeline.counts["MISSED"] == 4


async def test_the_timeline_shows_backfills_manual_triggers_and_absent_slots(pool, acme, clock):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", MINUTELY)
    sid = schedule["schedule_id"]
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(0)), clock)
    clock.advance(timedelta(minutes=3, seconds=5))
    await materializer.run_once()  # 10:01 10:02 10:03 (fire_once: 10:02 is late...)
    await pool.execute(
        "DELETE FROM outbox WHERE occurrence_id IN (SELECT occurrence_id FROM occurrences WHERE scheduled_for = $1)",
        T0 + timedelta(minutes=2),
    )
    await pool.execute("DELETE FROM occurrences WHERE scheduled_for = $1", T0 + timedelta(minutes=2))
    requested = RequestedOccurrences(pool, clock)
    await requested.trigger_now("acme", sid, "operator:alice")
    await requested.backfill("acme", sid, T0 - timedelta(minutes=2), T0 - timedelta(minutes=1), "tenant:acme")

    timeline = await schedule_timeline(
        pool, "acme", sid, T0 - timedelta(minutes=5), T0 + timedelta(minutes=5), clock.now()
    )
    by_minute = {(e.scheduled_for.strftime("%H:%M:%S"), e.origin): e for e in timeline.entries}
    assert by_minute[("10:02:00", "schedule")].verdict == "ABSENT"
    assert "expected but absent" in by_minute[("10:02:00", "schedule")].explanation
    manual = by_minute[("10:03:05", "manual")]
    assert manual.version is None and "operator:alice" in manual.explanation
    backfilled = by_minute[("09:58:00", "backfill")]
    assert backfilled.verdict == "SCHEDULED" and "backfill requested by tenant:acme" in backfilled.explanation
    # before the schedule existed and not backfilled: no slot is expected there
    assert ("09:57:00", "schedule") not in by_minute
    assert by_minute[("10:05:00", "schedule")].verdict == "UPCOMING"

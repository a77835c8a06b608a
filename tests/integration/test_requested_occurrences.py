"""Backfill and trigger-now against a real PostgreSQL, with the materializer and an injected clock."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engine.control.quotas import TenantQuotas
from engine.control.requested_occurrences import RequestedOccurrences
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.overlap_gate import OVERLAP_GATE_TOKEN
from schemas.errors import Conflict, InvalidInput, NotFound
from schemas.identity import occurrence_id

MINUTELY = {"kind": "cron", "expression": "* * * * *", "target": "demo.minutely"}
T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


async def occurrences(pool, schedule_id):
    return await pool.fetch(
        "SELECT * FROM occurrences WHERE schedule_id = $1 ORDER BY scheduled_for, created_at", schedule_id
    )


async def test_backfill_of_an_hour_twice_creates_each_past_slot_once(pool, acme, clock):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", MINUTELY)
    clock.advance(timedelta(hours=2))  # the schedule never fired: no materializer ran
    requested = RequestedOccurrences(pool, clock)
    window = (T0 + timedelta(minutes=30), T0 + timedelta(minutes=90))

    first = await requested.backfill("acme", schedule["schedule_id"], *window, "tenant:acme")
    second = await requested.backfill("acme", schedule["schedule_id"], *window, "tenant:acme")

    assert (first.slots, first.created, first.refired) == (61, 61, 0)
    assert (second.slots, second.created, second.refired) == (61, 0, 0)
    assert second.present == {"SCHEDULED": 61}
    rows = await occurrences(pool, schedule["schedule_id"])
    assert [r["scheduled_for"] for r in rows] == [window[0] + timedelta(minutes=i) for i in range(61)]
    assert {r["origin"] for r in rows} == {"backfill"} and {r["requested_by"] for r in rows} == {"tenant:acme"}
    assert all(r["occurrence_id"] == occurrence_id(r["schedule_id"], 1, r["scheduled_for"]) for r in rows)
    outbox = await pool.fetchval("SELECT count(*) FROM outbox WHERE occurrence_id IS NOT NULL")
    assert outbox == 61


async def test_backfill_refires_missed_slots_with_their_own_ids(pool, acme, clock):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", {**MINUTELY, "misfire_policy": "skip"})
    clock.advance(timedelta(minutes=10, seconds=30))  # the engine was down for ten minutes
    await Materializer(pool, MaterializerConfig(horizon=timedelta(0)), clock).run_once()
    missed = [r for r in await occurrences(pool, schedule["schedule_id"]) if r["state"] == "MISSED"]
    assert len(missed) == 9  # 10:01 .. 10:09 are late by more than a minute; 10:10 is on time

    result = await RequestedOccurrences(pool, clock).backfill(
        "acme", schedule["schedule_id"], T0, T0 + timedelta(minutes=10), "operator:alice"
    )

    # 10:00 precedes the schedule's creation: a backfill may also fill slots from before it existed.
    assert (result.slots, result.created, result.refired, result.present) == (11, 1, 9, {"SCHEDULED": 1})
    rows = {r["occurrence_id"]: r for r in await occurrences(pool, schedule["schedule_id"])}
    assert len(rows) == 11
    for occ in missed:
        assert (rows[occ["occurrence_id"]]["state"], rows[occ["occurrence_id"]]["origin"]) == ("SCHEDULED", "backfill")


async def test_backfill_is_paced_by_the_tenants_catch_up_quota(pool, clock):
    await create_tenant(pool, "slow", TenantQuotas(catch_up_per_minute=10))
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("slow", MINUTELY)
    clock.advance(timedelta(hours=2))
    requested = RequestedOccurrences(pool, clock)
    result = await requested.backfill(
        "slow", schedule["schedule_id"], T0 + timedelta(minutes=1), T0 + timedelta(minutes=30), "tenant:slow"
    )
    assert result.created == 30
    release = sorted(r["available_at"] for r in await occurrences(pool, schedule["schedule_id"]))
    now = clock.now()
    assert release[:10] == [now] * 10  # an idle tenant bursts one minute's quota
    assert release[10:] == [now + timedelta(seconds=6 * i) for i in range(1, 21)]  # then 10 per minute
    # A second backfill of the same tenant queues behind the first: the quota is the tenant's, not per request.
    other = await control.create_schedule("slow", {**MINUTELY, "target": "demo.other"})
    await requested.backfill(
        "slow", other["schedule_id"], T0 + timedelta(minutes=1), T0 + timedelta(minutes=1), "tenant:slow"
    )
    assert (await occurrences(pool, other["schedule_id"]))[0]["available_at"] == now + timedelta(seconds=126)


async def test_backfill_is_bounded_and_refuses_the_future_and_other_tenants(pool, acme, clock):
    await create_tenant(pool, "globex")
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", {**MINUTELY, "kind": "rate", "expression": "1s"})
    clock.advance(timedelta(hours=4))
    requested = RequestedOccurrences(pool, clock)
    with pytest.raises(InvalidInput) as caught:
        await requested.backfill("acme", schedule["schedule_id"], T0, T0 + timedelta(hours=3), "tenant:acme")
    assert caught.value.field == "to" and "10000" in str(caught.value)
    with pytest.raises(InvalidInput) as caught:
        await requested.backfill("acme", schedule["schedule_id"], T0, clock.now() + timedelta(minutes=1), "x")
    assert caught.value.field == "to"
    with pytest.raises(NotFound):
        await requested.backfill("globex", schedule["schedule_id"], T0, T0 + timedelta(minutes=1), "tenant:globex")
    await control.pause_schedule("acme", schedule["schedule_id"])
    with pytest.raises(Conflict):
        await requested.backfill("acme", schedule["schedule_id"], T0, T0 + timedelta(minutes=1), "tenant:acme")
    assert await pool.fetchval("SELECT count(*) FROM occurrences") == 0


async def test_no_occurrence_is_written_for_a_schedule_that_does_not_exist(pool, acme, clock):
    # occurrences has no foreign key to schedules (migration 0019): the writers keep the link. A trigger or a
    # backfill naming an id no schedule has is refused before anything is written, and every occurrence the
    # materializer wrote belongs to a schedule.
    control = ControlPlane(pool, clock)
    await control.create_schedule("acme", MINUTELY)
    clock.advance(timedelta(minutes=5))
    requested = RequestedOccurrences(pool, clock)
    ghost = uuid.uuid4()
    with pytest.raises(NotFound):
        await requested.trigger_now("acme", ghost, "operator:alice")
    with pytest.raises(NotFound):
        await requested.backfill("acme", ghost, T0, T0 + timedelta(minutes=2), "operator:alice")
    await Materializer(pool, MaterializerConfig(horizon=timedelta(0)), clock).run_once()
    assert await pool.fetchval("SELECT count(*) FROM occurrences") == 5  # 10:01 .. 10:05
    orphans = (
        "SELECT count(*) FROM occurrences o"
        " WHERE NOT EXISTS (SELECT FROM schedules s WHERE s.schedule_id = o.schedule_id)"
    )
    assert await pool.fetchval(orphans) == 0


async def test_trigger_now_is_a_manual_occurrence_with_its_own_id_and_who_asked(pool, acme, clock):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", {**MINUTELY, "expression": "0 * * * *"})
    clock.advance(timedelta(hours=1))  # exactly on a slot instant: 11:00
    requested = RequestedOccurrences(pool, clock)
    manual = await requested.trigger_now("acme", schedule["schedule_id"], "operator:alice", "run-1")
    again = await requested.trigger_now("acme", schedule["schedule_id"], "operator:alice", "run-1")
    other = await requested.trigger_now("acme", schedule["schedule_id"], "tenant:acme")
    assert again["occurrence_id"] == manual["occurrence_id"] and (manual["created"], again["created"]) == (True, False)
    assert other["occurrence_id"] != manual["occurrence_id"]
    assert (manual["origin"], manual["requested_by"], manual["scheduled_for"]) == (
        "manual",
        "operator:alice",
        "2026-11-29T11:00:00Z",
    )
    assert manual["occurrence_id"] != str(occurrence_id(schedule["schedule_id"], 1, clock.now()))
    # The slot of the same instant still materializes: manual occurrences do not take a slot's place.
    await Materializer(pool, MaterializerConfig(horizon=timedelta(0)), clock).run_once()
    rows = await occurrences(pool, schedule["schedule_id"])
    assert sorted(r["origin"] for r in rows) == ["manual", "manual", "schedule"]
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE occurrence_id IS NOT NULL") == 3


async def test_a_trigger_retried_later_with_its_idempotency_key_triggers_once(pool, acme, clock):
    """A client's retry comes later than its first request (a timeout, a restart): the same key still names the
    same occurrence, however much later, and however the occurrence table is partitioned by instant."""
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", {**MINUTELY, "expression": "0 * * * *"})
    requested = RequestedOccurrences(pool, clock)
    first = await requested.trigger_now("acme", schedule["schedule_id"], "tenant:acme", "deploy-7")
    retries = []
    for later in (timedelta(seconds=1), timedelta(minutes=5), timedelta(days=3)):
        clock.advance(later)
        retries.append(await requested.trigger_now("acme", schedule["schedule_id"], "tenant:acme", "deploy-7"))

    assert first["created"] and not any(r["created"] for r in retries)
    assert {r["occurrence_id"] for r in retries} == {first["occurrence_id"]}
    assert {r["scheduled_for"] for r in retries} == {first["scheduled_for"]}
    oid = uuid.UUID(first["occurrence_id"])
    assert await pool.fetchval("SELECT count(*) FROM occurrences WHERE occurrence_id = $1", oid) == 1
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE occurrence_id = $1", oid) == 1


async def test_trigger_now_is_subject_to_the_overlap_policy(pool, acme, clock):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule("acme", {**MINUTELY, "overlap_policy": "skip_if_running"})
    manual = await RequestedOccurrences(pool, clock).trigger_now("acme", schedule["schedule_id"], "tenant:acme")
    held = await pool.fetchrow(
        "SELECT claim_token, claim_expires_at FROM outbox WHERE occurrence_id = $1",
        __import__("uuid").UUID(manual["occurrence_id"]),
    )
    assert held["claim_token"] == OVERLAP_GATE_TOKEN  # the overlap gate decides it like any other fire
    await control.cancel_schedule("acme", schedule["schedule_id"])
    with pytest.raises(Conflict):
        await RequestedOccurrences(pool, clock).trigger_now("acme", schedule["schedule_id"], "tenant:acme")

"""Overlap policies against real PostgreSQL: the materializer holds, the gate decides atomically."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import timedelta

from engine.control.schedules import ControlPlane
from engine.loops.attempt_processor import AttemptProcessor
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.overlap_gate import OVERLAP_GATE_TOKEN, OverlapGate
from relay.outbox import OutboxStore
from schemas import observability as obs
from schemas.attempt_events import AttemptEvent as Ev
from tests.support.rows import insert_occurrence, insert_schedule, occurrence_row


async def held_occurrences(pool, target, at, overlap, count, schedule_id=None):
    """``count`` due occurrences of one schedule, one second apart, held for the gate as the materializer does."""
    schedule_id = schedule_id or await insert_schedule(pool, "acme", target, at, overlap=overlap)
    messages = [
        await insert_occurrence(pool, schedule_id, "acme", target, at + timedelta(seconds=i)) for i in range(count)
    ]
    await pool.execute(
        "UPDATE outbox SET claim_token = $2, claim_expires_at = 'infinity' WHERE occurrence_id = ANY($1)",
        [m.occurrence_id for m in messages],
        OVERLAP_GATE_TOKEN,
    )
    return schedule_id, messages


async def states(pool, messages):
    return [(await occurrence_row(pool, m.occurrence_id))["state"] for m in messages]


async def test_the_materializer_holds_overlap_restricted_rows_and_the_relay_cannot_take_them(pool, clock, target, acme):
    control = ControlPlane(pool, clock)
    restricted = await control.create_schedule(
        "acme", {"kind": "rate", "expression": "10s", "target": target, "overlap_policy": "skip_if_running"}
    )
    free = await control.create_schedule("acme", {"kind": "rate", "expression": "10s", "target": target})
    clock.advance(9)
    await Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=2)), clock).run_once()
    rows = await pool.fetch(
        "SELECT oc.schedule_id, o.occurrence_id, o.claim_token FROM outbox o JOIN occurrences oc USING (occurrence_id)"
    )
    by_schedule = {str(r["schedule_id"]): r for r in rows}
    held, released = by_schedule[restricted["schedule_id"]], by_schedule[free["schedule_id"]]
    assert held["claim_token"] == OVERLAP_GATE_TOKEN and released["claim_token"] is None

    clock.advance(5)  # both due now
    claim = await OutboxStore(pool, clock).claim(100, timedelta(seconds=60))
    claimed = {row.occurrence_id for row in claim.rows}
    assert released["occurrence_id"] in claimed and held["occurrence_id"] not in claimed  # the gate's, not the relay's


async def test_skip_if_running_dispatches_the_oldest_and_skips_the_rest_while_it_is_in_flight(
    pool, clock, target, telemetry
):
    gate = OverlapGate(pool, clock=clock, **{"meter": telemetry.instruments("engine")["meter"]})
    schedule_id, first_batch = await held_occurrences(
        pool, target, clock.now() - timedelta(seconds=5), "skip_if_running", 3
    )
    report = await gate.run_once()
    assert report.dispatched == [first_batch[0].occurrence_id]
    assert await states(pool, first_batch) == ["SCHEDULED", "SKIPPED_OVERLAP", "SKIPPED_OVERLAP"]
    # The dispatched one is released to the relay and counts as in flight before any worker reports it.
    row = await pool.fetchrow(
        "SELECT claim_token, discarded_at FROM outbox WHERE occurrence_id = $1", first_batch[0].occurrence_id
    )
    assert row["claim_token"] is None and row["discarded_at"] is None
    _, later = await held_occurrences(pool, target, clock.now(), "skip_if_running", 1, schedule_id)
    assert (await gate.run_once()).skipped == [later[0].occurrence_id]

    # Once it finished, the next one runs.
    processor = AttemptProcessor(pool, clock=clock)
    token = uuid.uuid4()
    await processor.apply_events(
        [Ev.started(first_batch[0].occurrence_id, 1, token, 30), Ev.succeeded(first_batch[0].occurrence_id, 1, token)]
    )
    clock.advance(1)
    _, next_one = await held_occurrences(pool, target, clock.now(), "skip_if_running", 1, schedule_id)
    assert (await gate.run_once()).dispatched == [next_one[0].occurrence_id]
    assert sum(p.value for p in telemetry.points(obs.OVERLAP_SKIPS)) == 3


async def test_queue_one_keeps_one_waiting_behind_the_running_one(pool, clock, target):
    gate = OverlapGate(pool, clock=clock)
    schedule_id, (running,) = await held_occurrences(pool, target, clock.now() - timedelta(seconds=10), "queue_one", 1)
    assert (await gate.run_once()).dispatched == [running.occurrence_id]
    processor = AttemptProcessor(pool, clock=clock)
    token = uuid.uuid4()
    await processor.apply_events([Ev.started(running.occurrence_id, 1, token, 30)])

    _, (queued, extra) = await held_occurrences(
        pool, target, clock.now() - timedelta(seconds=5), "queue_one", 2, schedule_id
    )
    report = await gate.run_once()
    assert (report.dispatched, report.skipped, report.held) == ([], [extra.occurrence_id], 1)
    assert (await gate.run_once()).schedules == 0  # still waiting: nothing can change, so not even looked at
    await processor.apply_events([Ev.succeeded(running.occurrence_id, 1, token)])
    assert (await gate.run_once()).dispatched == [queued.occurrence_id]
    assert await states(pool, [running, queued, extra]) == ["SUCCEEDED", "SCHEDULED", "SKIPPED_OVERLAP"]


async def test_concurrent_gates_never_dispatch_two_occurrences_of_one_schedule(pool, clock, target):
    """Many gates racing over many schedules: each schedule gets exactly one dispatch (decided under its lock)."""
    schedules = {}
    for _ in range(20):
        schedule_id, messages = await held_occurrences(
            pool, target, clock.now() - timedelta(seconds=10), random.choice(["skip_if_running", "queue_one"]), 3
        )
        schedules[schedule_id] = messages
    gates = [OverlapGate(pool, clock=clock) for _ in range(6)]
    reports = await asyncio.gather(*(gate.run_once() for gate in gates for _ in range(2)))
    dispatched = [occ for report in reports for occ in report.dispatched]
    assert len(dispatched) == len(set(dispatched)) == 20
    for schedule_id, messages in schedules.items():
        ids = {m.occurrence_id for m in messages}
        assert len(ids & set(dispatched)) == 1
        in_flight = await pool.fetchval(
            "SELECT count(*) FROM occurrences WHERE schedule_id = $1 AND dispatched_at IS NOT NULL", schedule_id
        )
        assert in_flight == 1

"""The overlap gate is fair and bounded: blocked queue_one schedules never hide others, and it sleeps when
nothing can move (real PostgreSQL, manual clock)."""

from __future__ import annotations

from datetime import timedelta

from engine.loops.overlap_gate import OVERLAP_GATE_TOKEN, OverlapGate, OverlapGateConfig
from tests.support.rows import insert_occurrence, insert_schedule, occurrence_row


async def hold(pool, messages) -> None:
    """Held for the gate, as the materializer writes the rows of overlap-policy schedules."""
    await pool.execute(
        "UPDATE outbox SET claim_token = $2, claim_expires_at = 'infinity' WHERE occurrence_id = ANY($1)",
        [m.occurrence_id for m in messages],
        OVERLAP_GATE_TOKEN,
    )


async def test_blocked_queue_one_schedules_never_hide_another_schedules_held_row(pool, clock, target):
    """Why: "Overlap gate starvation". More blocked queue_one schedules than a batch (each with an occurrence
    in flight and one row waiting, due earlier) used to fill every pass: the other schedule's row waited
    for ever and the gate ran pass after pass without sleeping."""
    gate = OverlapGate(pool, OverlapGateConfig(batch_size=200), clock)
    now = clock.now()
    blocked = []
    for i in range(210):
        schedule_id = await insert_schedule(pool, "acme", target, now, overlap="queue_one")
        await insert_occurrence(pool, schedule_id, "acme", target, now - timedelta(minutes=10), state="ENQUEUED")
        waiting = await insert_occurrence(pool, schedule_id, "acme", target, now - timedelta(minutes=5, seconds=i))
        blocked.append(waiting)
    await hold(pool, blocked)
    other_id = await insert_schedule(pool, "acme", target, now, overlap="queue_one")
    other = await insert_occurrence(pool, other_id, "acme", target, now - timedelta(seconds=1))
    await hold(pool, [other])

    outcome = await gate.run_pass()

    assert (await occurrence_row(pool, other.occurrence_id))["dispatched_at"] == now  # not starved
    assert outcome.counts["dispatched"] == 1 and not outcome.more
    again = await gate.run_pass()
    assert again.counts == {"dispatched": 0, "skipped": 0, "held": 0} and not again.more  # sleeps
    for waiting in blocked[:3]:
        row = await occurrence_row(pool, waiting.occurrence_id)
        assert (row["state"], row["dispatched_at"]) == ("SCHEDULED", None)  # still waiting, not dropped


async def test_a_blocked_schedule_is_decided_again_once_its_occurrence_finished(pool, clock, target):
    gate = OverlapGate(pool, clock=clock)
    now = clock.now()
    schedule_id = await insert_schedule(pool, "acme", target, now, overlap="queue_one")
    running = await insert_occurrence(pool, schedule_id, "acme", target, now - timedelta(minutes=1), state="ENQUEUED")
    waiting = await insert_occurrence(pool, schedule_id, "acme", target, now - timedelta(seconds=30))
    extra = await insert_occurrence(pool, schedule_id, "acme", target, now - timedelta(seconds=10))
    await hold(pool, [waiting, extra])
    report = await gate.run_once()  # two waiting: the newer one is skipped, one keeps its place
    assert (report.dispatched, report.skipped) == ([], [extra.occurrence_id])
    assert (await gate.run_once()).schedules == 0  # blocked: not looked at again
    await pool.execute("UPDATE occurrences SET state = 'SUCCEEDED' WHERE occurrence_id = $1", running.occurrence_id)
    assert (await gate.run_once()).dispatched == [waiting.occurrence_id]

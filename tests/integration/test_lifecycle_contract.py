"""The lifecycle contract (docs/state-machine.md, "Changes, restarts and rebalances"), cell by cell.

Each test is named after a cell of the table: the occurrence state in the
name, the operation as the parameter (``test_possibly_published[pause]``).
Occurrences get into their state through the real components' interfaces —
the materializer, the relay's outbox store (claim, mark sent), attempt
events — on real PostgreSQL with the manual clock; then the operation runs
through the control plane, and the test checks the occurrence, the API's
answer and what the materializer does with the slot afterwards.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engine.control.dead_letters import replay_dead_letter
from engine.control.schedules import ControlPlane
from engine.loops.attempt_processor import AttemptProcessor
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.shard_leases import ShardLeaseConfig, ShardLeases
from relay.ahead_lane import AheadLaneStore
from relay.outbox import Claim, OutboxStore
from schemas.attempt_events import AttemptEvent as Ev
from schemas.dispatch_lanes import LANES
from schemas.errors import Conflict
from schemas.identity import occurrence_id
from schemas.shard_ownership import ShardOwnership

SLOT = datetime(2026, 11, 29, 10, 1, tzinfo=UTC)  # the first fire of an every-minute schedule created at 10:00
NEXT = SLOT + timedelta(minutes=1)
TTL = 30.0
CHANGES = ("update", "pause", "cancel")


@pytest.fixture
async def control(pool, clock, acme):
    return ControlPlane(pool, clock)


@pytest.fixture
def processor(pool, clock):
    return AttemptProcessor(pool, clock=clock, rng=random.Random(3))


def materializer(pool, clock) -> Materializer:
    return Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)


async def change(control, kind: str, schedule_id: str) -> dict:
    if kind == "update":
        return await control.update_schedule("acme", schedule_id, {"payload": {"plan": "pro"}})
    return await {"pause": control.pause_schedule, "cancel": control.cancel_schedule}[kind]("acme", schedule_id)


async def first_slot(control, pool, clock, target, **definition) -> tuple[str, uuid.UUID]:
    """An every-minute schedule whose 10:01 slot is materialized (version 1, SCHEDULED, not due yet)."""
    schedule = await control.create_schedule(
        "acme", {"kind": "cron", "expression": "* * * * *", "target": target, **definition}
    )
    clock.advance(timedelta(seconds=45))  # 10:00:45: 10:01 within the 30 s horizon
    assert (await materializer(pool, clock).run_once()).occurrences == 1
    return schedule["schedule_id"], occurrence_id(uuid.UUID(schedule["schedule_id"]), 1, SLOT)


async def publish(pool, clock, *, mark: bool = True):
    """The relay's two steps at 10:01: claim the due row; mark it sent (after the broker's ack) if ``mark``."""
    clock.set(SLOT)
    store = OutboxStore(pool, clock)
    claim = await store.claim(100, timedelta(seconds=60))  # the schedule-state message comes along
    claim = Claim(claim.token, [row for row in claim.rows if row.occurrence_id is not None])
    assert len(claim.rows) == 1
    if mark:
        await store.mark_sent(claim.token, [row.id for row in claim.rows])
    return store, claim


async def occurrence(pool, ident) -> dict:
    row = await pool.fetchrow("SELECT * FROM occurrences WHERE occurrence_id = $1", ident)
    return dict(row) if row else {}


async def slot_holders(pool, schedule_id, at=SLOT) -> list[tuple[int, str]]:
    """(version, state) of every occurrence of one slot, oldest version first."""
    rows = await pool.fetch(
        "SELECT schedule_version, state FROM occurrences WHERE schedule_id = $1::uuid AND scheduled_for = $2"
        " ORDER BY schedule_version",
        schedule_id,
        at,
    )
    return [(r["schedule_version"], r["state"]) for r in rows]


async def then_materialize(control, pool, clock, kind: str, schedule_id: str) -> None:
    """After the change: resume a paused schedule, and let the materializer run at the current instant."""
    if kind == "pause":
        await control.resume_schedule("acme", schedule_id)
    await materializer(pool, clock).run_once()


def report(answer: dict) -> tuple[int, int, int]:
    return answer["canceled_occurrences"], answer["released_slots"], answer["still_running"]


# -- SCHEDULED, never published -------------------------------------------------------------------


@pytest.mark.parametrize("kind", CHANGES)
async def test_scheduled_unpublished(kind, control, pool, clock, target):
    """CANCELED by the new version, slot released: the new version runs the instant (cancel: nothing runs)."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    answer = await change(control, kind, schedule_id)
    assert report(answer) == (1, 1, 0)
    old = await occurrence(pool, ident)
    assert (old["state"], old["canceled_by_version"], old["slot_released_at"]) == ("CANCELED", 2, clock.now())
    assert await pool.fetchval("SELECT discarded_at FROM outbox WHERE occurrence_id = $1", ident) == clock.now()
    if kind == "cancel":
        assert answer["next_run_at"] is None
        return
    assert answer["next_run_at"] == "2026-11-29T10:01:00Z"  # rewound to the released slot
    await then_materialize(control, pool, clock, kind, schedule_id)
    new_version = 2 if kind == "update" else 3
    assert await slot_holders(pool, schedule_id) == [(1, "CANCELED"), (new_version, "SCHEDULED")]


@pytest.mark.parametrize("kind", CHANGES)
async def test_scheduled_due_in_the_relay_backlog(kind, control, pool, clock, target):
    """Due, not yet claimed (the relay is behind): never published, so it is released like any other."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    clock.set(SLOT + timedelta(seconds=20))
    answer = await change(control, kind, schedule_id)
    assert report(answer) == (1, 1, 0)
    if kind != "cancel":
        await then_materialize(control, pool, clock, kind, schedule_id)
        holders = await slot_holders(pool, schedule_id)
        assert holders[-1] == (2 if kind == "update" else 3, "SCHEDULED")  # 20 s late: on time, it runs


# -- possibly published: SCHEDULED with a delivery claimed, acknowledged or failed ----------------


@pytest.mark.parametrize("kind", CHANGES)
async def test_possibly_published(kind, control, pool, clock, target):
    """A relay claimed the row (publish in flight, or acknowledged and not yet marked): the occurrence is
    still SCHEDULED, but it may reach a consumer. CANCELED, and it keeps its slot: never run again."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    store, claim = await publish(pool, clock, mark=False)
    assert (await occurrence(pool, ident))["state"] == "SCHEDULED"

    answer = await change(control, kind, schedule_id)

    assert report(answer) == (1, 0, 0)
    old = await occurrence(pool, ident)
    assert (old["state"], old["canceled_by_version"], old["slot_released_at"]) == ("CANCELED", 2, None)
    if kind == "pause":
        assert answer["next_run_at"] == "2026-11-29T10:02:00Z"  # not rewound over it
    # The broker acknowledges after all: the row is recorded sent, and the occurrence stays CANCELED.
    assert (await store.mark_sent(claim.token, [row.id for row in claim.rows])).marked == 1
    assert (await occurrence(pool, ident))["state"] == "CANCELED"
    if kind == "cancel":
        return
    await then_materialize(control, pool, clock, kind, schedule_id)
    assert await slot_holders(pool, schedule_id) == [(1, "CANCELED")]
    # Even a cursor moved back over the slot cannot materialize it again: the slot index holds it. (The
    # schedule's own cursor, or its cohort's once it joined one again: migration 0026.)
    await pool.execute(
        "UPDATE schedules SET next_run_at = $2 WHERE schedule_id = $1::uuid AND cohort_id IS NULL", schedule_id, SLOT
    )
    await pool.execute(
        "UPDATE schedule_cohorts c SET next_run_at = $2 FROM schedules s"
        " WHERE s.schedule_id = $1::uuid AND c.cohort_id = s.cohort_id",
        schedule_id,
        SLOT,
    )
    assert (await materializer(pool, clock).run_once()).conflicts >= 1
    assert await slot_holders(pool, schedule_id) == [(1, "CANCELED")]


@pytest.mark.parametrize("kind", CHANGES)
async def test_possibly_published_after_a_failed_publish(kind, control, pool, clock, target):
    """A publish that timed out was released for a retry: its outcome is unknown, so it counts as published."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    store, claim = await publish(pool, clock, mark=False)
    await store.release(claim.token, [row.id for row in claim.rows], "KafkaTimeoutError")
    answer = await change(control, kind, schedule_id)
    assert report(answer) == (1, 0, 0)
    assert (await occurrence(pool, ident))["slot_released_at"] is None


# -- the ahead lane: SCHEDULED, never read by a relay, or in a sealed bucket (a relay may have read it) ----


async def first_slot_ahead(control, pool, clock, target, *, sealed_until: datetime) -> tuple[str, uuid.UUID]:
    """As :func:`first_slot`, on a node holding the shard leases: 10:01 goes to the ahead lane; then a relay
    seals both lanes up to ``sealed_until`` (it reads, and publishes, only rows of buckets before its seal)."""
    ownership = ShardOwnership("node-a")
    schedule = await control.create_schedule("acme", {"kind": "cron", "expression": "* * * * *", "target": target})
    clock.advance(timedelta(seconds=45))
    await ShardLeases(pool, ownership, ShardLeaseConfig(interval=1.0, lease_ttl=6.0, max_moves=256), clock).run_once()
    report = await Materializer(
        pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock, ownership=ownership
    ).run_once()
    assert (report.occurrences, report.ahead) == (1, 1)
    store = AheadLaneStore(pool, clock, "node-a")
    for lane in LANES:
        await store.seal(lane, ownership.snapshot(), sealed_until)
    return schedule["schedule_id"], occurrence_id(uuid.UUID(schedule["schedule_id"]), 1, SLOT)


async def ahead_row_discarded(pool, ident) -> bool:
    return await pool.fetchval("SELECT discarded_at IS NOT NULL FROM dispatch_queue WHERE occurrence_id = $1", ident)


@pytest.mark.parametrize("kind", CHANGES)
async def test_scheduled_unpublished_in_the_ahead_lane(kind, control, pool, clock, target):
    """In the ahead lane at or after its shard's seal: no relay has read it. CANCELED, its row discarded,
    slot released: the new version materializes the instant again."""
    schedule_id, ident = await first_slot_ahead(control, pool, clock, target, sealed_until=SLOT - timedelta(seconds=14))
    answer = await change(control, kind, schedule_id)
    assert report(answer) == (1, 1, 0)
    old = await occurrence(pool, ident)
    assert (old["state"], old["canceled_by_version"], old["slot_released_at"]) == ("CANCELED", 2, clock.now())
    assert await ahead_row_discarded(pool, ident)
    if kind == "cancel":
        return
    assert answer["next_run_at"] == "2026-11-29T10:01:00Z"
    await then_materialize(control, pool, clock, kind, schedule_id)
    assert await slot_holders(pool, schedule_id) == [(1, "CANCELED"), (2 if kind == "update" else 3, "SCHEDULED")]


@pytest.mark.parametrize("kind", CHANGES)
async def test_possibly_published_in_the_ahead_lane(kind, control, pool, clock, target):
    """In a sealed bucket of the ahead lane: a relay may have read the row, and a relay publishes what it
    read even if the row is discarded meanwhile (its cursor has not passed it: nothing is acknowledged yet).
    Still SCHEDULED, but possibly published: CANCELED, keeps its slot, never materialized again under a new
    occurrence id. (Judged by the cursor alone, it was released and ran twice.)"""
    schedule_id, ident = await first_slot_ahead(control, pool, clock, target, sealed_until=SLOT + timedelta(seconds=1))
    answer = await change(control, kind, schedule_id)
    assert report(answer) == (1, 0, 0)
    old = await occurrence(pool, ident)
    assert (old["state"], old["canceled_by_version"], old["slot_released_at"]) == ("CANCELED", 2, None)
    assert await ahead_row_discarded(pool, ident)  # a relay that has not read it yet skips it
    if kind == "cancel":
        return
    if kind == "pause":
        assert answer["next_run_at"] == "2026-11-29T10:02:00Z"  # not rewound over it
    await then_materialize(control, pool, clock, kind, schedule_id)
    assert await slot_holders(pool, schedule_id) == [(1, "CANCELED")]


# -- ENQUEUED ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", CHANGES)
async def test_enqueued(kind, control, pool, clock, target):
    """In Kafka: CANCELED (consumers skip the obsolete version), keeps its slot."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    await publish(pool, clock)
    assert (await occurrence(pool, ident))["state"] == "ENQUEUED"
    answer = await change(control, kind, schedule_id)
    assert report(answer) == (1, 0, 0)
    old = await occurrence(pool, ident)
    assert (old["state"], old["canceled_by_version"], old["slot_released_at"]) == ("CANCELED", 2, None)
    if kind != "cancel":
        await then_materialize(control, pool, clock, kind, schedule_id)
        assert await slot_holders(pool, schedule_id) == [(1, "CANCELED")]


# -- RUNNING -------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
@pytest.mark.parametrize("kind", CHANGES)
async def test_running(kind, outcome, control, pool, clock, target, processor):
    """A worker holds the lease: not canceled (reported still_running). Its success counts; a failure is not
    retried (CANCELED: the version is obsolete). Either way the slot is its own: not run again."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    await publish(pool, clock)
    token = uuid.uuid4()
    await processor.apply_events([Ev.started(ident, 1, token, TTL)])

    answer = await change(control, kind, schedule_id)

    assert report(answer) == (0, 0, 1)
    assert (await occurrence(pool, ident))["state"] == "RUNNING"
    if outcome == "succeeded":
        await processor.apply_events([Ev.succeeded(ident, 1, token)])
        assert (await occurrence(pool, ident))["state"] == "SUCCEEDED"
    else:
        await processor.apply_events([Ev.failed(ident, 1, token, "E", "x")])
        assert (await occurrence(pool, ident))["state"] == "CANCELED"
        assert await pool.fetchval("SELECT count(*) FROM outbox WHERE occurrence_id = $1", ident) == 1  # no retry
    if kind != "cancel":
        await then_materialize(control, pool, clock, kind, schedule_id)
        assert len(await slot_holders(pool, schedule_id)) == 1


# -- RETRY_WAIT ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", CHANGES)
async def test_retry_wait(kind, control, pool, clock, target, processor):
    """Attempt 1 ran and failed: CANCELED, its pending retry discarded, the slot kept."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    await publish(pool, clock)
    token = uuid.uuid4()
    await processor.apply_events([Ev.started(ident, 1, token, TTL), Ev.failed(ident, 1, token, "E", "x")])
    assert (await occurrence(pool, ident))["state"] == "RETRY_WAIT"

    answer = await change(control, kind, schedule_id)

    assert report(answer) == (1, 0, 0)
    old = await occurrence(pool, ident)
    assert (old["state"], old["canceled_by_version"], old["slot_released_at"]) == ("CANCELED", 2, None)
    retry = await pool.fetchrow(
        "SELECT sent_at, discarded_at FROM outbox WHERE occurrence_id = $1 ORDER BY id DESC", ident
    )
    assert retry["sent_at"] is None and retry["discarded_at"] is not None
    if kind != "cancel":
        await then_materialize(control, pool, clock, kind, schedule_id)
        assert await slot_holders(pool, schedule_id) == [(1, "CANCELED")]


# -- terminal ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", CHANGES)
async def test_terminal(kind, control, pool, clock, target, processor):
    """SUCCEEDED (and every final state, and DEAD) stays as it is; the slot is not run again."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    await publish(pool, clock)
    token = uuid.uuid4()
    await processor.apply_events([Ev.started(ident, 1, token, TTL), Ev.succeeded(ident, 1, token)])
    answer = await change(control, kind, schedule_id)
    assert report(answer) == (0, 0, 0)
    old = await occurrence(pool, ident)
    assert (old["state"], old["canceled_by_version"]) == ("SUCCEEDED", None)
    if kind != "cancel":
        await then_materialize(control, pool, clock, kind, schedule_id)
        assert await slot_holders(pool, schedule_id) == [(1, "SUCCEEDED")]


# -- resume --------------------------------------------------------------------------------------


async def test_resume_running(control, pool, clock, target, processor):
    """Pause left a RUNNING occurrence alone; resume does too, and the slot is not run again."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    await publish(pool, clock)
    token = uuid.uuid4()
    await processor.apply_events([Ev.started(ident, 1, token, TTL)])
    await control.pause_schedule("acme", schedule_id)
    answer = await control.resume_schedule("acme", schedule_id)
    assert report(answer) == (0, 0, 1) and answer["next_run_at"] == "2026-11-29T10:02:00Z"
    await materializer(pool, clock).run_once()
    assert await slot_holders(pool, schedule_id) == [(1, "RUNNING")]
    await processor.apply_events([Ev.succeeded(ident, 1, token)])
    assert (await occurrence(pool, ident))["state"] == "SUCCEEDED"


async def test_resume_continues_from_the_durable_cursor(control, pool, clock, target):
    """Resumed after 5 minutes: from the cursor, each missed instant recorded, the latest run once."""
    schedule_id, ident = await first_slot(control, pool, clock, target, misfire_policy="fire_once")
    await control.pause_schedule("acme", schedule_id)
    clock.set(SLOT + timedelta(minutes=5, seconds=10))  # 10:06:10
    answer = await control.resume_schedule("acme", schedule_id)
    assert answer["next_run_at"] == "2026-11-29T10:01:00Z"
    await materializer(pool, clock).run_once()
    rows = await pool.fetch(
        "SELECT scheduled_for, schedule_version, state FROM occurrences WHERE schedule_id = $1::uuid"
        " AND schedule_version = 3 ORDER BY scheduled_for",
        schedule_id,
    )
    assert [(r["scheduled_for"].minute, r["state"]) for r in rows] == [
        (1, "MISSED"),
        (2, "MISSED"),
        (3, "MISSED"),
        (4, "MISSED"),
        (5, "MISSED"),
        (6, "SCHEDULED"),  # on time (10 s late): runs; fire_once adds no catch-up run beside it
    ]


# -- update loses no slot ------------------------------------------------------------------------


async def test_update_continues_from_the_durable_cursor_and_records_what_fell_due(control, pool, clock, target):
    """Why: "Update loses slots". The materializer and the relay are behind: 10:01 is materialized but not
    published, 10:02 and 10:03 are not materialized at all, and an update comes at 10:03:30. Nothing
    vanishes: 10:01's v1 is CANCELED by v2 and every instant from the cursor is judged by the misfire
    policy (fire_once, 60 s lateness): 10:01 and 10:02 MISSED, 10:03 on time. (Before, the cursor jumped
    to the first fire after now, 10:04: three slots gone without a record.)"""
    schedule_id, ident = await first_slot(control, pool, clock, target, misfire_policy="fire_once")
    clock.set(SLOT + timedelta(minutes=2, seconds=30))  # 10:03:30
    answer = await control.update_schedule("acme", schedule_id, {"payload": {"plan": "pro"}})
    assert report(answer) == (1, 1, 0) and answer["next_run_at"] == "2026-11-29T10:01:00Z"
    await materializer(pool, clock).run_once()
    rows = await pool.fetch(
        "SELECT scheduled_for, schedule_version, state, canceled_by_version FROM occurrences"
        " WHERE schedule_id = $1::uuid ORDER BY scheduled_for, schedule_version",
        schedule_id,
    )
    assert [(r["scheduled_for"].minute, r["schedule_version"], r["state"], r["canceled_by_version"]) for r in rows] == [
        (1, 1, "CANCELED", 2),
        (1, 2, "MISSED", None),
        (2, 2, "MISSED", None),
        (3, 2, "SCHEDULED", None),
        (4, 2, "SCHEDULED", None),  # within the horizon
    ]


async def test_update_to_another_expression_continues_from_the_cursor(control, pool, clock, target):
    """A new expression's instants from the durable cursor follow the misfire policy; the old version's
    released slot that the new expression does not have stays recorded as CANCELED by v2."""
    schedule_id, ident = await first_slot(control, pool, clock, target, misfire_policy="skip")
    clock.set(SLOT + timedelta(minutes=3, seconds=10))  # 10:04:10
    answer = await control.update_schedule("acme", schedule_id, {"expression": "*/2 * * * *"})
    assert answer["next_run_at"] == "2026-11-29T10:02:00Z"
    await materializer(pool, clock).run_once()
    rows = await pool.fetch(
        "SELECT scheduled_for, schedule_version, state FROM occurrences WHERE schedule_id = $1::uuid"
        " ORDER BY scheduled_for, schedule_version",
        schedule_id,
    )
    assert [(r["scheduled_for"].minute, r["schedule_version"], r["state"]) for r in rows] == [
        (1, 1, "CANCELED"),
        (2, 2, "MISSED"),
        (4, 2, "SCHEDULED"),
    ]


# -- replay --------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["SCHEDULED", "ENQUEUED", "RUNNING", "RETRY_WAIT", "SUCCEEDED"])
async def test_replay_of_a_live_or_finished_occurrence(state, control, pool, clock, target, processor):
    """Only a dead letter can be replayed: any other state is a Conflict and nothing changes."""
    schedule_id, ident = await first_slot(control, pool, clock, target)
    token = uuid.uuid4()
    if state != "SCHEDULED":
        await publish(pool, clock)
    events = {
        "RUNNING": [Ev.started(ident, 1, token, TTL)],
        "RETRY_WAIT": [Ev.started(ident, 1, token, TTL), Ev.failed(ident, 1, token, "E", "x")],
        "SUCCEEDED": [Ev.started(ident, 1, token, TTL), Ev.succeeded(ident, 1, token)],
    }.get(state, [])
    await processor.apply_events(events)
    assert (await occurrence(pool, ident))["state"] == state
    with pytest.raises(Conflict, match="not DEAD"):
        await replay_dead_letter(pool, "acme", ident, clock)
    assert (await occurrence(pool, ident))["state"] == state


async def test_replay_of_a_dead_occurrence_of_an_older_version(control, pool, clock, target, processor):
    """DEAD, then the schedule changed: a replay would be skipped as obsolete, so it is refused."""
    schedule_id, ident = await first_slot(control, pool, clock, target, max_attempts=1)
    await publish(pool, clock)
    token = uuid.uuid4()
    await processor.apply_events([Ev.started(ident, 1, token, TTL), Ev.failed(ident, 1, token, "E", "x")])
    assert (await occurrence(pool, ident))["state"] == "DEAD"
    answer = await control.update_schedule("acme", schedule_id, {"payload": {"v": 2}})
    assert report(answer) == (0, 0, 0)
    with pytest.raises(Conflict, match="obsolete"):
        await replay_dead_letter(pool, "acme", ident, clock)
    replayed = await control.get_occurrence("acme", ident)
    assert replayed["state"] == "DEAD" and replayed["slot_released"] is False

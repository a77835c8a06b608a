"""The reconciler against real PostgreSQL: clean on a healthy history, and exactly the planted faults.

Schedules are created through the control plane and materialized by the
materializer under an injected clock; the reconciler then recomputes the
window from the version history alone.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engine.control.reconciler import ConsumerCheck, ReconcileOptions, Window, reconcile
from engine.control.schedules import ControlPlane
from engine.loops.materializer import Materializer, MaterializerConfig
from schemas.clock import ManualClock
from schemas.connections import connect
from schemas.identity import occurrence_id
from schemas.migrations import apply_migrations

UTC = UTC
START = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
async def tenants(pool):
    from engine.control.tenants import create_tenant

    for name in ("acme", "globex"):
        await create_tenant(pool, name)


async def advance(
    materializer: Materializer, clock: ManualClock, until: datetime, step: timedelta = timedelta(seconds=10)
) -> None:
    """Run the materializer as the clock moves to ``until`` (a healthy engine: a pass every ``step``)."""
    while clock.now() < until:
        clock.advance(min(step, until - clock.now()))
        while (await materializer.run_once()).schedules:
            pass


async def healthy_history(pool, clock, target):
    """acme's schedules on ``target``, globex's on a target of its own."""
    control = ControlPlane(pool, clock)
    created = [
        await control.create_schedule(
            "acme", {"kind": "cron", "expression": "*/5 * * * *", "time_zone": "America/New_York", "target": target}
        ),
        await control.create_schedule(
            "acme", {"kind": "cron", "expression": "*/5 * * * *", "time_zone": "America/New_York", "target": target}
        ),
        await control.create_schedule(
            "globex",
            {"kind": "cron", "expression": "7,37 * * * *", "time_zone": "Asia/Kolkata", "target": f"{target}-globex"},
        ),
        await control.create_schedule("acme", {"kind": "rate", "expression": "7m", "target": target}),
        await control.create_schedule(
            "globex",
            {
                "kind": "rate",
                "expression": "90s",
                "target": f"{target}-globex",  # a target is one tenant's unless granted (docs/security.md)
                "start_at": "2026-11-29T10:20:00Z",
                "end_at": "2026-11-29T10:50:00Z",
            },
        ),
        await control.create_schedule("acme", {"kind": "once", "expression": "2026-11-29T10:33:20Z", "target": target}),
    ]
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    await advance(materializer, clock, START + timedelta(hours=1))
    return control, materializer, created


WINDOW = Window(START, START + timedelta(hours=1))


async def test_a_healthy_history_reconciles_clean_with_exact_counts(pool, clock, target):
    await healthy_history(pool, clock, target)
    report = await reconcile(pool, WINDOW, clock=clock)
    # */5 from 10:05 (created at 10:00, strictly after): 10:05..10:55 = 11, twice; 7,37 -> 10:07, 10:37 = 2;
    # rate 7m anchored at creation (10:00): 10:07..10:56 = 8; rate 90s also anchored at 10:00, within
    # start_at..end_at 10:20..10:50: 10:21:00..10:49:30 = 20;
    # once = 1.
    assert report.counts["expected"] == 11 + 11 + 2 + 8 + 20 + 1
    assert report.counts["present"] == report.counts["expected"]
    assert (
        report.counts["missing"],
        report.counts["unexpected"],
        report.counts["duplicate_slots"],
        report.counts["policy_violations"],
    ) == (0, 0, 0, 0)
    assert report.clean and [o for o in report.offenders if o.kind != "stuck"] == []
    # No relay ran: everything is still SCHEDULED, and what has waited over ten minutes is reported stuck.
    assert report.states == {"SCHEDULED": report.counts["expected"]}
    assert report.counts["unfinished"] == report.counts["expected"]
    assert report.counts["stuck"] == await pool.fetchval(
        "SELECT count(*) FROM occurrences WHERE updated_at < $1", START + timedelta(minutes=50)
    )
    assert report.counts["cron_rules"] == 2 and report.counts["rate_rules"] == 2
    stored = await pool.fetchrow("SELECT clean, counts FROM reconcile_runs WHERE run_id = $1", report.run_id)
    assert stored["clean"] and stored["counts"]["expected"] == report.counts["expected"]


async def test_a_tenant_filter_sees_only_that_tenant(pool, clock, target):
    await healthy_history(pool, clock, target)
    report = await reconcile(pool, WINDOW, tenant_id="globex", clock=clock, record=False)
    assert report.counts["expected"] == 2 + 20 and report.clean


async def test_planted_faults_are_reported_exactly(pool, clock, target):
    _, _, created = await healthy_history(pool, clock, target)
    cron, rate = created[0], created[3]
    # 1. delete one occurrence (and its outbox row): a lost slot.
    lost_at = datetime(2026, 11, 29, 10, 25, tzinfo=UTC)
    lost_id = occurrence_id(uuid.UUID(cron["schedule_id"]), 1, lost_at)
    await pool.execute("DELETE FROM outbox WHERE occurrence_id = $1", lost_id)
    assert await pool.execute("DELETE FROM occurrences WHERE occurrence_id = $1", lost_id) == "DELETE 1"
    # 2. a second live occurrence for a slot that already has one (another version's, never in the history).
    # The slot index (engine migration 0014) refuses a second holder, so the planted one claims to have
    # released its slot: a fault only a bypassed control plane can make, which the reconciler still reports.
    dup_at = datetime(2026, 11, 29, 10, 14, tzinfo=UTC)
    dup_id = occurrence_id(uuid.UUID(rate["schedule_id"]), 2, dup_at)
    await pool.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, state, slot_released_at) VALUES ($1, $2, 2, 'acme', $3, $4, $4, 'ENQUEUED', $4)",
        dup_id,
        uuid.UUID(rate["schedule_id"]),
        target,
        dup_at,
    )
    # 3. an occurrence at an instant the rule never fires.
    odd_at = datetime(2026, 11, 29, 10, 31, tzinfo=UTC)
    odd_id = occurrence_id(uuid.UUID(cron["schedule_id"]), 1, odd_at)
    await pool.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, state) VALUES ($1, $2, 1, 'acme', $3, $4, $4, 'SUCCEEDED')",
        odd_id,
        uuid.UUID(cron["schedule_id"]),
        target,
        odd_at,
    )

    report = await reconcile(pool, WINDOW, clock=clock)
    assert not report.clean
    assert report.counts["missing"] == 1 and report.reasons["missing"] == {"lost": 1}
    assert report.counts["duplicate_slots"] == 1
    assert report.counts["unexpected"] == 2
    assert report.reasons["unexpected"] == {"unknown_version": 1, "not_a_fire_time": 1}
    kinds = {(o.kind, o.reason, o.scheduled_for) for o in report.offenders}
    assert ("missing", "lost", lost_at) in kinds
    assert ("unexpected", "unknown_version", dup_at) in kinds
    assert ("unexpected", "not_a_fire_time", odd_at) in kinds
    assert ("duplicate_slot", "2 occurrences may run", dup_at) in kinds
    assert await pool.fetchval("SELECT clean FROM reconcile_runs WHERE run_id = $1", report.run_id) is False


async def test_versions_pause_resume_update_cancel_are_followed(pool, clock, target):
    control = ControlPlane(pool, clock)
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    paused = await control.create_schedule(
        "acme", {"kind": "cron", "expression": "* * * * *", "target": target, "misfire_policy": "skip"}
    )
    updated = await control.create_schedule("acme", {"kind": "rate", "expression": "2m", "target": target})
    canceled = await control.create_schedule("acme", {"kind": "cron", "expression": "*/3 * * * *", "target": target})
    await advance(materializer, clock, START + timedelta(minutes=10, seconds=40))
    # What was due has run (no relay or consumer here: the test says so directly).
    await pool.execute("UPDATE occurrences SET state = 'SUCCEEDED' WHERE scheduled_for <= $1", clock.now())
    await control.pause_schedule("acme", paused["schedule_id"])  # 10:10:40; 10:11 was materialized ahead
    await control.update_schedule("acme", updated["schedule_id"], {"expression": "5m"})
    await advance(materializer, clock, START + timedelta(minutes=20, seconds=40))
    await control.resume_schedule("acme", paused["schedule_id"])  # 10:20:40: 10:11..10:19 are late
    await control.cancel_schedule("acme", canceled["schedule_id"])
    await advance(materializer, clock, START + timedelta(hours=1))

    report = await reconcile(pool, WINDOW, clock=clock)
    assert report.clean, report.lines()
    minutely = await pool.fetch(
        "SELECT scheduled_for, schedule_version, state FROM occurrences"
        " WHERE schedule_id = $1 ORDER BY scheduled_for, schedule_version",
        uuid.UUID(paused["schedule_id"]),
    )
    # v1 10:01..10:11 (10:11 CANCELED by the pause, which rewinds the cursor to it); v3 (the resume)
    # records 10:11..10:19 MISSED (skip, 1 minute of lateness) and runs 10:20 on.
    assert [(r["schedule_version"], r["state"]) for r in minutely if r["scheduled_for"].minute == 11] == [
        (1, "CANCELED"),
        (3, "MISSED"),
    ]
    # Accounted for without running: the 9 MISSED; */3's 10:12, 10:15, 10:18, still unpublished (no relay
    # here) when the cancel CANCELED them; and the two slots materialized ahead of a change and CANCELED by
    # it (the minutely v1 10:11, */3's 10:21).
    assert report.states["MISSED"] == 9 and report.counts["accounted"] == 9 + 3 + 2
    # Every minute 10:01..10:59 once + rate 2m 10:02..10:10 (5), then 5m anchored at the update, 10:15:40..
    # 10:55:40 (9) + */3 10:03..10:18 (6; 10:21 was materialized ahead and CANCELED by the cancel).
    assert report.counts["expected"] == 59 + 5 + 9 + 6


async def test_a_slot_the_materializer_has_not_reached_is_pending_not_lost(pool, clock, target):
    control = ControlPlane(pool, clock)
    await control.create_schedule("acme", {"kind": "cron", "expression": "* * * * *", "target": target})
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    await advance(materializer, clock, START + timedelta(minutes=30))
    clock.advance(timedelta(minutes=30))  # the engine is down from 10:30
    report = await reconcile(pool, WINDOW, clock=clock)
    assert report.counts["pending"] == 29 and report.counts["missing"] == 0 and report.clean
    assert report.counts["expected"] == 59 and report.counts["present"] == 30


async def test_a_slot_summarized_as_a_missed_range_is_accounted_for(pool, clock, target):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        "acme", {"kind": "rate", "expression": "1m", "target": target, "misfire_policy": "skip"}
    )
    clock.advance(timedelta(minutes=40))  # outage 10:00 - 10:40
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30), missed_record_limit=5), clock)
    await materializer.run_once()
    await advance(materializer, clock, START + timedelta(hours=1))
    # 10:01..10:38 are late (skip): 10:01..10:05 recorded MISSED, 10:06..10:38 summarised by the materializer as
    # one missed_ranges row in the same transaction, never enumerated.
    ranges = await pool.fetch("SELECT first_missed, last_missed, missed_count FROM missed_ranges")
    assert [tuple(r) for r in ranges] == [(START + timedelta(minutes=6), START + timedelta(minutes=38), 33)]
    after = await reconcile(pool, WINDOW, clock=clock, record=False)
    assert after.clean and after.counts["summarized"] == 33 and after.counts["missing"] == 0
    # without the range those slots would be lost: the reconciler proves the row is what accounts for them
    await pool.execute("DELETE FROM missed_ranges WHERE schedule_id = $1", uuid.UUID(schedule["schedule_id"]))
    before = await reconcile(pool, WINDOW, clock=clock, record=False)
    assert before.reasons["missing"] == {"lost": 33}


async def test_a_misfire_decision_that_enqueues_too_many_late_slots_is_a_violation(pool, clock, target):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        "acme", {"kind": "rate", "expression": "1m", "target": target, "misfire_policy": "catch_up:2"}
    )
    clock.advance(timedelta(minutes=20))
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    await advance(materializer, clock, START + timedelta(hours=1))
    assert (await reconcile(pool, WINDOW, clock=clock, record=False)).clean  # 2 late slots enqueued: allowed
    sid = uuid.UUID(schedule["schedule_id"])
    await pool.execute(
        "UPDATE occurrences SET state = 'SUCCEEDED' WHERE schedule_id = $1 AND state = 'MISSED' AND scheduled_for = $2",
        sid,
        START + timedelta(minutes=5),
    )
    report = await reconcile(pool, WINDOW, clock=clock, record=False)
    assert report.counts["policy_violations"] == 1
    (offender,) = [o for o in report.offenders if o.kind == "policy_violation"]
    assert offender.reason == "catch_up:2 enqueued 3 late (allows 2)"


async def test_stuck_occurrences_are_listed(pool, clock, target):
    await healthy_history(pool, clock, target)
    await pool.execute("UPDATE occurrences SET state = 'SUCCEEDED'")
    await pool.execute(
        "UPDATE occurrences SET state = 'ENQUEUED', updated_at = $1 WHERE scheduled_for = '2026-11-29T10:05:00Z'",
        START + timedelta(minutes=5),
    )
    report = await reconcile(
        pool, WINDOW, clock=clock, options=ReconcileOptions(stuck_after=timedelta(minutes=10)), record=False
    )
    assert report.counts["stuck"] == 2 and report.clean  # reported, not a broken promise by itself
    assert {o.state for o in report.offenders if o.kind == "stuck"} == {"ENQUEUED"}


async def test_the_effects_check_finds_an_effect_removed_and_an_effect_doubled(pool, clock, target, consumer_db):
    await healthy_history(pool, clock, target)
    # The consumer applied everything of the window: SUCCEEDED in the engine, a dedupe row each.
    await pool.execute("UPDATE occurrences SET state = 'SUCCEEDED'")
    rows = await pool.fetch(
        "SELECT occurrence_id, schedule_id, schedule_version, tenant_id, scheduled_for"
        " FROM occurrences WHERE scheduled_for < $1 ORDER BY scheduled_for",
        WINDOW.end,
    )
    app = await connect(consumer_db)
    try:
        await apply_migrations(app, "consumer")
        await app.executemany(
            "INSERT INTO chronoq_consumer_dedupe (consumer_group, occurrence_id, schedule_id, schedule_version,"
            " tenant_id, scheduled_for) VALUES ('billing', $1, $2, $3, $4, $5)",
            [tuple(r) for r in rows],
        )
        check = ConsumerCheck(consumer_db)
        assert (await reconcile(pool, WINDOW, clock=clock, consumer=check, record=False)).clean
        removed = rows[3]
        await app.execute("DELETE FROM chronoq_consumer_dedupe WHERE occurrence_id = $1", removed["occurrence_id"])
        doubled = rows[7]
        # A second effect of one slot, as applied before consumer migration 0003 (which marks it superseded
        # and keeps it out of the slot index): the reconciler still reports it.
        await app.execute(
            "INSERT INTO chronoq_consumer_dedupe (consumer_group, occurrence_id, schedule_id, schedule_version,"
            " tenant_id, scheduled_for, superseded) VALUES ('billing', $1, $2, 2, $3, $4, true)",
            occurrence_id(doubled["schedule_id"], 2, doubled["scheduled_for"]),
            doubled["schedule_id"],
            doubled["tenant_id"],
            doubled["scheduled_for"],
        )
        report = await reconcile(pool, WINDOW, clock=clock, consumer=check, record=False)
    finally:
        await app.close()
    assert report.counts["effects_never_applied"] == 1
    assert report.counts["effects_applied_twice"] == 1
    assert report.counts["effects_applied_unknown"] == 1  # the doubled one's occurrence does not exist
    assert report.counts["effects_checked"] == len(rows)
    found = {(o.reason, o.scheduled_for) for o in report.offenders if o.kind == "effect"}
    assert found == {
        ("never_applied", removed["scheduled_for"]),
        ("applied_twice", doubled["scheduled_for"]),
        ("applied_unknown", doubled["scheduled_for"]),
    }
    assert not report.clean


async def test_effects_of_occurrences_never_to_run_fail_and_after_a_cancel_are_counted(
    pool, clock, target, consumer_db
):
    await healthy_history(pool, clock, target)
    rows = await pool.fetch(
        "SELECT occurrence_id, schedule_id, schedule_version, tenant_id, scheduled_for"
        " FROM occurrences WHERE scheduled_for < $1 ORDER BY scheduled_for",
        WINDOW.end,
    )
    await pool.execute("UPDATE occurrences SET state = 'SUCCEEDED'")
    app = await connect(consumer_db)
    try:
        await apply_migrations(app, "consumer")
        await app.executemany(
            "INSERT INTO chronoq_consumer_dedupe (consumer_group, occurrence_id, schedule_id, schedule_version,"
            " tenant_id, scheduled_for) VALUES ('billing', $1, $2, $3, $4, $5)",
            [tuple(r) for r in rows],
        )
        # A pause raced the consumer: the engine CANCELED what the consumer was already applying.
        await pool.execute(
            "UPDATE occurrences SET state = 'CANCELED' WHERE occurrence_id = $1", rows[2]["occurrence_id"]
        )
        raced = await reconcile(pool, WINDOW, clock=clock, consumer=ConsumerCheck(consumer_db), record=False)
        assert raced.counts["effects_applied_after_cancel"] == 1 and raced.clean
        # Applied although it was MISSED (never published): a broken promise.
        await pool.execute("UPDATE occurrences SET state = 'MISSED' WHERE occurrence_id = $1", rows[5]["occurrence_id"])
        broken = await reconcile(pool, WINDOW, clock=clock, consumer=ConsumerCheck(consumer_db), record=False)
    finally:
        await app.close()
    assert broken.counts["effects_applied_not_to_run"] == 1 and not broken.clean
    assert {(o.reason, o.scheduled_for) for o in broken.offenders if o.kind == "effect"} == {
        ("applied_after_cancel", rows[2]["scheduled_for"]),
        ("applied_not_to_run", rows[5]["scheduled_for"]),
    }


async def test_backfilled_and_manual_occurrences_are_requests_not_anomalies(pool, clock, target):
    from engine.control.requested_occurrences import RequestedOccurrences

    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        "acme", {"kind": "cron", "expression": "* * * * *", "target": target, "misfire_policy": "skip"}
    )
    clock.advance(timedelta(minutes=20))  # the engine was down 10:00 - 10:20: 10:01 .. 10:18 are MISSED
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    await advance(materializer, clock, START + timedelta(minutes=25))
    requests = RequestedOccurrences(pool, clock)
    # Before the schedule existed (its version's cursor is 10:01) and over the missed minutes.
    result = await requests.backfill(
        "acme", schedule["schedule_id"], START - timedelta(minutes=30), START + timedelta(minutes=15), "tenant:acme"
    )
    assert (result.created, result.refired) == (31, 15)
    await requests.trigger_now("acme", schedule["schedule_id"], "tenant:acme")
    await advance(materializer, clock, START + timedelta(hours=1))
    window = Window(START - timedelta(hours=1), START + timedelta(hours=1))
    report = await reconcile(pool, window, clock=clock, record=False)
    assert report.clean, report.lines()
    assert (report.counts["backfilled"], report.counts["manual"]) == (31 + 15, 1)
    assert report.counts["policy_violations"] == 0  # refired MISSED slots are a request, not a misfire decision
    # An occurrence before the version's cursor that no backfill asked for is still unexpected.
    sid = uuid.UUID(schedule["schedule_id"])
    stray = START - timedelta(minutes=45)
    await pool.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, state) VALUES ($1, $2, 1, 'acme', $3, $4, $4, 'SUCCEEDED')",
        occurrence_id(sid, 1, stray),
        sid,
        target,
        stray,
    )
    broken = await reconcile(pool, window, clock=clock, record=False)
    assert broken.reasons["unexpected"] == {"before_version_cursor": 1}


async def test_slots_an_exclusion_calendar_removed_and_runs_after_max_runs_are_not_missing(pool, clock, target):
    from engine.control.calendars import Calendars

    calendars = Calendars(pool, clock)
    await calendars.create_calendar("acme", {"name": "quiet-sunday", "time_zone": "UTC", "dates": ["2026-11-29"]})
    control = ControlPlane(pool, clock)
    quiet = await control.create_schedule(
        "acme", {"kind": "cron", "expression": "*/5 * * * *", "target": target, "exclusion_calendar": "quiet-sunday"}
    )
    await control.create_schedule("acme", {"kind": "rate", "expression": "10m", "target": target, "max_runs": 3})
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    await advance(materializer, clock, START + timedelta(minutes=30))
    await calendars.update_calendar("acme", "quiet-sunday", {"dates": []})  # 10:30: the day fires again
    await advance(materializer, clock, START + timedelta(hours=1))

    report = await reconcile(pool, WINDOW, clock=clock, record=False)
    assert report.clean, report.lines()
    # */5: 10:05 .. 10:25 excluded by version 1; 10:30 decided while version 1 was in force, judged at
    # version 2: uncertain; 10:35 .. 10:55 must run. The rate ran 10:10, 10:20, 10:30 and completed.
    assert (report.counts["excluded"], report.counts["uncertain"]) == (5, 1)
    assert report.counts["expected"] == 5 + 5 and report.counts["present"] == 5 + 3
    assert report.counts["after_completion"] == 2 and report.counts["missing"] == 0
    sid = uuid.UUID(quiet["schedule_id"])
    ran = START + timedelta(minutes=15)
    await pool.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, state) VALUES ($1, $2, 1, 'acme', $3, $4, $4, 'SUCCEEDED')",
        occurrence_id(sid, 1, ran),
        sid,
        target,
        ran,
    )
    broken = await reconcile(pool, WINDOW, clock=clock, record=False)
    assert broken.reasons["unexpected"] == {"excluded_slot_ran": 1}

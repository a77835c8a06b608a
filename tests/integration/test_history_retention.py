"""History retention on real PostgreSQL: several simulated days materialized under an injected clock, run
(their states written as a consumer's attempts would leave them), then pruned.

A prune moves exactly the finished occurrences older than their tenant's retention, with their attempts,
into the archive; keeps every not-final (and DEAD) one and every one still in a handoff; the listings and
the reconciler read the archive, and the reconciler says which part of its window is archived.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest

from engine.control.history_retention import prune, retention_policy, set_retention
from engine.control.reconciler import Window, reconcile
from engine.control.requested_occurrences import RequestedOccurrences
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.rules.occurrence_states import TERMINAL
from schemas import observability as obs
from schemas.clock import ManualClock
from schemas.errors import InvalidInput
from schemas.identity import occurrence_id

START = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)
DAYS = 4
FINAL = {state.value for state in TERMINAL}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


async def simulated_days(
    pool, clock: ManualClock, target: str, before_each_step: Callable[[], Awaitable[object]] | None = None
) -> dict[str, list[str]]:
    """Hourly and quarter-hourly schedules of acme and globex over DAYS days, materialized as the clock moves,
    then 'run': everything before the last hour SUCCEEDED with one attempt (two for every fifth), except a
    planted few that stay in flight, die, or keep a pending handoff."""
    for name in ("acme", "globex"):
        await create_tenant(pool, name)
    control = ControlPlane(pool, clock)
    created: dict[str, list[str]] = {"acme": [], "globex": []}
    for tenant, expression in (("acme", "0 * * * *"), ("acme", "*/15 * * * *"), ("globex", "30 * * * *")):
        schedule = await control.create_schedule(
            tenant, {"kind": "cron", "expression": expression, "target": f"{target}-{tenant}"}
        )
        created[tenant].append(schedule["schedule_id"])
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(hours=1)), clock)
    while clock.now() < START + timedelta(days=DAYS):
        clock.advance(timedelta(minutes=30))
        if before_each_step is not None:  # the engine's other periodic work (the partitions ahead)
            await before_each_step()
        while (await materializer.run_once()).schedules:
            pass
    ran_before = clock.now() - timedelta(hours=1)
    # The relay published and settled everything due (test data: the handoff rows as a relay leaves them).
    await pool.execute("DELETE FROM dispatch_queue WHERE scheduled_for < $1", ran_before)
    await pool.execute("UPDATE outbox SET sent_at = scheduled_for WHERE scheduled_for < $1", ran_before)
    await pool.execute(
        "UPDATE occurrences SET state = 'SUCCEEDED', attempt_count = 1, finished_at = scheduled_for + interval '5 s'"
        " WHERE scheduled_for < $1 AND state = 'SCHEDULED'",
        ran_before,
    )
    await pool.execute(
        "INSERT INTO attempts (attempt_id, occurrence_id, attempt_number, lease_token, started_at, finished_at, result,"
        "                      scheduled_for)"
        " SELECT gen_random_uuid(), o.occurrence_id, n, gen_random_uuid(), o.scheduled_for, o.finished_at,"
        "        CASE WHEN n = 1 AND (extract(hour FROM o.scheduled_for)::int % 5 = 0) THEN 'failed'"
        "        ELSE 'succeeded' END, o.scheduled_for"
        " FROM occurrences o CROSS JOIN LATERAL generate_series(1,"
        "        CASE WHEN extract(hour FROM o.scheduled_for)::int % 5 = 0 THEN 2 ELSE 1 END) n"
        " WHERE o.state = 'SUCCEEDED'"
    )
    # Planted on acme's day 1 (long past any retention): not final, DEAD, and final with a pending handoff.
    day1 = START + timedelta(hours=10)
    plants = {
        "RUNNING": day1,
        "RETRY_WAIT": day1 + timedelta(hours=1),
        "ENQUEUED": day1 + timedelta(hours=2),
        "DEAD": day1 + timedelta(hours=3),
        "CANCELED": day1 + timedelta(hours=4),  # final: goes
    }
    for state, at in plants.items():
        await pool.execute(
            "UPDATE occurrences SET state = $1 WHERE schedule_id = $2 AND scheduled_for = $3",
            state,
            uuid.UUID(created["acme"][0]),
            at,
        )
    # A SUCCEEDED occurrence whose outbox row is still unsent (a stale redelivery): its handoff is pending.
    await pool.execute(
        "UPDATE outbox SET sent_at = NULL WHERE occurrence_id = (SELECT occurrence_id FROM occurrences"
        " WHERE schedule_id = $1 AND scheduled_for = $2)",
        uuid.UUID(created["acme"][0]),
        day1 + timedelta(hours=5),
    )
    return created


async def expected_to_go(pool, cutoffs: dict[str, datetime]) -> set[uuid.UUID]:
    """Computed here from the rows, independently of the prune's SQL."""
    rows = await pool.fetch("SELECT occurrence_id, tenant_id, scheduled_for, state FROM occurrences")
    pending = {
        r["occurrence_id"]
        for r in await pool.fetch("SELECT occurrence_id FROM outbox WHERE sent_at IS NULL AND discarded_at IS NULL")
    }
    return {
        r["occurrence_id"]
        for r in rows
        if r["state"] in FINAL and r["scheduled_for"] < cutoffs[r["tenant_id"]] and r["occurrence_id"] not in pending
    }


async def ids(pool, table: str) -> list[uuid.UUID]:
    return [r[0] for r in await pool.fetch(f"SELECT occurrence_id FROM {table}")]  # test-only, fixed table names


async def test_retention_archives_exactly_the_finished_occurrences_past_the_policy(pool, clock, target, telemetry):
    created = await simulated_days(pool, clock, target)
    await set_retention(pool, timedelta(days=2))
    await set_retention(pool, timedelta(days=1), tenant_id="globex")
    now = clock.now()
    cutoffs = {"acme": now - timedelta(days=2), "globex": now - timedelta(days=1)}
    policy = await retention_policy(pool, clock)
    assert policy["default_retention_s"] == 2 * 86400
    assert {t["tenant_id"]: (t["retention_s"], t["override"]) for t in policy["tenants"]} == {
        "acme": (2 * 86400, False),
        "globex": (86400, True),
    }

    going = await expected_to_go(pool, cutoffs)
    all_before = set(await ids(pool, "occurrences"))
    attempts_before = {r[0]: r[1] for r in await pool.fetch("SELECT attempt_id, occurrence_id FROM attempts")}
    attempts_going = {a for a, o in attempts_before.items() if o in going}
    assert len(going) > 100 and len(all_before - going) > 100  # both sides are substantial
    before = await reconcile(pool, Window(START, now), clock=clock, record=False)

    dry = await prune(pool, clock=clock, dry_run=True)
    assert dry.occurrences == len(going) and dry.attempts == len(attempts_going)
    per_tenant = {t.tenant_id: t for t in dry.tenants}
    assert per_tenant["acme"].kept == {"DEAD": 1, "ENQUEUED": 1, "RETRY_WAIT": 1, "RUNNING": 1, "SUCCEEDED": 1}
    assert set(await ids(pool, "occurrences")) == all_before and await ids(pool, "archive.occurrences") == []

    batches: list[int] = []
    report = await prune(
        pool,
        clock=clock,
        batch_size=37,
        on_batch=lambda _t, n, _a: batches.append(n),
        **telemetry.instruments("history"),
    )
    assert report.occurrences == len(going) and report.complete
    assert sum(batches) == len(going) and max(batches) == 37 and report.batches == len(batches)
    hot, archived = set(await ids(pool, "occurrences")), await ids(pool, "archive.occurrences")
    assert set(archived) == going and len(archived) == len(going)
    assert hot == all_before - going
    hot_attempts = {r[0] for r in await pool.fetch("SELECT attempt_id FROM attempts")}
    archived_attempts = {r[0] for r in await pool.fetch("SELECT attempt_id FROM archive.attempts")}
    assert archived_attempts == attempts_going and hot_attempts == set(attempts_before) - attempts_going
    # Every not-final occurrence (and DEAD) is still hot, however old; so is the one with a pending handoff.
    not_final = await pool.fetchval("SELECT count(*) FROM occurrences WHERE state <> ALL($1::text[])", list(FINAL))
    assert (
        not_final
        == await pool.fetchval(
            "SELECT count(*) FROM occurrences WHERE scheduled_for >= $1 AND state = 'SCHEDULED'",
            now - timedelta(hours=1),
        )
        + 4
    )
    # The delivered outbox rows of the archived occurrences are gone; the pending one stays.
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE occurrence_id = ANY($1::uuid[])", list(going)) == 0
    assert (
        await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL AND scheduled_for < $1", cutoffs["acme"])
        == 1
    )
    archived_points = {
        (p.attributes["table"], p.attributes["tenant_id"]): p.value for p in telemetry.points(obs.HISTORY_ARCHIVED)
    }
    assert archived_points[("occurrences", "acme")] + archived_points[("occurrences", "globex")] == len(going)
    assert archived_points[("attempts", "acme")] + archived_points[("attempts", "globex")] == len(attempts_going)
    assert len(telemetry.spans(obs.SPAN_HISTORY_PRUNE)) == 1

    # A second run finds nothing.
    again = await prune(pool, clock=clock)
    assert again.occurrences == 0 and again.batches == 0

    # The reconciler still sees the whole window, and says which part of it is archived.
    after = await reconcile(pool, Window(START, now), clock=clock, record=False)
    for name in ("expected", "present", "missing", "unexpected", "duplicate_slots", "pending"):
        assert after.counts[name] == before.counts[name], name
    assert after.states == before.states and after.clean == before.clean
    assert after.counts["archived"] == len(going) and before.counts["archived"] == 0
    assert after.archived_before == cutoffs["globex"] and before.archived_before is None
    acme_only = await reconcile(pool, Window(START, now), tenant_id="acme", clock=clock, record=False)
    assert acme_only.archived_before == cutoffs["acme"]
    assert any(line.startswith("  archived: ") for line in after.lines())
    recent = await reconcile(pool, Window(now - timedelta(hours=12), now), clock=clock, record=False)
    assert recent.archived_before is None and recent.counts["archived"] == 0

    # The listings read the archive: every occurrence of a schedule, in order, across pages.
    control = ControlPlane(pool, clock)
    schedule_id = created["acme"][0]
    listed, cursor = [], None
    while True:
        page = await control.list_occurrences("acme", schedule_id, cursor=cursor, limit=40)
        listed.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    everything = await pool.fetch(
        "SELECT occurrence_id FROM occurrences WHERE schedule_id = $1 UNION ALL"
        " SELECT occurrence_id FROM archive.occurrences WHERE schedule_id = $1",
        uuid.UUID(schedule_id),
    )
    assert len(listed) == len(everything) >= DAYS * 24  # (and the hour materialized ahead)
    assert [o["scheduled_for"] for o in listed] == sorted(o["scheduled_for"] for o in listed)
    old = next(
        o for o in listed if uuid.UUID(o["occurrence_id"]) in going and o["scheduled_for"].endswith("T05:00:00Z")
    )
    shown = await control.get_occurrence("acme", old["occurrence_id"])
    assert shown["state"] == "SUCCEEDED" and [a["attempt_number"] for a in shown["attempts"]] == [1, 2]


async def test_a_backfill_over_archived_history_leaves_what_ran_and_refires_what_never_did(pool, clock, target):
    """A backfill reads the archive as well as the hot table: an archived SUCCEEDED slot is present (firing it
    again would publish its occurrence id a second time), an archived MISSED one of the current version comes
    back with its own id, once."""
    created = await simulated_days(pool, clock, target)
    hourly = uuid.UUID(created["acme"][0])
    day2 = START + timedelta(days=1)
    missed = [day2 + timedelta(hours=6), day2 + timedelta(hours=7)]
    await pool.execute(
        "UPDATE occurrences SET state = 'MISSED', attempt_count = 0, finished_at = NULL"
        " WHERE schedule_id = $1 AND scheduled_for = ANY($2::timestamptz[])",
        hourly,
        missed,
    )
    await pool.execute(
        "DELETE FROM attempts WHERE occurrence_id IN (SELECT occurrence_id FROM occurrences"
        " WHERE schedule_id = $1 AND scheduled_for = ANY($2::timestamptz[]))",
        hourly,
        missed,
    )
    await set_retention(pool, timedelta(days=1))
    await prune(pool, clock=clock)
    in_window = "SELECT count(*) FROM {} WHERE schedule_id = $1 AND scheduled_for BETWEEN $2 AND $3"
    window = (day2, day2 + timedelta(hours=12))
    assert await pool.fetchval(in_window.format("occurrences"), hourly, *window) == 0  # all archived
    assert await pool.fetchval(in_window.format("archive.occurrences"), hourly, *window) == 13

    requested = RequestedOccurrences(pool, clock)
    first = await requested.backfill("acme", hourly, *window, "operator:alice")
    second = await requested.backfill("acme", hourly, *window, "operator:alice")

    assert (first.slots, first.created, first.refired, first.present) == (13, 0, 2, {"SUCCEEDED": 11})
    assert (second.created, second.refired, second.present) == (0, 0, {"SUCCEEDED": 11, "SCHEDULED": 2})
    back = await pool.fetch(
        "SELECT occurrence_id, scheduled_for, state, origin FROM occurrences WHERE schedule_id = $1"
        " AND scheduled_for BETWEEN $2 AND $3 ORDER BY scheduled_for",
        hourly,
        *window,
    )
    assert [(r["scheduled_for"], r["state"], r["origin"]) for r in back] == [
        (at, "SCHEDULED", "backfill") for at in missed
    ]
    assert all(r["occurrence_id"] == occurrence_id(hourly, 1, r["scheduled_for"]) for r in back)
    assert await pool.fetchval(in_window.format("archive.occurrences"), hourly, *window) == 11  # moved, not copied
    sent_again = await pool.fetch(
        "SELECT b.occurrence_id FROM outbox b JOIN occurrences o USING (occurrence_id)"
        " WHERE b.sent_at IS NULL AND o.schedule_id = $1 AND o.scheduled_for BETWEEN $2 AND $3",
        hourly,
        *window,
    )
    assert sorted(r[0] for r in sent_again) == sorted(r["occurrence_id"] for r in back)  # one delivery each
    # The reconciler counts each slot once: nothing duplicated between the hot table and the archive.
    report = await reconcile(pool, Window(*window), tenant_id="acme", clock=clock, record=False)
    assert report.counts["duplicate_slots"] == 0


async def test_retention_refuses_bad_input_and_names_the_field(pool):
    await create_tenant(pool, "acme")
    with pytest.raises(InvalidInput) as refused:
        await set_retention(pool, timedelta(minutes=5))
    assert refused.value.field == "keep"
    with pytest.raises(InvalidInput):
        await set_retention(pool, None)
    with pytest.raises(InvalidInput) as refused:
        await prune(pool, batch_size=0)
    assert refused.value.field == "batch_size"
    assert (await retention_policy(pool))["default_retention_s"] == 30 * 86400  # nothing changed


async def test_the_archive_has_the_hot_tables_columns_in_order(pool):
    """Readers union SELECT * of both: a column added to one must be added to the other."""
    for table in ("occurrences", "attempts"):
        columns = await pool.fetch(
            "SELECT table_schema, column_name, data_type FROM information_schema.columns"
            " WHERE table_name = $1 AND table_schema IN ('public', 'archive') ORDER BY table_schema, ordinal_position",
            table,
        )
        hot = [(c["column_name"], c["data_type"]) for c in columns if c["table_schema"] == "public"]
        archive = [(c["column_name"], c["data_type"]) for c in columns if c["table_schema"] == "archive"]
        assert hot and hot == archive, table


async def test_the_archive_tables_keep_exactly_the_hot_tables_columns_in_order(pool):
    """Moves are INSERT ... SELECT * and readers UNION ALL hot and archive: a migration that adds a column to
    occurrences or attempts must add it to the archive table too (the slot columns of 0014 did)."""
    query = (
        "SELECT array_agg(column_name::text || ' ' || data_type ORDER BY ordinal_position)"
        " FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2"
    )
    for table in ("occurrences", "attempts"):
        assert await pool.fetchval(query, "archive", table) == await pool.fetchval(query, "public", table), table

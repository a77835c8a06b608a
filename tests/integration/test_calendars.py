"""Exclusion calendars and run limits against real PostgreSQL: control plane, materializer, tenant isolation."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from engine.control.calendars import Calendars
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.materializer import Materializer, MaterializerConfig
from schemas.errors import Conflict, InvalidInput, NotFound

UTC = UTC
BERLIN = ZoneInfo("Europe/Berlin")
ICS = Path(__file__).resolve().parents[1] / "unit" / "calendars" / "holidays_berlin_2026.ics"


@pytest.fixture(autouse=True)
async def tenants(pool):
    for name in ("acme", "globex"):
        await create_tenant(pool, name)


@pytest.fixture
def control(pool, clock):
    return ControlPlane(pool, clock)


@pytest.fixture
def calendars(pool, clock):
    return Calendars(pool, clock)


def weekday_schedule(target: str, **extra):
    return {
        "kind": "cron",
        "expression": "0 9 * * MON-FRI",
        "time_zone": "Europe/Berlin",
        "target": target,
        "misfire_policy": "skip",
        **extra,
    }


async def fired_dates(pool, schedule_id) -> list[date]:
    rows = await pool.fetch(
        "SELECT scheduled_for FROM occurrences WHERE schedule_id = $1 AND state = 'SCHEDULED' ORDER BY scheduled_for",
        schedule_id,
    )
    return [r["scheduled_for"].astimezone(BERLIN).date() for r in rows]


def weekdays(first: date, last: date) -> list[date]:
    return [first + timedelta(n) for n in range((last - first).days + 1) if (first + timedelta(n)).weekday() < 5]


# --------------------------------------------------------------------------- the calendar lifecycle


async def test_create_read_update_with_versions_and_history(calendars):
    created = await calendars.create_calendar(
        "acme",
        {
            "name": "de-holidays",
            "time_zone": "Europe/Berlin",
            "description": "Berlin",
            "dates": ["2026-12-25", "2026-12-31/2027-01-01", {"date": "2026-12-26", "label": "2. Weihnachtstag"}],
        },
    )
    assert (created["version"], created["date_count"], created["time_zone"]) == (1, 3, "Europe/Berlin")
    assert created["dates"][2] == {"start": "2026-12-26", "end": "2026-12-26", "label": "2. Weihnachtstag"}
    with pytest.raises(Conflict, match="already exists"):
        await calendars.create_calendar("acme", {"name": "de-holidays", "dates": []})
    updated = await calendars.update_calendar(
        "acme", "de-holidays", {"dates": ["2026-12-24"], "time_zone": None, "expected_version": 1}
    )
    assert (updated["version"], updated["date_count"], updated["time_zone"]) == (2, 1, None)
    assert updated["description"] == "Berlin"  # fields not given stay
    with pytest.raises(Conflict, match="at version 2, not 1"):
        await calendars.update_calendar("acme", "de-holidays", {"dates": [], "expected_version": 1})
    for not_a_version in (None, 0, "2", True):  # as for a schedule: a condition that is no version is refused
        with pytest.raises(InvalidInput, match="expected_version"):
            await calendars.update_calendar("acme", "de-holidays", {"dates": [], "expected_version": not_a_version})
    history = await calendars.calendar_history("acme", "de-holidays")
    assert [(v["version"], v["change"], len(v["dates"])) for v in history] == [(1, "create", 3), (2, "update", 1)]
    listed = await calendars.list_calendars("acme")
    assert [c["name"] for c in listed.items] == ["de-holidays"] and "dates" not in listed.items[0]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "Bad Name", "dates": []}, "name"),
        ({"name": "ok", "dates": ["2026-02-30"]}, "dates[0]"),
        ({"name": "ok", "dates": ["2026-12-26/2026-12-24"]}, "dates[0]"),
        ({"name": "ok", "dates": [{"start": "2026-12-24", "end": "2026-12-01"}]}, "dates[0].end"),
        ({"name": "ok", "dates": [{"date": "2026-12-24", "colour": "red"}]}, "dates[0].colour"),
        ({"name": "ok", "dates": "2026-12-24"}, "dates"),
        ({"name": "ok"}, "dates"),
        ({"name": "ok", "dates": [], "time_zone": "Mars/Base"}, "time_zone"),
        ({"name": "ok", "dates": [], "owner": "me"}, "owner"),
    ],
)
async def test_invalid_calendars_name_the_field_and_write_nothing(calendars, pool, body, field):
    with pytest.raises(InvalidInput) as caught:
        await calendars.create_calendar("acme", body)
    assert caught.value.field == field
    assert await pool.fetchval("SELECT count(*) FROM calendars") == 0


async def test_import_creates_then_replaces_and_a_bad_file_changes_nothing(calendars):
    first = await calendars.import_calendar("acme", "berlin", ICS.read_bytes(), time_zone="Europe/Berlin")
    assert first["created"] and first["imported"] == {"events": 6, "cancelled": 1, "entries": 5}
    assert first["description"] == "Feiertage Berlin 2026" and first["version"] == 1
    again = await calendars.import_calendar(
        "acme", "berlin", b"BEGIN:VCALENDAR\nBEGIN:VEVENT\nDTSTART;VALUE=DATE:20270101\nEND:VEVENT\nEND:VCALENDAR\n"
    )
    assert (again["created"], again["version"], again["date_count"], again["time_zone"]) == (
        False,
        2,
        1,
        "Europe/Berlin",
    )
    with pytest.raises(InvalidInput) as caught:
        await calendars.import_calendar("acme", "berlin", b"BEGIN:VCALENDAR\nBEGIN:VEVENT\nRRULE:FREQ=YEARLY\n")
    assert caught.value.field == "ics"
    assert (await calendars.get_calendar("acme", "berlin"))["version"] == 2
    assert [v["change"] for v in await calendars.calendar_history("acme", "berlin")] == ["import", "import"]


async def test_delete_only_when_no_live_schedule_uses_it_and_the_name_is_free_again(calendars, control, target):
    await calendars.create_calendar("acme", {"name": "holidays", "dates": ["2026-12-25"]})
    schedule = await control.create_schedule("acme", weekday_schedule(target, exclusion_calendar="holidays"))
    assert schedule["exclusion_calendar"] == "holidays"
    with pytest.raises(Conflict, match="used by 1 live schedule"):
        await calendars.delete_calendar("acme", "holidays")
    await control.update_schedule("acme", schedule["schedule_id"], {"exclusion_calendar": None})
    deleted = await calendars.delete_calendar("acme", "holidays")
    assert deleted["deleted"] and deleted["version"] == 2
    with pytest.raises(NotFound):
        await calendars.get_calendar("acme", "holidays")
    recreated = await calendars.create_calendar("acme", {"name": "holidays", "dates": []})
    assert recreated["version"] == 1 and recreated["calendar_id"] != deleted["calendar_id"]


async def test_another_tenants_calendar_is_not_found_everywhere(calendars, control, target, pool):
    await calendars.create_calendar("acme", {"name": "holidays", "dates": ["2026-12-25"]})
    for call in (
        calendars.get_calendar("globex", "holidays"),
        calendars.update_calendar("globex", "holidays", {"dates": []}),
        calendars.delete_calendar("globex", "holidays"),
        calendars.calendar_history("globex", "holidays"),
        control.create_schedule("globex", weekday_schedule(target, exclusion_calendar="holidays")),
    ):
        with pytest.raises(NotFound):
            await call
    assert (await calendars.list_calendars("globex")).items == []
    globex = await control.create_schedule("globex", weekday_schedule(target))
    with pytest.raises(NotFound):
        await control.update_schedule("globex", globex["schedule_id"], {"exclusion_calendar": "holidays"})
    # And the database itself refuses a cross-tenant reference.
    acme_calendar = await pool.fetchval("SELECT calendar_id FROM calendars WHERE tenant_id = 'acme'")
    with pytest.raises(Exception, match="schedules_calendar_of_tenant"):
        await pool.execute("UPDATE schedules SET calendar_id = $1 WHERE tenant_id = 'globex'", acme_calendar)


# --------------------------------------------------------------------------- materialization


async def test_a_weekday_schedule_skips_exactly_the_listed_dates(pool, clock, calendars, control, target):
    # From 2026-11-29 (a Sunday) over two months, with the Berlin holidays file plus two dates.
    await calendars.import_calendar("acme", "berlin", ICS.read_bytes(), time_zone="Europe/Berlin")
    await calendars.update_calendar(
        "acme",
        "berlin",
        {
            "dates": [
                *[
                    {"start": e["start"], "end": e["end"], "label": e["label"]}
                    for e in (await calendars.get_calendar("acme", "berlin"))["dates"]
                ],
                "2026-12-08",
                "2026-12-12",
            ]
        },
    )  # a Tuesday, and a Saturday (no fire anyway)
    schedule = await control.create_schedule("acme", weekday_schedule(target, exclusion_calendar="berlin"))
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(days=62)), clock)
    report = await materializer.run_once()
    assert report.excluded == 8  # the weekdays among the listed dates: 8, 24, 25, 28-31 December, 1 January
    listed = (
        {date(2026, 12, 8), date(2026, 12, 12)}
        | {date(2026, 12, 24) + timedelta(n) for n in range(9)}
        | {date(2026, 1, 1), date(2026, 4, 3), date(2026, 4, 6), date(2026, 5, 1)}
    )
    expected = [d for d in weekdays(date(2026, 11, 30), date(2027, 1, 29)) if d not in listed]
    assert await fired_dates(pool, schedule["schedule_id"]) == expected
    # Nothing excluded became MISSED, and the cursor walks slots (the next weekday after the horizon).
    assert await pool.fetchval("SELECT count(*) FROM occurrences WHERE state = 'MISSED'") == 0
    assert await pool.fetchval("SELECT next_run_at FROM schedules") == datetime(2027, 1, 30, 8, tzinfo=UTC) + timedelta(
        days=2
    )


async def test_a_calendar_change_applies_to_every_slot_not_yet_materialized(pool, clock, calendars, control, target):
    await calendars.create_calendar("acme", {"name": "closures", "dates": ["2026-12-03", "2026-12-10"]})
    schedule = await control.create_schedule("acme", weekday_schedule(target, exclusion_calendar="closures"))
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(days=4)), clock)
    await materializer.run_once()  # up to 2026-12-03 10:00Z: 30 Nov - 2 Dec
    assert await fired_dates(pool, schedule["schedule_id"]) == [
        date(2026, 11, 30),
        date(2026, 12, 1),
        date(2026, 12, 2),
    ]
    # Close 1 December too (already materialized: it stays), open 10 December, close 9 December.
    await calendars.update_calendar("acme", "closures", {"dates": ["2026-12-01", "2026-12-03", "2026-12-09"]})
    await Materializer(pool, MaterializerConfig(horizon=timedelta(days=13)), clock).run_once()  # to 12 Dec
    assert await fired_dates(pool, schedule["schedule_id"]) == [
        date(2026, 11, 30),
        date(2026, 12, 1),
        date(2026, 12, 2),
        date(2026, 12, 4),
        date(2026, 12, 7),
        date(2026, 12, 8),
        date(2026, 12, 10),
        date(2026, 12, 11),
    ]
    # The materialized occurrence of 1 December is untouched.
    assert await pool.fetchval("SELECT state FROM occurrences WHERE scheduled_for = '2026-12-01T08:00Z'") == "SCHEDULED"


async def test_a_calendar_that_excludes_a_whole_year_costs_one_jump(pool, clock, calendars, control, target):
    await calendars.create_calendar("acme", {"name": "sabbatical", "dates": ["2026-11-29/2027-11-28"]})
    schedule = await control.create_schedule(
        "acme", {"kind": "cron", "expression": "* * * * *", "target": target, "exclusion_calendar": "sabbatical"}
    )
    preview = await control.preview_schedule("acme", schedule["schedule_id"], count=2)
    assert [f["utc"] for f in preview["fires"]] == ["2027-11-29T00:00:00Z", "2027-11-29T00:01:00Z"]
    assert preview["excluded_dates"] == [{"start": "2026-11-29", "end": "2027-11-28", "label": None}]
    assert len(preview["excluded"]) == 1000  # listed up to the preview limit


# --------------------------------------------------------------------------- run limits


async def test_max_runs_completes_the_schedule_after_n_runs(pool, clock, control, target):
    schedule = await control.create_schedule(
        "acme", {"kind": "cron", "expression": "* * * * *", "target": target, "max_runs": 3}
    )
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(minutes=10)), clock)
    report = await materializer.run_once()
    assert (report.occurrences, report.completed, report.completed_by_runs) == (3, 1, 1)
    row = await pool.fetchrow("SELECT state, runs, next_run_at FROM schedules")
    assert (row["state"], row["runs"], row["next_run_at"]) == ("completed", 3, None)
    assert len(await fired_dates(pool, schedule["schedule_id"])) == 3


async def test_runs_canceled_before_they_started_are_given_back(pool, clock, control, target):
    schedule = await control.create_schedule(
        "acme",
        {"kind": "cron", "expression": "* * * * *", "target": target, "max_runs": 5, "misfire_policy": "catch_up:10"},
    )
    sid = schedule["schedule_id"]
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(minutes=3)), clock)
    await materializer.run_once()  # 10:01, 10:02, 10:03
    assert await pool.fetchval("SELECT runs FROM schedules") == 3
    paused = await control.pause_schedule("acme", sid)  # cancels the three, never published
    assert (paused["runs"], paused["canceled_occurrences"]) == (0, 3)
    await control.resume_schedule("acme", sid)
    clock.advance(timedelta(minutes=10))
    await materializer.run_once()
    assert await pool.fetchval("SELECT state FROM schedules") == "completed"
    runs = await pool.fetch("SELECT scheduled_for FROM occurrences WHERE state = 'SCHEDULED' ORDER BY 1")
    assert [r["scheduled_for"].minute for r in runs] == [1, 2, 3, 4, 5]  # exactly five runs, oldest first
    assert (await control.get_schedule("acme", sid))["runs"] == 5


async def test_max_runs_cannot_drop_to_what_has_already_run(pool, clock, control, target):
    schedule = await control.create_schedule(
        "acme", {"kind": "cron", "expression": "* * * * *", "target": target, "max_runs": 10}
    )
    await Materializer(pool, MaterializerConfig(horizon=timedelta(minutes=2)), clock).run_once()
    await pool.execute("UPDATE occurrences SET state = 'SUCCEEDED'")  # both ran
    with pytest.raises(InvalidInput) as caught:
        await control.update_schedule("acme", schedule["schedule_id"], {"max_runs": 2})
    assert caught.value.field == "max_runs" and "already run 2 times" in str(caught.value)
    assert (await control.get_schedule("acme", schedule["schedule_id"]))["version"] == 1  # nothing written
    updated = await control.update_schedule("acme", schedule["schedule_id"], {"max_runs": 3})
    assert (updated["max_runs"], updated["runs"]) == (3, 2)
    with pytest.raises(InvalidInput) as caught:
        await control.create_schedule(
            "acme", {"kind": "cron", "expression": "* * * * *", "target": target, "max_runs": 0}
        )
    assert caught.value.field == "max_runs"


async def test_preview_of_a_stored_schedule_counts_its_runs_left(pool, clock, calendars, control, target):
    await calendars.create_calendar("acme", {"name": "h", "dates": [{"date": "2026-12-01", "label": "closed"}]})
    schedule = await control.create_schedule("acme", weekday_schedule(target, exclusion_calendar="h", max_runs=4))
    await Materializer(pool, MaterializerConfig(horizon=timedelta(days=1)), clock).run_once()  # 30 Nov
    preview = await control.preview_schedule(
        "acme", schedule["schedule_id"], count=10, after=datetime(2026, 11, 30, 9, tzinfo=UTC)
    )
    assert preview["runs_left"] == 3
    assert [f["local"][:10] for f in preview["fires"]] == ["2026-12-02", "2026-12-03", "2026-12-04"]
    assert preview["excluded"] == [
        {"utc": "2026-12-01T08:00:00Z", "local": "2026-12-01T09:00:00+01:00", "date": "2026-12-01", "label": "closed"}
    ]
    assert preview["fires"][0]["rule"] == "day-of-week MON-FRI"


# --------------------------------------------------------------------------- timeline and backfill


async def test_the_timeline_shows_excluded_slots_as_excluded_not_absent(pool, clock, calendars, control, target):
    from engine.control.timeline import schedule_timeline

    await calendars.create_calendar("acme", {"name": "h", "dates": [{"date": "2026-12-02", "label": "closed"}]})
    schedule = await control.create_schedule("acme", weekday_schedule(target, exclusion_calendar="h"))
    await Materializer(pool, MaterializerConfig(horizon=timedelta(days=4)), clock).run_once()  # 30 Nov - 3 Dec
    # On 3 December at 09:30 version 2 also lists 3 December (materialized already: it stays, no exclusion)
    # and 4 December (not yet materialized: excluded).
    clock.set(datetime(2026, 12, 3, 9, 30, tzinfo=UTC))
    await calendars.update_calendar("acme", "h", {"dates": ["2026-12-02", "2026-12-03", "2026-12-04"]})
    clock.set(datetime(2026, 12, 5, 12, tzinfo=UTC))
    timeline = await schedule_timeline(
        pool,
        "acme",
        schedule["schedule_id"],
        datetime(2026, 11, 30, tzinfo=UTC),
        datetime(2026, 12, 5, tzinfo=UTC),
        clock.now(),
    )
    verdicts = {
        e.scheduled_for.astimezone(BERLIN).date().isoformat(): (e.verdict, e.explanation) for e in timeline.entries
    }
    assert verdicts["2026-12-02"] == (
        "EXCLUDED",
        "not fired: 2026-12-02 is listed in the exclusion calendar h (version 1: closed)",
    )
    assert verdicts["2026-12-03"][0] == "SCHEDULED"
    # 4 December was never materialized (no materializer ran since) and version 2 lists it.
    assert verdicts["2026-12-04"][0] == "EXCLUDED" and "(version 2)" in verdicts["2026-12-04"][1]
    assert "ABSENT" not in timeline.counts


async def test_a_backfill_does_not_fire_excluded_slots(pool, clock, calendars, control, target):
    from engine.control.requested_occurrences import RequestedOccurrences

    await calendars.create_calendar("acme", {"name": "h", "dates": ["2026-12-02"]})
    schedule = await control.create_schedule("acme", weekday_schedule(target, exclusion_calendar="h"))
    clock.set(datetime(2026, 12, 5, tzinfo=UTC))
    result = await RequestedOccurrences(pool, clock).backfill(
        "acme",
        schedule["schedule_id"],
        datetime(2026, 11, 30, tzinfo=UTC),
        datetime(2026, 12, 4, 12, tzinfo=UTC),
        "tenant:acme",
    )
    assert (result.slots, result.created, result.excluded) == (4, 4, 1)
    assert await fired_dates(pool, schedule["schedule_id"]) == [
        date(2026, 11, 30),
        date(2026, 12, 1),
        date(2026, 12, 3),
        date(2026, 12, 4),
    ]
    # Backfilled occurrences are asked for, not the schedule's own fires: they are not runs.
    assert (await control.get_schedule("acme", schedule["schedule_id"]))["runs"] == 0


async def test_a_batch_create_resolves_calendars_in_the_tenant_and_keeps_run_limits(pool, clock, calendars, target):
    from engine.control.schedule_batches import BatchItem, ScheduleBatches

    await calendars.create_calendar("acme", {"name": "h", "dates": ["2026-12-02"]})
    await calendars.create_calendar("globex", {"name": "theirs", "dates": []})
    items = [
        BatchItem("a", weekday_schedule(target, exclusion_calendar="h", max_runs=7)),
        BatchItem("b", weekday_schedule(target, exclusion_calendar="theirs")),  # another tenant's
        BatchItem("c", weekday_schedule(target, exclusion_calendar="nope")),
        BatchItem("d", weekday_schedule(target)),
    ]
    results = await ScheduleBatches(ControlPlane(pool, clock)).create_schedules("acme", items)
    assert [r["status"] for r in results] == [201, 404, 404, 201]
    assert "calendar theirs not found" in results[1]["error"]["message"]
    stored = await pool.fetch("SELECT calendar_name, max_runs FROM schedules ORDER BY created_by_key")
    assert [(r["calendar_name"], r["max_runs"]) for r in stored] == [("h", 7), (None, None)]
    definition = await pool.fetchval(
        "SELECT v.definition FROM schedule_versions v JOIN schedules s USING (schedule_id) WHERE s.created_by_key = 'a'"
    )
    assert (definition["exclusion_calendar"], definition["max_runs"]) == ("h", 7)

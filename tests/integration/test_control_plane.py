"""The schedule lifecycle, tenant isolation and quotas against real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.control.quotas import TenantQuotas
from engine.control.schedules import ControlPlane
from engine.control.tenants import authenticate, create_tenant
from engine.loops.materializer import Materializer, MaterializerConfig
from schemas.errors import Conflict, InvalidInput, NotFound, QuotaExceeded
from schemas.messages import decode_schedule_state
from schemas.topics import SCHEDULE_STATES_TOPIC

UTC = UTC
EVERY_MINUTE = {"kind": "cron", "expression": "* * * * *", "target": "billing.invoice"}


@pytest.fixture
async def control(pool, clock, acme):
    return ControlPlane(pool, clock)


def materializer(pool, clock, horizon: float = 30) -> Materializer:
    return Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=horizon)), clock)


async def states(pool, schedule_id) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT state, count(*) FROM occurrences WHERE schedule_id = $1::uuid GROUP BY state", schedule_id
    )
    return dict(rows)


async def state_messages(pool, schedule_id) -> list:
    rows = await pool.fetch("SELECT message FROM outbox WHERE topic = $1 ORDER BY id", SCHEDULE_STATES_TOPIC)
    return [m for m in (decode_schedule_state(r["message"]) for r in rows) if str(m.schedule_id) == schedule_id]


async def test_update_creates_version_two_and_cancels_the_pending_version_one_occurrence(control, pool, clock):
    schedule = await control.create_schedule("acme", {**EVERY_MINUTE, "payload": {"plan": "basic"}})
    clock.advance(timedelta(seconds=45))
    await materializer(pool, clock).run_once()  # v1 @ 10:01 is pending in the outbox
    assert await states(pool, schedule["schedule_id"]) == {"SCHEDULED": 1}

    updated = await control.update_schedule("acme", schedule["schedule_id"], {"payload": {"plan": "pro"}})

    assert updated["version"] == 2 and updated["canceled_occurrences"] == 1
    assert updated["payload"] == {"plan": "pro"} and updated["next_run_at"] == "2026-11-29T10:01:00Z"
    old = await pool.fetchrow(
        "SELECT o.state, b.discarded_at FROM occurrences o JOIN outbox b USING"
        " (occurrence_id) WHERE o.schedule_version = 1"
    )
    assert old["state"] == "CANCELED" and old["discarded_at"] is not None
    await materializer(pool, clock).run_once()  # the same instant, as version 2
    rows = await pool.fetch("SELECT schedule_version, state FROM occurrences ORDER BY schedule_version")
    assert [tuple(r) for r in rows] == [(1, "CANCELED"), (2, "SCHEDULED")]
    history = await control.schedule_history("acme", schedule["schedule_id"])
    assert [(h["version"], h["change"]) for h in history] == [(1, "create"), (2, "update")]
    assert history[0]["definition"]["payload"] == {"plan": "basic"}
    assert [(m.version, m.state) for m in await state_messages(pool, schedule["schedule_id"])] == [
        (1, "active"),
        (2, "active"),
    ]


async def test_an_update_conditional_on_the_version_read_never_overwrites_a_newer_one(control, pool, clock):
    schedule = await control.create_schedule("acme", {**EVERY_MINUTE, "payload": {"plan": "basic"}})
    sid = schedule["schedule_id"]
    first = await control.update_schedule("acme", sid, {"payload": {"plan": "pro"}, "expected_version": 1})
    assert first["version"] == 2

    # A second editor who also read version 1 is refused, and nothing of theirs is applied.
    with pytest.raises(Conflict, match="is at version 2, not 1; read it again"):
        await control.update_schedule("acme", sid, {"payload": {"plan": "free"}, "expected_version": 1})
    stored = await control.get_schedule("acme", sid)
    assert (stored["version"], stored["payload"]) == (2, {"plan": "pro"})
    assert len(await control.schedule_history("acme", sid)) == 2

    for bad in (0, -1, True, "2", 2.0, None):
        with pytest.raises(InvalidInput, match="expected_version"):
            await control.update_schedule("acme", sid, {"payload": {}, "expected_version": bad})
    with pytest.raises(InvalidInput, match="at least one field"):
        await control.update_schedule("acme", sid, {"expected_version": 2})  # a condition alone changes nothing
    with pytest.raises(NotFound):  # the condition never reveals another tenant's schedule
        await control.update_schedule("globex", sid, {"payload": {}, "expected_version": 2})
    assert (await control.update_schedule("acme", sid, {"payload": {}, "expected_version": 2}))["version"] == 3


async def test_an_update_that_changes_nothing_is_no_new_version_and_cancels_nothing(control, pool, clock):
    """Re-applying the stored definition (a deploy pipeline, a GET edited and sent back) is not a change: no
    version, and the occurrences materialized ahead keep their delivery. As a change, it would cancel them, and
    one already published would keep its slot under the old version, which consumers skip: a run lost."""
    schedule = await control.create_schedule(
        "acme", {**EVERY_MINUTE, "payload": {"plan": "basic"}, "time_zone": "Europe/Berlin", "max_attempts": 4}
    )
    sid = schedule["schedule_id"]
    clock.advance(timedelta(seconds=45))
    await materializer(pool, clock).run_once()  # 10:01 materialized ahead
    assert await states(pool, sid) == {"SCHEDULED": 1}

    stored = await control.get_schedule("acme", sid)
    for same in (
        {"payload": {"plan": "basic"}},
        {"expression": "* * * * *", "kind": "cron", "time_zone": "Europe/Berlin"},
        {name: stored[name] for name in ("kind", "expression", "target", "payload", "time_zone", "max_attempts")},
        {"payload": {"plan": "basic"}, "expected_version": 1},
    ):
        again = await control.update_schedule("acme", sid, same)
        assert (again["version"], again["canceled_occurrences"], again["released_slots"]) == (1, 0, 0), same
    assert await states(pool, sid) == {"SCHEDULED": 1}
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE discarded_at IS NOT NULL") == 0
    assert [h["change"] for h in await control.schedule_history("acme", sid)] == ["create"]
    assert (await control.get_schedule("acme", sid))["updated_at"] == stored["updated_at"]

    changed = await control.update_schedule("acme", sid, {"payload": {"plan": "pro"}})
    assert (changed["version"], changed["canceled_occurrences"]) == (2, 1)
    # Equal in Python, not in JSON: each is a change.
    assert (await control.update_schedule("acme", sid, {"payload": {"n": 1}}))["version"] == 3
    assert (await control.update_schedule("acme", sid, {"payload": {"n": True}}))["version"] == 4
    assert (await control.update_schedule("acme", sid, {"payload": {"n": 1.0}}))["version"] == 5
    assert (await control.update_schedule("acme", sid, {"payload": {"n": 1.0}}))["version"] == 5


async def test_pause_stops_fires_and_resume_applies_the_misfire_policy(control, pool, clock):
    schedule = await control.create_schedule(
        "acme", {**EVERY_MINUTE, "misfire_policy": "fire_once", "max_lateness": "30s"}
    )
    paused = await control.pause_schedule("acme", schedule["schedule_id"])
    assert (paused["state"], paused["version"]) == ("paused", 2)
    again = await control.pause_schedule("acme", schedule["schedule_id"])  # retry-safe: no new version
    assert again["version"] == 2

    clock.advance(timedelta(minutes=10))
    assert (await materializer(pool, clock).run_once()).schedules == 0  # no fires while paused

    resumed = await control.resume_schedule("acme", schedule["schedule_id"])
    assert (resumed["state"], resumed["version"]) == ("active", 3)
    await materializer(pool, clock, horizon=0).run_once()
    counts = await states(pool, schedule["schedule_id"])
    assert counts == {"SCHEDULED": 1, "MISSED": 9}  # 10:01..10:10: nine missed, the latest fires once
    enqueued = await pool.fetchval("SELECT scheduled_for FROM occurrences WHERE state = 'SCHEDULED'")
    assert enqueued == datetime(2026, 11, 29, 10, 10, tzinfo=UTC)


async def test_pause_rewinds_the_cursor_over_canceled_occurrences(control, pool, clock):
    schedule = await control.create_schedule("acme", EVERY_MINUTE)
    clock.advance(timedelta(seconds=45))
    await materializer(pool, clock).run_once()  # 10:01 materialized, cursor 10:02
    paused = await control.pause_schedule("acme", schedule["schedule_id"])
    assert paused["canceled_occurrences"] == 1 and paused["next_run_at"] == "2026-11-29T10:01:00Z"


async def test_cancel_is_terminal_and_keeps_history_readable(control, pool, clock):
    schedule = await control.create_schedule("acme", EVERY_MINUTE)
    clock.advance(timedelta(seconds=45))
    await materializer(pool, clock).run_once()
    canceled = await control.cancel_schedule("acme", schedule["schedule_id"])
    assert canceled["state"] == "canceled" and canceled["next_run_at"] is None
    assert canceled["canceled_occurrences"] == 1
    clock.advance(timedelta(hours=1))
    assert (await materializer(pool, clock).run_once()).schedules == 0
    for change in (control.resume_schedule, control.pause_schedule):
        with pytest.raises(Conflict, match="final"):
            await change("acme", schedule["schedule_id"])
    with pytest.raises(Conflict):
        await control.update_schedule("acme", schedule["schedule_id"], {"payload": {}})
    assert (await control.get_schedule("acme", schedule["schedule_id"]))["state"] == "canceled"
    page = await control.list_occurrences("acme", schedule["schedule_id"])
    assert [o["state"] for o in page.items] == ["CANCELED"]
    assert (await state_messages(pool, schedule["schedule_id"]))[-1].state == "canceled"


async def test_another_tenant_sees_nothing_and_changes_nothing(control, pool, clock):
    await create_tenant(pool, "globex")
    schedule = await control.create_schedule("acme", EVERY_MINUTE)
    sid = schedule["schedule_id"]
    for operation in (
        control.get_schedule,
        control.pause_schedule,
        control.resume_schedule,
        control.cancel_schedule,
        control.list_occurrences,
        control.schedule_history,
    ):
        with pytest.raises(NotFound):
            await operation("globex", sid)
    with pytest.raises(NotFound):
        await control.update_schedule("globex", sid, {"payload": {"stolen": True}})
    assert (await control.list_schedules("globex")).items == []
    assert (await control.get_schedule("acme", sid))["version"] == 1


async def test_listing_pages_through_all_schedules_with_filters(control, clock):
    created = []
    for i in range(7):
        clock.advance(timedelta(seconds=1))
        created.append(await control.create_schedule("acme", {**EVERY_MINUTE, "target": f"t{i % 2}"}))
    await control.pause_schedule("acme", created[0]["schedule_id"])
    seen, cursor = [], None
    while True:
        page = await control.list_schedules("acme", cursor=cursor, limit=3)
        seen += [s["schedule_id"] for s in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [s["schedule_id"] for s in created]
    assert len((await control.list_schedules("acme", target="t1")).items) == 3
    assert [s["state"] for s in (await control.list_schedules("acme", state="paused")).items] == ["paused"]
    with pytest.raises(InvalidInput):
        await control.list_schedules("acme", cursor="garbage!")


async def test_quotas_reject_with_a_clear_error_and_write_nothing(pool, clock):
    await create_tenant(
        pool, "small", TenantQuotas(max_active_schedules=2, max_fires_per_minute=3, max_payload_bytes=100)
    )
    control = ControlPlane(pool, clock)
    hourly = {"kind": "cron", "expression": "0 * * * *", "target": "x"}
    await control.create_schedule("small", hourly)
    with pytest.raises(QuotaExceeded, match="max_fires_per_minute"):
        await control.create_schedule("small", {"kind": "rate", "expression": "10s", "target": "x"})
    with pytest.raises(InvalidInput, match="100 bytes"):
        await control.create_schedule("small", {**hourly, "payload": {"blob": "x" * 200}})
    await control.create_schedule("small", hourly)
    with pytest.raises(QuotaExceeded, match="max_active_schedules"):
        await control.create_schedule("small", hourly)
    assert await pool.fetchval("SELECT count(*) FROM schedules WHERE tenant_id = 'small'") == 2
    assert await pool.fetchval("SELECT count(*) FROM schedule_versions WHERE tenant_id = 'small'") == 2
    # At the limit, changing a schedule does not count it twice.
    one = (await control.list_schedules("small")).items[0]
    assert (await control.update_schedule("small", one["schedule_id"], {"expression": "30 * * * *"}))["version"] == 2


async def test_unknown_tenants_are_refused(pool, clock):
    with pytest.raises(NotFound, match="chronoq tenant create"):
        await ControlPlane(pool, clock).create_schedule("nobody", EVERY_MINUTE)


async def test_tokens_are_stored_hashed_and_authenticate_their_tenant(pool, acme):
    assert await pool.fetchval("SELECT count(*) FROM tenants WHERE api_token_hash = $1", acme.api_token.encode()) == 0
    tenant = await authenticate(pool, acme.api_token)
    assert tenant is not None and tenant.tenant_id == "acme"
    assert await authenticate(pool, acme.api_token + "x") is None
    assert await authenticate(pool, "Bearer nonsense") is None
    with pytest.raises(Conflict):
        await create_tenant(pool, "acme")


async def test_occurrence_detail_includes_attempts(control, pool, clock):
    schedule = await control.create_schedule("acme", EVERY_MINUTE)
    clock.advance(timedelta(seconds=45))
    await materializer(pool, clock).run_once()
    (occurrence,) = (await control.list_occurrences("acme", schedule["schedule_id"])).items
    detail = await control.get_occurrence("acme", occurrence["occurrence_id"])
    assert detail["state"] == "SCHEDULED" and detail["attempts"] == []
    await create_tenant(pool, "globex")
    with pytest.raises(NotFound):
        await control.get_occurrence("globex", occurrence["occurrence_id"])


async def test_pause_never_rewinds_over_occurrences_already_published(control, pool, clock):
    """A published occurrence may already have run: re-materializing its slot would run it twice."""
    schedule = await control.create_schedule("acme", EVERY_MINUTE)
    clock.advance(timedelta(seconds=45))
    await materializer(pool, clock).run_once()  # 10:01 materialized, cursor 10:02
    await pool.execute("UPDATE occurrences SET state = 'ENQUEUED'")  # as the relay does after the broker's ack
    paused = await control.pause_schedule("acme", schedule["schedule_id"])
    assert paused["canceled_occurrences"] == 1 and paused["next_run_at"] == "2026-11-29T10:02:00Z"

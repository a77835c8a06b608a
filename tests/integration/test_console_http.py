"""The console and the operator routes over real HTTP (uvicorn on a free port) against a real PostgreSQL.

What a browser-less attacker or a curious tenant can try: another tenant's
pages, forms without the CSRF token or from another origin, markup in data.
"""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest
import requests

from engine.api.app import Api
from engine.api.console.app import Console
from engine.api.metrics_endpoint import MetricsEndpoint
from engine.api.operator_routes import OperatorRoutes
from engine.api.server import bind, serve
from engine.api.site import Site
from engine.client import ApiError, ChronoqClient
from engine.control.operators import create_operator_token
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant

DAILY = {"kind": "cron", "expression": "0 9 * * *", "time_zone": "Europe/Berlin", "target": "billing.invoice"}
SCRIPT = "<script>alert('owned')</script>"


@pytest.fixture
async def site(pool, clock):
    control = ControlPlane(pool, clock)
    api = Api(pool, control, extra_routes=OperatorRoutes(control).routes())
    sock = bind("127.0.0.1", 0)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(Site(api, Console(pool, control), MetricsEndpoint()), sock, stop))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    await task


@pytest.fixture
async def tenants(pool):
    return await create_tenant(pool, "acme"), await create_tenant(pool, "globex")


class Browser:
    """A cookie-keeping HTTP client that does not follow redirects (the test reads them)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.session = requests.Session()

    async def get(self, path: str, **kwargs) -> requests.Response:
        return await asyncio.to_thread(self.session.get, self.base + path, allow_redirects=False, timeout=10, **kwargs)

    async def post(self, path: str, **kwargs) -> requests.Response:
        return await asyncio.to_thread(self.session.post, self.base + path, allow_redirects=False, timeout=10, **kwargs)

    async def sign_in(self, token: str) -> str:
        reply = await self.post("/ui/login", data={"token": token})
        assert reply.status_code == 303, reply.text
        page = await self.get("/ui/schedules")
        assert page.status_code == 200
        found = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
        assert found is not None
        return found.group(1)


async def test_sign_in_sets_a_strict_http_only_cookie_and_wrong_tokens_are_refused(site, tenants):
    browser = Browser(site)
    assert (await browser.get("/ui/schedules")).headers["location"] == "/ui/login"
    refused = await browser.post("/ui/login", data={"token": "cq_not-a-token"})
    assert refused.status_code == 401 and "not a valid" in refused.text
    signed = await browser.post("/ui/login", data={"token": tenants[0].api_token})
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    assert tenants[0].api_token not in cookie
    page = await browser.get("/ui/schedules")
    assert "tenant acme" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]


async def test_a_tenant_sees_none_of_another_tenants_schedules_and_an_operator_sees_all(site, tenants, pool):
    acme, globex = (ChronoqClient(site, t.api_token) for t in tenants)
    mine = await acme.create_schedule({**DAILY, "target": "acme.report"})
    theirs = await globex.create_schedule({**DAILY, "target": "globex.secret"})
    browser = Browser(site)
    await browser.sign_in(tenants[1].api_token)
    listing = (await browser.get("/ui/schedules")).text
    assert "globex.secret" in listing and "acme.report" not in listing and mine["schedule_id"][:8] not in listing
    assert (await browser.get(f"/ui/schedules/{mine['schedule_id']}")).status_code == 404
    assert (await browser.get("/ui/schedules?q=acme")).text.count("data-schedule-id") == 0
    operator = await create_operator_token(pool, "alice")
    admin = Browser(site)
    await admin.sign_in(operator.token)
    everything = (await admin.get("/ui/schedules")).text
    assert "acme.report" in everything and "globex.secret" in everything and "every tenant" in everything
    assert (await admin.get(f"/ui/schedules/{theirs['schedule_id']}")).status_code == 200


async def test_forms_need_the_csrf_token_and_the_same_origin(site, tenants):
    acme = ChronoqClient(site, tenants[0].api_token)
    schedule = await acme.create_schedule(DAILY)
    browser = Browser(site)
    csrf = await browser.sign_in(tenants[0].api_token)
    path = f"/ui/schedules/{schedule['schedule_id']}/pause"
    assert (await browser.post(path)).status_code == 403
    assert (await browser.post(path, data={"csrf_token": "forged"})).status_code == 403
    assert (
        await browser.post(path, data={"csrf_token": csrf}, headers={"Origin": "http://evil.example"})
    ).status_code == 403
    assert (await acme.get_schedule(schedule["schedule_id"]))["state"] == "active"
    done = await browser.post(path, data={"csrf_token": csrf}, headers={"Origin": site})
    assert done.status_code == 303
    assert (await acme.get_schedule(schedule["schedule_id"]))["state"] == "paused"
    # another session's token is not this session's
    other = Browser(site)
    other_csrf = await other.sign_in(tenants[0].api_token)
    resume = f"/ui/schedules/{schedule['schedule_id']}/resume"
    assert (await browser.post(resume, data={"csrf_token": other_csrf})).status_code == 403


async def test_markup_in_data_renders_inert(site, tenants, pool):
    acme = ChronoqClient(site, tenants[0].api_token)
    schedule = await acme.create_schedule({**DAILY, "payload": {"note": SCRIPT}})
    sid = uuid.UUID(schedule["schedule_id"])
    oid = uuid.uuid4()
    await pool.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, state, attempt_count, dead_reason, last_error_class, last_error_message, finished_at)"
        " VALUES ($1, $2, 1, 'acme', 'billing.invoice', now() - interval '5 minutes', now() - interval '5 minutes',"
        " 'DEAD', 3, 'permanent_error', $3, $3, now())",
        oid,
        sid,
        SCRIPT,
    )
    browser = Browser(site)
    await browser.sign_in(tenants[0].api_token)
    pages = [
        await browser.get(f"/ui/schedules/{sid}"),
        await browser.get(f"/ui/occurrences/{oid}"),
        await browser.get("/ui/dead-letters"),
        await browser.get("/ui/schedules?q=%3Cscript%3E"),
    ]
    for page in pages:
        assert page.status_code == 200
        assert "<script>alert" not in page.text
    assert "&lt;script&gt;alert(&#x27;owned&#x27;)&lt;/script&gt;" in pages[1].text
    assert "&lt;script&gt;" in pages[2].text


async def test_the_preview_marks_daylight_saving_days(site, tenants):
    browser = Browser(site)
    csrf = await browser.sign_in(tenants[0].api_token)
    reply = await browser.post(
        "/ui/preview",
        json={"kind": "cron", "expression": "0 12 28 3 *", "time_zone": "Europe/Berlin"},
        headers={"X-CSRF-Token": csrf},
    )
    fires = reply.json()["fires"]
    assert fires[0]["utc"] == "2027-03-28T10:00:00Z"
    assert fires[0]["dst"] == "DST day: clocks spring forward 1h"
    bad = await browser.post(
        "/ui/preview", json={"kind": "cron", "expression": "61 * * * *"}, headers={"X-CSRF-Token": csrf}
    )
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "expression"
    assert (await browser.post("/ui/preview", json={"kind": "cron", "expression": "* * * * *"})).status_code == 403


async def test_create_trigger_and_backfill_through_the_console(site, tenants, pool, clock):
    browser = Browser(site)
    csrf = await browser.sign_in(tenants[0].api_token)
    created = await browser.post(
        "/ui/schedules",
        data={
            "csrf_token": csrf,
            "kind": "cron",
            "expression": "*/15 * * * *",
            "time_zone": "UTC",
            "target": "console.made",
            "payload": '{"from": "console"}',
        },
    )
    assert created.status_code == 303
    sid = created.headers["location"].split("/")[3].split("?")[0]
    invalid = await browser.post(
        "/ui/schedules", data={"csrf_token": csrf, "kind": "cron", "expression": "nope", "target": "console.made"}
    )
    assert invalid.status_code == 422 and "expression" in invalid.text
    rounded = await browser.post(
        "/ui/schedules",
        data={"csrf_token": csrf, "kind": "cron", "expression": "0 * * * *", "target": "console.made",
              "payload": '{"order": 123456789012345678901234567890}'},
    )  # fmt: skip
    assert rounded.status_code == 422 and "64 bits" in rounded.text
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 1
    assert (await browser.post(f"/ui/schedules/{sid}/trigger", data={"csrf_token": csrf})).status_code == 303
    clock.advance(__import__("datetime").timedelta(hours=2))
    backfill = await browser.post(
        f"/ui/schedules/{sid}/backfill",
        data={"csrf_token": csrf, "from": "2026-11-29T10:00:00Z", "to": "2026-11-29T11:00:00Z"},
    )
    assert backfill.status_code == 303 and "created=5" in backfill.headers["location"]
    page = (await browser.get(backfill.headers["location"])).text
    assert "Backfill: 5 slot(s) released." in page
    assert "manual trigger requested by tenant:acme (console)" in page
    assert page.count('data-verdict="SCHEDULED"') >= 5
    rows = await pool.fetch("SELECT origin, requested_by FROM occurrences WHERE schedule_id = $1", uuid.UUID(sid))
    assert sorted(r["origin"] for r in rows) == ["backfill"] * 5 + ["manual"]


async def test_operator_routes_over_the_api(site, tenants, clock):
    acme, globex = (ChronoqClient(site, t.api_token) for t in tenants)
    batch = await acme.request(
        "POST",
        "/v1/schedules/batch",
        {
            "items": [{"idempotency_key": f"imp-{i}", "schedule": {**DAILY, "payload": {"i": i}}} for i in range(10)]
            + [{"idempotency_key": "bad", "schedule": {**DAILY, "time_zone": "Mars/Base"}}]
        },
    )
    assert batch["statuses"] == {"201": 10, "422": 1}
    assert batch["results"][10]["error"]["field"] == "time_zone"
    sid = batch["results"][0]["schedule"]["schedule_id"]
    with pytest.raises(ApiError) as caught:
        await globex.request("POST", f"/v1/schedules/{sid}/trigger")
    assert caught.value.status == 404
    first = await acme.request("POST", f"/v1/schedules/{sid}/trigger", headers={"Idempotency-Key": "now-1"})
    second = await acme.request("POST", f"/v1/schedules/{sid}/trigger", headers={"Idempotency-Key": "now-1"})
    assert first["occurrence_id"] == second["occurrence_id"] and first["requested_by"] == "tenant:acme (api)"
    clock.advance(__import__("datetime").timedelta(days=3))
    window = {"from": "2026-11-30T00:00:00Z", "to": "2026-12-01T23:59:59Z"}
    result = await acme.request("POST", f"/v1/schedules/{sid}/backfill", window)
    assert (result["slots"], result["created"]) == (2, 2)
    assert (await acme.request("POST", f"/v1/schedules/{sid}/backfill", window))["created"] == 0
    with pytest.raises(ApiError) as caught:
        await acme.request("POST", f"/v1/schedules/{sid}/backfill", {"from": "yesterday", "to": "2026-11-30T00:00:00Z"})
    assert (caught.value.status, caught.value.field) == (422, "from")
    timeline = await acme.request(
        "GET", f"/v1/schedules/{sid}/timeline?from=2026-11-29T00:00:00Z&to=2026-12-02T10:00:00Z"
    )
    assert [e["origin"] for e in timeline["entries"]].count("backfill") == 2


async def test_a_dead_letter_is_replayed_from_the_console_with_its_id_and_not_by_another_tenant(
    site, tenants, pool, clock
):
    from tests.support.rows import due_occurrence

    message = await due_occurrence(pool, "acme", "billing.invoice", clock.now())
    await pool.execute(
        "UPDATE occurrences SET state = 'DEAD', attempt_count = 3, dead_reason = 'max_attempts',"
        " finished_at = $2 WHERE occurrence_id = $1",
        message.occurrence_id,
        clock.now(),
    )
    other = Browser(site)
    other_csrf = await other.sign_in(tenants[1].api_token)
    assert str(message.occurrence_id) not in (await other.get("/ui/dead-letters")).text
    refused = await other.post(f"/ui/occurrences/{message.occurrence_id}/replay", data={"csrf_token": other_csrf})
    assert refused.status_code == 404
    browser = Browser(site)
    csrf = await browser.sign_in(tenants[0].api_token)
    assert str(message.occurrence_id)[:8] in (await browser.get("/ui/dead-letters")).text
    replayed = await browser.post(f"/ui/occurrences/{message.occurrence_id}/replay", data={"csrf_token": csrf})
    assert replayed.status_code == 303 and replayed.headers["location"].endswith("?done=replayed")
    page = (await browser.get(replayed.headers["location"])).text
    assert "Replayed with the same occurrence id." in page
    assert (
        await pool.fetchval("SELECT state FROM occurrences WHERE occurrence_id = $1", message.occurrence_id)
        == "RETRY_WAIT"
    )


async def test_a_tenant_sees_its_quota_usage_on_the_health_page_and_an_operator_does_not(site, tenants, pool, clock):
    acme, _ = tenants
    control = ControlPlane(pool, clock)
    for _ in range(3):
        await control.create_schedule("acme", {"kind": "cron", "expression": "0 * * * *", "target": "billing.x"})
    await control.create_schedule("globex", {"kind": "cron", "expression": "0 * * * *", "target": "globex.x"})
    browser = Browser(site)
    await browser.sign_in(acme.api_token)
    for path in ("/ui/health", "/ui/health?fragment=health"):
        page = (await browser.get(path)).text
        tile = re.search(r'id="quota-schedules"><div class="value">([^<]+)<', page)
        assert tile is not None and tile.group(1) == "3 / 10,000", path  # acme's own, not globex's
        assert 'id="quota-fires"' in page
        assert 'id="quota-running"><div class="value">0 / 100<' in page  # nothing materialized yet
    operator = Browser(site)
    await operator.sign_in((await create_operator_token(pool, "alice")).token)
    for path in ("/ui/health", "/ui/health?fragment=health"):
        page = (await operator.get(path)).text
        assert 'id="quota-schedules"' not in page  # every tenant: no one quota, but the tenants nearest theirs
        rows = re.findall(r'<tr data-tenant="([^"]+)"><td>[^<]*</td><td>([^<]+)</td>', page)
        assert rows == [("acme", "3 / 10,000"), ("globex", "1 / 10,000")], path
    assert 'id="tenant-usage"' not in (await browser.get("/ui/health")).text  # a tenant sees no other tenant

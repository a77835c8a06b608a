"""The HTTP API served by uvicorn on a free loopback port, driven by the service client."""

from __future__ import annotations

import asyncio
import urllib.request

import orjson
import pytest

from engine.api.app import Api
from engine.api.server import bind, serve
from engine.client import ApiError, ChronoqClient
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant

DAILY = {
    "kind": "cron",
    "expression": "0 9 * * *",
    "time_zone": "Europe/Berlin",
    "target": "billing.invoice",
    "payload": {"plan": "pro"},
}


@pytest.fixture
async def api_url(pool, clock):
    sock = bind("127.0.0.1", 0)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(Api(pool, ControlPlane(pool, clock)), sock, stop))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    await task


@pytest.fixture
async def clients(api_url, pool):
    acme = await create_tenant(pool, "acme")
    globex = await create_tenant(pool, "globex")
    return ChronoqClient(api_url, acme.api_token), ChronoqClient(api_url, globex.api_token)


async def test_create_is_idempotent_per_key_and_conflicts_on_a_different_body(clients, pool):
    acme, _ = clients
    first = await acme.create_schedule(DAILY, idempotency_key="k1")
    again = await acme.create_schedule(DAILY, idempotency_key="k1")
    assert again["schedule_id"] == first["schedule_id"]
    assert (first["version"], first["state"], first["next_run_at"]) == (1, "active", "2026-11-30T08:00:00Z")
    with pytest.raises(ApiError) as caught:
        await acme.create_schedule({**DAILY, "payload": {"plan": "free"}}, idempotency_key="k1")
    assert caught.value.status == 409
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 1


async def test_the_lifecycle_over_http(clients):
    acme, _ = clients
    schedule = await acme.create_schedule(DAILY)
    sid = schedule["schedule_id"]
    updated = await acme.update_schedule(sid, {"expression": "0 10 * * *"})
    assert (updated["version"], updated["next_run_at"]) == (2, "2026-11-30T09:00:00Z")
    assert (await acme.pause_schedule(sid))["state"] == "paused"
    assert (await acme.resume_schedule(sid))["state"] == "active"
    assert (await acme.cancel_schedule(sid))["state"] == "canceled"
    assert (await acme.get_schedule(sid))["version"] == 5
    versions = await acme.request("GET", f"/v1/schedules/{sid}/versions")
    assert [v["change"] for v in versions["items"]] == ["create", "update", "pause", "resume", "cancel"]
    assert (await acme.list_occurrences(sid))["items"] == []
    listed = await acme.list_schedules(state="canceled")
    assert [s["schedule_id"] for s in listed["items"]] == [sid]


@pytest.mark.parametrize(
    "body, field",
    [
        ({**DAILY, "expression": "0 0 30 2 *"}, "expression"),
        ({**DAILY, "time_zone": "Mars/Base"}, "time_zone"),
        ({**DAILY, "payload": {"x": "y" * 70000}}, "payload"),
        ({**DAILY, "target": "no spaces please"}, "target"),
        ({**DAILY, "misfire_policy": "sometimes"}, "misfire_policy"),
        ({**DAILY, "payload": {"note": "nul \x00 inside"}}, "payload"),
    ],
)
async def test_invalid_input_is_a_422_naming_the_field_and_writes_nothing(clients, pool, body, field):
    acme, _ = clients
    with pytest.raises(ApiError) as caught:
        await acme.create_schedule(body)
    assert (caught.value.status, caught.value.field) == (422, field)
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 0


async def test_another_tenants_schedule_is_a_404_on_every_path(clients):
    acme, globex = clients
    sid = (await acme.create_schedule(DAILY))["schedule_id"]
    calls = [
        globex.get_schedule(sid),
        globex.update_schedule(sid, {"payload": {}}),
        globex.pause_schedule(sid),
        globex.resume_schedule(sid),
        globex.cancel_schedule(sid),
        globex.list_occurrences(sid),
        globex.request("GET", f"/v1/schedules/{sid}/versions"),
    ]
    for call in calls:
        with pytest.raises(ApiError) as caught:
            await call
        assert caught.value.status == 404
    assert (await globex.list_schedules())["items"] == []
    assert (await acme.get_schedule(sid))["version"] == 1


async def test_a_tenant_reads_its_own_quotas_and_usage(clients):
    acme, globex = clients
    sid = (await acme.create_schedule(DAILY))["schedule_id"]
    await acme.create_schedule({**DAILY, "kind": "rate", "expression": "30s"})
    mine = await acme.get_tenant()
    assert mine["tenant_id"] == "acme" and mine["quotas"]["max_active_schedules"] == 10_000
    assert mine["usage"] == {"schedules": 2, "fires_per_minute": pytest.approx(2 + 1 / 1440), "open_occurrences": 0}
    await acme.cancel_schedule(sid)
    assert (await acme.get_tenant())["usage"] == {"schedules": 1, "fires_per_minute": 2.0, "open_occurrences": 0}
    assert (await globex.get_tenant())["usage"] == {"schedules": 0, "fires_per_minute": 0.0, "open_occurrences": 0}


async def test_requests_without_a_valid_token_are_401(api_url, clients):
    for token in ("", "cq_wrong", "Basic abc"):
        with pytest.raises(ApiError) as caught:
            await ChronoqClient(api_url, token).list_schedules()
        assert caught.value.status == 401


async def test_preview_and_openapi(api_url, clients):
    acme, _ = clients
    fires = await acme.preview(
        {
            "kind": "cron",
            "expression": "30 1 * * *",
            "time_zone": "America/New_York",
            "from": "2026-10-31T12:00:00Z",
            "count": 2,
        }
    )
    # The instants and local times of a plain expression are what they always were; each fire now also
    # names the rule that produced it.
    assert [{k: f[k] for k in ("utc", "local")} for f in fires] == [
        {"utc": "2026-11-01T05:30:00Z", "local": "2026-11-01T01:30:00-04:00"},
        {"utc": "2026-11-02T06:30:00Z", "local": "2026-11-02T01:30:00-05:00"},
    ]
    assert [f["rule"] for f in fires] == [
        "every day; 01:30 happens twice on 2026-11-01: fires the first time only",
        "every day",
    ]
    document = orjson.loads(await asyncio.to_thread(lambda: urllib.request.urlopen(api_url + "/openapi.json").read()))
    assert document["openapi"].startswith("3.") and "/v1/schedules/{id}/pause" in document["paths"]


async def test_malformed_bodies_and_unknown_routes_are_client_errors(clients):
    acme, _ = clients
    for method, path, body in [
        ("POST", "/v1/schedules", "not an object"),
        ("PATCH", "/v1/schedules/x", {}),
        ("GET", "/v1/nothing", None),
        ("DELETE", "/v1/schedules", None),
        ("GET", "/v1/schedules?limit=ten", None),
        ("GET", "/v1/occurrences/nope", None),
        ("GET", "/v1/schedules?target=a%00b", None),
    ]:
        with pytest.raises(ApiError) as caught:
            await acme.request(method, path, body)
        assert 400 <= caught.value.status < 500, (method, path, caught.value)


async def test_dead_letters_are_listed_and_replayed_per_tenant(clients, pool, clock):
    import random
    import uuid as uuid_module

    from engine.loops.attempt_processor import AttemptProcessor
    from schemas.attempt_events import AttemptEvent
    from tests.support.rows import due_occurrence

    acme, globex = clients
    dead = await due_occurrence(pool, "acme", "billing.invoice", clock.now())
    token = uuid_module.uuid4()
    await AttemptProcessor(pool, clock=clock, rng=random.Random(1)).apply_events(
        [
            AttemptEvent.started(dead.occurrence_id, 1, token, 30.0),
            AttemptEvent.failed(dead.occurrence_id, 1, token, "InvoiceRejected", "no such customer", permanent=True),
        ]
    )

    page = await acme.request("GET", "/v1/dead-letters?limit=10")
    assert [(d["occurrence_id"], d["reason"]) for d in page["items"]] == [(str(dead.occurrence_id), "permanent_error")]
    assert (await globex.request("GET", "/v1/dead-letters"))["items"] == []
    with pytest.raises(ApiError) as caught:
        await globex.request("POST", f"/v1/occurrences/{dead.occurrence_id}/replay")
    assert caught.value.status == 404
    replayed = await acme.request("POST", f"/v1/occurrences/{dead.occurrence_id}/replay")
    assert (replayed["occurrence_id"], replayed["state"]) == (str(dead.occurrence_id), "RETRY_WAIT")
    with pytest.raises(ApiError) as caught:
        await acme.request("POST", f"/v1/occurrences/{dead.occurrence_id}/replay")  # not DEAD any more
    assert caught.value.status == 409

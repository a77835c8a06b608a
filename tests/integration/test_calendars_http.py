"""Exclusion calendars over HTTP: routes, iCalendar import, previews, and tenant isolation (404, never 403)."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import orjson
import pytest

from engine.api.app import Api
from engine.api.server import bind, serve
from engine.client import ApiError, ChronoqClient
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant

ICS = Path(__file__).resolve().parents[1] / "unit" / "calendars" / "holidays_berlin_2026.ics"
WEEKDAYS = {"kind": "cron", "expression": "0 9 * * MON-FRI", "time_zone": "Europe/Berlin", "target": "billing.run"}


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


async def status_of(call) -> int:
    with pytest.raises(ApiError) as caught:
        await call
    return caught.value.status


async def test_calendar_routes_and_a_schedule_that_uses_one(clients):
    acme, _ = clients
    created = await acme.create_calendar({"name": "closures", "dates": ["2026-12-01", "2026-12-24/2026-12-26"]})
    assert (created["version"], created["date_count"]) == (1, 2)
    assert await status_of(acme.create_calendar({"name": "closures", "dates": []})) == 409
    schedule = await acme.create_schedule({**WEEKDAYS, "exclusion_calendar": "closures", "max_runs": 20})
    assert (schedule["exclusion_calendar"], schedule["max_runs"], schedule["runs"]) == ("closures", 20, 0)
    preview = await acme.preview_schedule(schedule["schedule_id"], count=3, after="2026-11-30T09:00:00Z")
    assert [f["local"][:10] for f in preview["fires"]] == ["2026-12-02", "2026-12-03", "2026-12-04"]
    assert [e["date"] for e in preview["excluded"]] == ["2026-12-01"]
    assert preview["runs_left"] == 20
    updated = await acme.update_calendar("closures", {"dates": ["2026-12-02"]})
    assert updated["version"] == 2
    preview = await acme.preview_schedule(schedule["schedule_id"], count=2, after="2026-11-30T09:00:00Z")
    assert [f["local"][:10] for f in preview["fires"]] == ["2026-12-01", "2026-12-03"]  # the current version
    assert [v["version"] for v in await acme.calendar_versions("closures")] == [1, 2]
    assert await status_of(acme.delete_calendar("closures")) == 409
    await acme.cancel_schedule(schedule["schedule_id"])
    assert (await acme.delete_calendar("closures"))["deleted"] is True
    assert await status_of(acme.get_calendar("closures")) == 404
    assert (await acme.list_calendars())["items"] == []


async def test_import_an_ics_file_and_preview_with_it(clients):
    acme, _ = clients
    imported = await acme.import_calendar("berlin", ICS.read_bytes(), time_zone="Europe/Berlin")
    assert imported["created"] and imported["imported"]["entries"] == 5 and imported["version"] == 1
    result = await acme.preview_exclusions(
        {
            **{k: WEEKDAYS[k] for k in ("kind", "expression", "time_zone")},
            "exclusion_calendar": "berlin",
            "from": "2026-12-22T12:00:00Z",
            "count": 3,
        }
    )
    assert [f["local"][:10] for f in result["fires"]] == ["2026-12-23", "2027-01-04", "2027-01-05"]
    assert [e["date"] for e in result["excluded"]] == [
        "2026-12-24",
        "2026-12-25",
        "2026-12-28",
        "2026-12-29",
        "2026-12-30",
        "2026-12-31",
        "2027-01-01",
    ]
    assert {e["label"] for e in result["excluded"]} == {
        "Betriebsferien zwischen den Jahren (Weihnachten bis Neujahr einschliesslich)"
    }
    assert result["excluded_dates"] == [
        {"start": "2026-12-24", "end": "2027-01-01", "label": imported["dates"][4]["label"]}
    ]
    again = await acme.import_calendar("berlin", ICS.read_bytes())
    assert (again["created"], again["version"]) == (False, 2)
    with pytest.raises(ApiError) as caught:
        await acme.import_calendar(
            "berlin", b"BEGIN:VCALENDAR\r\nBEGIN:VEVENT\r\nDTSTART:20261225T090000Z\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n"
        )
    assert (caught.value.status, caught.value.field) == (422, "ics")
    assert "only all-day events" in str(caught.value)


async def test_another_tenants_calendar_is_a_404_directly_and_from_a_schedule(clients):
    acme, globex = clients
    await acme.create_calendar({"name": "acme-only", "dates": ["2026-12-25"]})
    for call in (
        globex.get_calendar("acme-only"),
        globex.update_calendar("acme-only", {"dates": []}),
        globex.delete_calendar("acme-only"),
        globex.calendar_versions("acme-only"),
        globex.create_schedule({**WEEKDAYS, "exclusion_calendar": "acme-only"}),
        globex.preview_exclusions({"kind": "cron", "expression": "0 9 * * *", "exclusion_calendar": "acme-only"}),
    ):
        assert await status_of(call) == 404
    assert (await globex.list_calendars())["items"] == []
    # Importing under the same name creates globex's own calendar; acme's is untouched.
    mine = await globex.import_calendar("acme-only", ICS.read_bytes())
    assert mine["created"] and mine["tenant_id"] == "globex"
    assert (await acme.get_calendar("acme-only"))["date_count"] == 1


async def test_invalid_calendar_requests_name_the_field(clients):
    acme, _ = clients
    for body, field in [
        ({"name": "x", "dates": ["tomorrow"]}, "dates[0]"),
        ({"dates": []}, "name"),
        ({"name": "x", "dates": [], "time_zone": "Nowhere/Town"}, "time_zone"),
    ]:
        with pytest.raises(ApiError) as caught:
            await acme.create_calendar(body)
        assert (caught.value.status, caught.value.field) == (422, field)
    with pytest.raises(ApiError) as caught:
        await acme.create_schedule({**WEEKDAYS, "expression": "0 9 L * FRI"})
    assert (caught.value.status, caught.value.field) == (422, "expression") and "ambiguous" in str(caught.value)
    with pytest.raises(ApiError) as caught:
        await acme.create_schedule({**WEEKDAYS, "max_runs": True})
    assert (caught.value.status, caught.value.field) == (422, "max_runs")


async def test_openapi_documents_the_calendar_routes(api_url):
    document = orjson.loads(await asyncio.to_thread(lambda: urllib.request.urlopen(api_url + "/openapi.json").read()))
    assert {
        "/v1/calendars",
        "/v1/calendars/{name}",
        "/v1/calendars/{name}/import",
        "/v1/calendars/{name}/versions",
        "/v1/schedules/{id}/preview",
    } <= set(document["paths"])
    assert "text/calendar" in document["paths"]["/v1/calendars/{name}/import"]["post"]["requestBody"]["content"]
    # ScheduleCreate is one variant per kind and priority (docs/security.md); each takes the calendar fields.
    for variant in document["components"]["schemas"]["ScheduleCreate"]["oneOf"]:
        assert {"exclusion_calendar", "max_runs"} <= set(variant["properties"])

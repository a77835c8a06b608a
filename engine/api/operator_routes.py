"""The operator features' HTTP routes: batch create, backfill, trigger now, the timeline.

Added to :class:`engine.api.app.Api` as extra routes, so they share its
authentication (the bearer token names the tenant, another tenant's schedule
is a 404), its error format and its body limit.

* ``POST /v1/schedules/batch`` ``{"items": [{"idempotency_key", "schedule"}, ...]}`` (at most 1,000):
  200 with one result per item (its own status, schedule or error).
* ``POST /v1/schedules/{id}/backfill`` ``{"from", "to"}``: the past slots of the window, same
  deterministic ids, paced by the tenant's catch-up quota.
* ``POST /v1/schedules/{id}/trigger`` (optional ``Idempotency-Key``): one manual occurrence due now;
  201 when created, 200 when the key was used before.
* ``GET /v1/schedules/{id}/timeline?from=&to=``: every expected slot in the window and what happened.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engine.api.app import Handler, Request, Response
from engine.control.requested_occurrences import RequestedOccurrences
from engine.control.schedule_batches import ScheduleBatches, parse_batch
from engine.control.schedules import ControlPlane
from engine.control.timeline import schedule_timeline
from schemas.errors import InvalidInput


def parse_instant_field(raw: object, field: str) -> datetime:
    if not isinstance(raw, str):
        raise InvalidInput(field, "is required: an ISO-8601 instant", "2026-11-29T09:00:00Z")
    try:
        value = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError as err:
        raise InvalidInput(field, "is not an ISO-8601 instant", "2026-11-29T09:00:00Z") from err
    if value.tzinfo is None:
        raise InvalidInput(field, "needs an offset or Z", "2026-11-29T09:00:00Z")
    return value.astimezone(UTC)


class OperatorRoutes:
    def __init__(
        self,
        control: ControlPlane,
        requested: RequestedOccurrences | None = None,
        batches: ScheduleBatches | None = None,
    ) -> None:
        self.control = control
        self.requested = requested or RequestedOccurrences(control.pool, control.clock)
        self.batches = batches or ScheduleBatches(control)

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("POST", "/v1/schedules/batch", self.batch),
            ("POST", "/v1/schedules/{id}/backfill", self.backfill),
            ("POST", "/v1/schedules/{id}/trigger", self.trigger),
            ("GET", "/v1/schedules/{id}/timeline", self.timeline),
        ]

    async def batch(self, request: Request) -> Response:
        assert request.tenant is not None
        results = await self.batches.create_schedules(request.tenant.tenant_id, parse_batch(request.json()))
        summary: dict[str, int] = {}
        for result in results:
            summary[str(result["status"])] = summary.get(str(result["status"]), 0) + 1
        return Response(200, {"results": results, "statuses": summary})

    async def backfill(self, request: Request) -> Response:
        assert request.tenant is not None
        body = request.json_object()
        unknown = sorted(set(body) - {"from", "to"})
        if unknown:
            raise InvalidInput(unknown[0], "is not a backfill field; send from and to")
        result = await self.requested.backfill(
            request.tenant.tenant_id,
            request.params["id"],
            parse_instant_field(body.get("from"), "from"),
            parse_instant_field(body.get("to"), "to"),
            f"tenant:{request.tenant.tenant_id} (api)",
        )
        return Response(200, result.to_json())

    async def trigger(self, request: Request) -> Response:
        assert request.tenant is not None
        occurrence = await self.requested.trigger_now(
            request.tenant.tenant_id,
            request.params["id"],
            f"tenant:{request.tenant.tenant_id} (api)",
            request.headers.get("idempotency-key"),
        )
        return Response(201 if occurrence["created"] else 200, occurrence)

    async def timeline(self, request: Request) -> Response:
        assert request.tenant is not None
        now = await self.control.now()
        window_from = (
            parse_instant_field(request.query["from"], "from") if "from" in request.query else now - timedelta(hours=1)
        )
        window_to = parse_instant_field(request.query["to"], "to") if "to" in request.query else now
        timeline = await schedule_timeline(
            self.control.pool, request.tenant.tenant_id, request.params["id"], window_from, window_to, now
        )
        return Response(200, timeline.to_json())

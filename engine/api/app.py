"""The control plane's HTTP API as a plain ASGI application.

Every ``/v1`` route needs ``Authorization: Bearer <api_token>``; the token
names the tenant, and every operation is scoped to it: another tenant's
schedule is a 404, never a 403 that would leak its existence. Errors are JSON
``{"error": {"code", "message", "field"?}}``; validation errors name the field.
The routes are thin: they parse HTTP and call the control plane
(:mod:`engine.control`: requests are validated in ``schedule_requests``,
stored and versioned by :class:`ControlPlane`); an error's status, code and
field come from its class (:mod:`schemas.errors`), a transient database
error is a 503 with ``Retry-After``, a value the database refuses a 422.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

import asyncpg
import orjson

from engine.api.openapi import openapi_document
from engine.control import dead_letters
from engine.control.calendar_requests import validate_calendar_name
from engine.control.calendars import Calendars
from engine.control.quotas import usage_of
from engine.control.schedule_requests import PREVIEW_FIELDS, preview_fires
from engine.control.schedules import ControlPlane
from engine.control.tenants import Tenant, authenticate
from engine.rules.timing.instants import parse_instant
from schemas.error_classification import is_transient
from schemas.errors import ChronoqError, InvalidInput
from schemas.exact_json import AS_STRING, InexactNumber, loads_exact

log = logging.getLogger("chronoq.api")

MAX_BODY_BYTES = 1024 * 1024  # far above the 64 KiB payload quota; beyond it the request is refused


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    params: dict[str, str] = field(default_factory=dict)
    tenant: Tenant | None = None

    def json(self) -> Any:
        if not self.body:
            raise InvalidInput("body", "is empty; send a JSON object", '{"kind": "cron", ...}')
        try:
            return loads_exact(self.body)
        except orjson.JSONDecodeError as err:
            raise InvalidInput("body", f"is not valid JSON ({err})") from err
        except InexactNumber as err:
            raise InvalidInput(err.top or "body", str(err), AS_STRING) from err

    def json_object(self) -> dict[str, Any]:
        value = self.json()
        if not isinstance(value, dict):
            raise InvalidInput("body", "must be a JSON object", '{"kind": "cron", ...}')
        return value

    def int_query(self, name: str, default: int) -> int:
        raw = self.query.get(name)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError as err:
            raise InvalidInput(name, f"must be an integer, got {raw[:40]!r}", str(default)) from err


@dataclass
class Response:
    status: int
    body: Any = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response]]


def error_response(
    status: int,
    code: str,
    message: str,
    field_name: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if field_name is not None:
        error["field"] = field_name
    return Response(status, {"error": error}, headers or [])


def _to_response(err: ChronoqError) -> Response:
    """An error as the API answers it: status, code and field come from the error class."""
    return error_response(err.http_status, err.code, str(err), err.field)


def _unexpected(request: Request, err: Exception) -> Response:
    """An error that is no ChronoqError: the database unavailable (503), refusing a value (422), or a bug (500)."""
    if is_transient(err):
        log.error("database unavailable", extra={"action": "api.db_unavailable", "error": repr(err)})
        return error_response(
            503, "unavailable", "the database is unavailable; retry shortly", headers=[(b"retry-after", b"1")]
        )
    sqlstate = getattr(err, "sqlstate", None)
    if isinstance(err, asyncpg.PostgresError) and isinstance(sqlstate, str) and sqlstate[:2] in ("22", "23"):
        # Validation should have caught it; a value the database refuses is still the request's fault.
        log.warning(
            "the database refused a request value",
            extra={"action": "api.db_refused", "sqlstate": sqlstate, "path": request.path, "error": repr(err)},
        )
        return error_response(
            422,
            "invalid_input",
            f"the database refused a value of this request (SQLSTATE {sqlstate}); check its strings and sizes",
        )
    log.exception(
        "request failed unexpectedly", extra={"action": "api.bug", "path": request.path, "method": request.method}
    )
    return error_response(500, "internal_error", "the request failed unexpectedly; it was logged")


class Api:
    """Routes → control plane. ``extra_routes`` lets other engine rooms (dead letters) add theirs."""

    def __init__(
        self, pool: asyncpg.Pool, control: ControlPlane, extra_routes: list[tuple[str, str, Handler]] | None = None
    ) -> None:
        self.pool = pool
        self.control = control
        self.calendars = Calendars(pool, control.clock)
        routes: list[tuple[str, str, Handler]] = [
            ("POST", "/v1/schedules", self.create_schedule),
            ("GET", "/v1/schedules", self.list_schedules),
            ("GET", "/v1/schedules/{id}", self.get_schedule),
            ("PATCH", "/v1/schedules/{id}", self.update_schedule),
            ("POST", "/v1/schedules/{id}/pause", self.lifecycle("pause_schedule")),
            ("POST", "/v1/schedules/{id}/resume", self.lifecycle("resume_schedule")),
            ("POST", "/v1/schedules/{id}/cancel", self.lifecycle("cancel_schedule")),
            ("GET", "/v1/schedules/{id}/occurrences", self.list_occurrences),
            ("GET", "/v1/schedules/{id}/versions", self.schedule_versions),
            ("GET", "/v1/occurrences/{id}", self.get_occurrence),
            ("GET", "/v1/schedules/{id}/preview", self.preview_schedule),
            ("POST", "/v1/preview", self.preview),
            ("POST", "/v1/calendars", self.create_calendar),
            ("GET", "/v1/calendars", self.list_calendars),
            ("GET", "/v1/calendars/{name}", self.get_calendar),
            ("PATCH", "/v1/calendars/{name}", self.update_calendar),
            ("DELETE", "/v1/calendars/{name}", self.delete_calendar),
            ("POST", "/v1/calendars/{name}/import", self.import_calendar),
            ("GET", "/v1/calendars/{name}/versions", self.calendar_versions),
            ("GET", "/v1/dead-letters", self.list_dead_letters),
            ("GET", "/v1/tenant", self.get_tenant),
            ("POST", "/v1/occurrences/{id}/replay", self.replay_dead_letter),
            *(extra_routes or []),
        ]
        self.routes = [(method, _compile(path), handler) for method, path, handler in routes]
        self._openapi = orjson.dumps(openapi_document())

    # ----------------------------------------------------------------- ASGI

    async def __call__(
        self,
        scope: Mapping[str, Any],
        receive: Callable[[], Awaitable[Mapping[str, Any]]],
        send: Callable[[Mapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body, too_large = await _read_body(receive)
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
        request = Request(scope["method"], scope["path"], query, headers, body)
        if too_large:
            response = error_response(413, "too_large", f"request body over {MAX_BODY_BYTES} bytes")
        else:
            response = await self.dispatch(request)
        payload = b"" if response.body is None else orjson.dumps(response.body)
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    *response.headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def dispatch(self, request: Request) -> Response:
        if request.path == "/openapi.json" and request.method == "GET":
            return Response(200, orjson.Fragment(self._openapi))
        if request.path == "/healthz" and request.method == "GET":
            return Response(200, {"status": "ok"})
        allowed: list[str] = []
        for method, pattern, handler in self.routes:
            match = pattern.fullmatch(request.path)
            if not match:
                continue
            if method != request.method:
                allowed.append(method)
                continue
            request.params = match.groupdict()
            try:
                request.tenant = await self._authenticate(request)
                if request.tenant is None:
                    return error_response(
                        401,
                        "unauthorized",
                        "send Authorization: Bearer <api_token> (from chronoq tenant create)",
                        headers=[(b"www-authenticate", b'Bearer realm="chronoq"')],
                    )
                return await handler(request)
            except ChronoqError as err:
                return _to_response(err)
            except Exception as err:
                return _unexpected(request, err)
        if allowed:
            return error_response(
                405,
                "method_not_allowed",
                f"use {', '.join(sorted(set(allowed)))}",
                headers=[(b"allow", ", ".join(sorted(set(allowed))).encode())],
            )
        return error_response(404, "not_found", f"no route {request.path}")

    async def _authenticate(self, request: Request) -> Tenant | None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return await authenticate(self.pool, token.strip())

    # ----------------------------------------------------------------- routes

    async def create_schedule(self, request: Request) -> Response:
        assert request.tenant is not None
        key = request.headers.get("idempotency-key")
        schedule = await self.control.create_schedule(request.tenant.tenant_id, request.json_object(), key)
        return Response(201, schedule)

    async def list_schedules(self, request: Request) -> Response:
        assert request.tenant is not None
        page = await self.control.list_schedules(
            request.tenant.tenant_id,
            state=request.query.get("state"),
            target=request.query.get("target"),
            cursor=request.query.get("cursor"),
            limit=request.int_query("limit", 50),
        )
        return Response(200, page.to_json())

    async def get_schedule(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(200, await self.control.get_schedule(request.tenant.tenant_id, request.params["id"]))

    async def update_schedule(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(
            200,
            await self.control.update_schedule(request.tenant.tenant_id, request.params["id"], request.json_object()),
        )

    def lifecycle(self, method: str) -> Handler:
        async def change(request: Request) -> Response:
            assert request.tenant is not None
            return Response(200, await getattr(self.control, method)(request.tenant.tenant_id, request.params["id"]))

        return change

    async def list_occurrences(self, request: Request) -> Response:
        assert request.tenant is not None
        page = await self.control.list_occurrences(
            request.tenant.tenant_id,
            request.params["id"],
            cursor=request.query.get("cursor"),
            limit=request.int_query("limit", 50),
        )
        return Response(200, page.to_json())

    async def schedule_versions(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(
            200, {"items": await self.control.schedule_history(request.tenant.tenant_id, request.params["id"])}
        )

    async def get_occurrence(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(200, await self.control.get_occurrence(request.tenant.tenant_id, request.params["id"]))

    async def list_dead_letters(self, request: Request) -> Response:
        assert request.tenant is not None
        page = await dead_letters.list_dead_letters(
            self.pool,
            request.tenant.tenant_id,
            limit=request.int_query("limit", 100),
            cursor=request.query.get("cursor"),
        )
        return Response(200, page)

    async def get_tenant(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(200, await usage_of(self.pool, request.tenant.tenant_id))

    async def replay_dead_letter(self, request: Request) -> Response:
        assert request.tenant is not None
        occurrence = await dead_letters.replay_dead_letter(
            self.pool, request.tenant.tenant_id, request.params["id"], self.control.clock
        )
        return Response(200, occurrence)

    async def preview(self, request: Request) -> Response:
        assert request.tenant is not None
        body = request.json_object()
        after_raw = body.pop("from", None)
        count = body.pop("count", 10)
        after = await self._instant_or_now(after_raw, "from")
        unknown = sorted(set(body) - PREVIEW_FIELDS)
        if unknown:
            raise InvalidInput(
                unknown[0], f"is not a preview field; known: from, count, {', '.join(sorted(PREVIEW_FIELDS))}"
            )
        calendar_name = body.pop("exclusion_calendar", None)
        calendar = None
        if calendar_name is not None:
            # Resolved in the caller's tenant: another tenant's calendar is a 404 here too.
            calendar = await self.calendars.get_calendar_value(
                request.tenant.tenant_id, validate_calendar_name(calendar_name, "exclusion_calendar")
            )
        return Response(200, preview_fires(body, after, count, calendar=calendar))

    async def preview_schedule(self, request: Request) -> Response:
        assert request.tenant is not None
        after = await self._instant_or_now(request.query.get("from"), "from")
        return Response(
            200,
            await self.control.preview_schedule(
                request.tenant.tenant_id, request.params["id"], after=after, count=request.int_query("count", 10)
            ),
        )

    async def _instant_or_now(self, raw: object, field_name: str) -> datetime:
        """Now, or the given instant under a schedule's instant rules (the year range is checked after the
        offset: 0001-01-01T00:00:00+01:00 is a 422 naming the field, not an overflow)."""
        if raw is None:
            return await self.control.now()
        return parse_instant(raw, field_name)

    # ----------------------------------------------------------------- calendars

    async def create_calendar(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(201, await self.calendars.create_calendar(request.tenant.tenant_id, request.json_object()))

    async def list_calendars(self, request: Request) -> Response:
        assert request.tenant is not None
        page = await self.calendars.list_calendars(
            request.tenant.tenant_id, cursor=request.query.get("cursor"), limit=request.int_query("limit", 50)
        )
        return Response(200, page.to_json())

    async def get_calendar(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(200, await self.calendars.get_calendar(request.tenant.tenant_id, request.params["name"]))

    async def update_calendar(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(
            200,
            await self.calendars.update_calendar(
                request.tenant.tenant_id, request.params["name"], request.json_object()
            ),
        )

    async def delete_calendar(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(200, await self.calendars.delete_calendar(request.tenant.tenant_id, request.params["name"]))

    async def import_calendar(self, request: Request) -> Response:
        """The body is the iCalendar file itself (text/calendar); ?time_zone= and ?description= are optional."""
        assert request.tenant is not None
        if not request.body:
            raise InvalidInput("ics", "is empty; send the .ics file as the request body (Content-Type: text/calendar)")
        result = await self.calendars.import_calendar(
            request.tenant.tenant_id,
            request.params["name"],
            request.body,
            time_zone=request.query.get("time_zone"),
            description=request.query.get("description"),
        )
        return Response(201 if result["created"] else 200, result)

    async def calendar_versions(self, request: Request) -> Response:
        assert request.tenant is not None
        return Response(
            200, {"items": await self.calendars.calendar_history(request.tenant.tenant_id, request.params["name"])}
        )


def _compile(path: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path))


async def _read_body(receive: Callable[[], Awaitable[Mapping[str, Any]]]) -> tuple[bytes, bool]:
    """The request body, or (partial, True) once it exceeds MAX_BODY_BYTES."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks), False

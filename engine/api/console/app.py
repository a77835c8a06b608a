"""The console's routes under ``/ui``: sign-in, pages, form actions, the live preview.

Served by the API process (:mod:`engine.api.site` mounts it), plain
server-rendered HTML plus one small script (``static/console.js``, no build
step). Every read is scoped by the signed-in principal (a tenant sees only its
own schedules; an operator every tenant's, acting on a schedule as its
tenant), another tenant's schedule is a 404 like in the API, every POST needs
the session's CSRF token and a same-origin ``Origin`` when the browser sends
one, and responses forbid inline script, framing and sniffing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo

import asyncpg
import orjson

from engine.api.console import pages
from engine.api.console.markup import Markup, query
from engine.api.console.preview import preview_with_dst
from engine.api.console.sessions import COOKIE, Session, session_cookie, session_of, sign_in, sign_out
from engine.control import dead_letters
from engine.control.calendars import calendar_by_id
from engine.control.health import read_health
from engine.control.identifiers import as_uuid
from engine.control.pagination import decode_cursor, encode_cursor
from engine.control.quotas import every_usage, usage_of
from engine.control.requested_occurrences import RequestedOccurrences
from engine.control.schedules import ControlPlane
from engine.control.timeline import schedule_timeline
from engine.control.views import attempt_to_json, instant, occurrence_to_json, schedule_to_json, version_to_json
from engine.records import Attempt, Occurrence, Schedule, ScheduleVersion
from schemas.errors import ChronoqError, Conflict, InvalidInput, NotFound, QuotaExceeded
from schemas.exact_json import field_json
from schemas.messages import format_instant
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.console")

Send = Callable[[Mapping[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        b" frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]
STATIC = {"console.js": b"text/javascript; charset=utf-8", "console.css": b"text/css; charset=utf-8"}
NOTICES = {
    "paused": "Paused.",
    "resumed": "Resumed: missed slots follow the misfire policy.",
    "canceled": "Canceled.",
    "triggered": "Triggered: a manual occurrence is due now.",
    "created": "Created.",
    "replayed": "Replayed with the same occurrence id.",
}
MAX_FORM_BYTES = 256 * 1024
TENANTS_SHOWN = 20  # on an operator's health page, the tenants nearest their quotas
_ID = r"([^/]+)"
_ROOT = re.compile(r"/ui")
_LOGOUT = re.compile(r"/ui/logout")
_SCHEDULES = re.compile(r"/ui/schedules")
_NEW_SCHEDULE = re.compile(r"/ui/schedules/new")
_PREVIEW = re.compile(r"/ui/preview")
_SCHEDULE = re.compile(rf"/ui/schedules/{_ID}")
_SCHEDULE_OCCURRENCES = re.compile(rf"/ui/schedules/{_ID}/occurrences")
_SCHEDULE_ACTION = re.compile(rf"/ui/schedules/{_ID}/(pause|resume|cancel|trigger|backfill)")
_OCCURRENCE = re.compile(rf"/ui/occurrences/{_ID}")
_REPLAY = re.compile(rf"/ui/occurrences/{_ID}/replay")
_DEAD_LETTERS = re.compile(r"/ui/dead-letters")
_HEALTH = re.compile(r"/ui/health")


class Reply:
    def __init__(
        self,
        status: int,
        body: bytes = b"",
        content_type: bytes = b"text/html; charset=utf-8",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.status, self.body, self.content_type = status, body, content_type
        self.headers = headers or []


def html(status: int, markup: Markup, headers: list[tuple[bytes, bytes]] | None = None) -> Reply:
    return Reply(status, markup.encode(), headers=headers)


def redirect(location: str, headers: list[tuple[bytes, bytes]] | None = None) -> Reply:
    return Reply(303, b"", headers=[(b"location", location.encode()), *(headers or [])])


class ConsoleRequest:
    def __init__(self, scope: Mapping[str, Any], body: bytes) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
        self.body = body
        self.secure = scope.get("scheme") == "https" or self.headers.get("x-forwarded-proto") == "https"
        self.session: Session | None = None
        self._form: dict[str, str] | None = None

    @property
    def form(self) -> dict[str, str]:
        if self._form is None:
            self._form = {
                k: v[-1] for k, v in parse_qs(self.body.decode("utf-8", "replace"), keep_blank_values=True).items()
            }
        return self._form

    def cookie(self, name: str) -> str | None:
        for part in self.headers.get("cookie", "").split(";"):
            key, _, value = part.strip().partition("=")
            if key == name:
                return value
        return None

    def same_origin(self) -> bool:
        """A browser's Origin header (when sent) must be this host; CSRF defence beside the token."""
        origin = self.headers.get("origin")
        if origin is None:
            return True
        return urlsplit(origin).netloc == self.headers.get("host", "")


class Console:
    def __init__(
        self, pool: asyncpg.Pool, control: ControlPlane, requested: RequestedOccurrences | None = None
    ) -> None:
        self.pool = pool
        self.control = control
        self.clock = control.clock
        self.requested = requested or RequestedOccurrences(pool, control.clock)

    async def __call__(self, scope: Mapping[str, Any], receive: Receive, send: Send) -> None:
        body, too_large = await _read(receive)
        request = ConsoleRequest(scope, body)
        if too_large:
            reply = Reply(413, b"request too large", b"text/plain")
        else:
            try:
                reply = await self.dispatch(request)
            except (asyncpg.PostgresConnectionError, OSError) as err:
                log.error("database unavailable", extra={"action": "console.db_unavailable", "error": repr(err)})
                reply = Reply(503, b"the database is unavailable; retry shortly", b"text/plain")
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": [
                    (b"content-type", reply.content_type),
                    (b"content-length", str(len(reply.body)).encode()),
                    *SECURITY_HEADERS,
                    *reply.headers,
                    *(
                        []
                        if any(k == b"cache-control" for k, _ in reply.headers)
                        else [(b"cache-control", b"no-store")]
                    ),
                ],
            }
        )
        await send({"type": "http.response.body", "body": reply.body})

    async def dispatch(self, request: ConsoleRequest) -> Reply:
        path, method = request.path.rstrip("/") or "/", request.method
        if path.startswith("/ui/static/"):
            return _static(path.removeprefix("/ui/static/"))
        if method == "POST" and not request.same_origin():
            return Reply(403, b"cross-origin request refused", b"text/plain")
        if path == "/ui/login":
            return await self.login(request)
        request.session = await session_of(self.pool, request.cookie(COOKIE), self.clock)
        if request.session is None:
            if method == "GET":
                return redirect("/ui/login")
            return Reply(401, b"sign in first", b"text/plain")
        if method == "POST":
            presented = request.headers.get("x-csrf-token") or request.form.get("csrf_token")
            if not request.session.csrf_ok(presented):
                return Reply(403, b"missing or wrong CSRF token; reload the page", b"text/plain")
        try:
            return await self.route(request, path, method)
        except ChronoqError as err:
            status = _status(err)
            if path == "/ui/preview":
                return _json(status, {"error": {"message": str(err), "field": getattr(err, "field", None)}})
            return html(
                status, pages.error_page(status, str(err), request.session.principal, request.session.csrf_token)
            )

    async def route(self, request: ConsoleRequest, path: str, method: str) -> Reply:
        for route_method, pattern, handler in self._routes:
            match = pattern.fullmatch(path)
            if match and route_method == method:
                return await handler(request, *match.groups())
        raise NotFound("page", path)

    @property
    def _routes(self) -> list[tuple[str, re.Pattern[str], Callable[..., Awaitable[Reply]]]]:
        return [
            ("GET", _ROOT, self.home),
            ("POST", _LOGOUT, self.logout),
            ("GET", _SCHEDULES, self.schedules),
            ("POST", _SCHEDULES, self.create),
            ("GET", _NEW_SCHEDULE, self.new_schedule),
            ("POST", _PREVIEW, self.preview),
            ("GET", _SCHEDULE_OCCURRENCES, self.occurrences),
            ("POST", _SCHEDULE_ACTION, self.act),
            ("GET", _SCHEDULE, self.schedule),
            ("GET", _OCCURRENCE, self.occurrence),
            ("POST", _REPLAY, self.replay),
            ("GET", _DEAD_LETTERS, self.dead_letters),
            ("GET", _HEALTH, self.health),
        ]

    async def home(self, request: ConsoleRequest) -> Reply:
        return redirect("/ui/schedules")

    async def logout(self, request: ConsoleRequest) -> Reply:
        await sign_out(self.pool, request.cookie(COOKIE))
        return redirect("/ui/login", [(b"set-cookie", session_cookie("", request.secure, 0))])

    async def new_schedule(self, request: ConsoleRequest) -> Reply:
        session = request.session
        assert session is not None
        return html(200, pages.new_schedule_page(session.principal, session.csrf_token))

    async def dead_letters(self, request: ConsoleRequest) -> Reply:
        session = request.session
        assert session is not None
        page = await dead_letters.list_dead_letters(
            self.pool, session.principal.scope, cursor=request.query.get("cursor"), limit=100
        )
        notice = NOTICES.get(request.query.get("done", ""))
        return html(200, pages.dead_letters_page(page, session.principal, session.csrf_token, notice))

    async def health(self, request: ConsoleRequest) -> Reply:
        session = request.session
        assert session is not None
        health = (await read_health(self.pool, session.principal.scope, await self.control.now())).to_json()
        tenant_id = session.principal.tenant_id
        # A tenant sees its own usage beside its quotas; an operator, the tenants nearest their quotas.
        quota = await usage_of(self.pool, tenant_id) if tenant_id is not None else None
        tenants = await every_usage(self.pool, TENANTS_SHOWN) if tenant_id is None else None
        if request.query.get("fragment") == "health":
            return html(200, pages.health_section(health, quota, tenants))
        return html(200, pages.health_page(health, session.principal, session.csrf_token, quota, tenants))

    # ----------------------------------------------------------------- sign-in

    async def login(self, request: ConsoleRequest) -> Reply:
        if request.method == "GET":
            return html(200, pages.login_page())
        if request.method != "POST":
            return Reply(405, b"use GET or POST", b"text/plain", [(b"allow", b"GET, POST")])
        signed = await sign_in(self.pool, request.form.get("token", ""), self.clock)
        if signed is None:
            log.warning("console sign-in refused", extra={"action": "console.sign_in_refused"})
            return html(401, pages.login_page("That token is not a valid tenant API token or operator token."))
        session_id, session = signed
        log.info("console sign-in", extra={"action": "console.signed_in", "principal": session.principal.name})
        return redirect("/ui/schedules", [(b"set-cookie", session_cookie(session_id, request.secure))])

    # ----------------------------------------------------------------- pages

    async def schedules(self, request: ConsoleRequest) -> Reply:
        session = request.session
        assert session is not None
        principal = session.principal
        state = request.query.get("state") or None
        if state is not None and state not in pages.STATES:
            raise InvalidInput("state", f"must be one of {', '.join(pages.STATES)}", "active")
        target = request.query.get("target") or None
        search = (request.query.get("q") or "").strip()[:100] or None
        scope = principal.scope if principal.tenant_id else (request.query.get("tenant") or None)
        pattern = (
            None if search is None else "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        )
        after_at, after_id = decode_cursor(request.query.get("cursor"))
        limit = 50
        rows = [
            Schedule.from_row(r)
            for r in await self.pool.fetch(
                *QUERIES.console_schedules(
                    tenant_id=scope,
                    state=state,
                    target=target,
                    pattern=pattern,
                    after_at=after_at,
                    after_id=after_id,
                    limit=limit + 1,
                )
            )
        ]
        next_cursor = (
            encode_cursor(rows[limit - 1].created_at, rows[limit - 1].schedule_id) if len(rows) > limit else None
        )
        items = [schedule_to_json(r) for r in rows[:limit]]
        if request.query.get("fragment") == "rows":
            return html(200, pages.schedule_rows(items, principal))
        counts = {
            r["state"]: r["schedules"] for r in await self.pool.fetch(*QUERIES.console_state_counts(tenant_id=scope))
        }
        filters = {
            "state": state,
            "target": target,
            "q": search,
            "tenant": request.query.get("tenant") if principal.operator else None,
        }
        return html(
            200,
            pages.schedules_page(
                items,
                next_cursor,
                filters,
                counts,
                principal,
                session.csrf_token,
                NOTICES.get(request.query.get("done", "")),
            ),
        )

    async def create(self, request: ConsoleRequest) -> Reply:
        session = request.session
        assert session is not None
        form = request.form
        tenant_id = session.principal.tenant_id or form.get("tenant", "").strip()
        try:
            if not tenant_id:
                raise InvalidInput("tenant", "is required for an operator: the tenant that owns the schedule", "acme")
            body = _definition_from_form(form)
            schedule = await self.control.create_schedule(tenant_id, body, form.get("idempotency_key") or None)
        except (InvalidInput, QuotaExceeded, Conflict, NotFound) as err:
            return html(_status(err), pages.new_schedule_page(session.principal, session.csrf_token, form, str(err)))
        return redirect(f"/ui/schedules/{schedule['schedule_id']}?done=created")

    async def preview(self, request: ConsoleRequest) -> Reply:
        try:
            body = orjson.loads(request.body or b"{}")
        except orjson.JSONDecodeError as err:
            raise InvalidInput("body", "is not valid JSON") from err
        if not isinstance(body, dict):
            raise InvalidInput("body", "must be a JSON object")
        definition = {k: body[k] for k in ("kind", "expression", "time_zone") if body.get(k)}
        return _json(200, {"fires": preview_with_dst(definition, await self.control.now(), 10)})

    async def _schedule_row(self, principal_scope: str | None, schedule_id: str) -> Schedule:
        row = await self.pool.fetchrow(
            *QUERIES.scoped_schedule(schedule_id=as_uuid(schedule_id, "schedule"), tenant_id=principal_scope)
        )
        if row is None:
            raise NotFound("schedule", schedule_id)
        return Schedule.from_row(row)

    async def _occurrence_row(self, principal_scope: str | None, occurrence_id: str) -> Occurrence:
        row = await self.pool.fetchrow(
            *QUERIES.scoped_occurrence(occurrence_id=as_uuid(occurrence_id, "occurrence"), tenant_id=principal_scope)
        )
        if row is None:
            raise NotFound("occurrence", occurrence_id)
        return Occurrence.from_row(row)

    async def schedule(self, request: ConsoleRequest, schedule_id: str) -> Reply:
        session = request.session
        assert session is not None
        row = await self._schedule_row(session.principal.scope, schedule_id)
        now = await self.control.now()
        window_from = _instant(request.query.get("from"), "from") or now - timedelta(hours=1)
        window_to = _instant(request.query.get("to"), "to") or now + timedelta(minutes=5)
        timeline = (
            await schedule_timeline(self.pool, session.principal.scope, row.schedule_id, window_from, window_to, now)
        ).to_json()
        zone = ZoneInfo(row.time_zone)

        def local_of(text: str) -> str:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(zone).isoformat()

        fragment = request.query.get("fragment")
        if fragment == "timeline":
            return html(200, pages.timeline_section(timeline, local_of))
        occurrences = [
            _occurrence_json(Occurrence.from_row(o))
            for o in await self.pool.fetch(
                *QUERIES.console_occurrences(schedule_id=row.schedule_id, after_at=None, after_id=None, limit=10)
            )
        ]
        if fragment == "occurrences":
            return html(200, _recent(occurrences))
        schedule = schedule_to_json(row)
        versions = [
            version_to_json(ScheduleVersion.from_row(v))
            for v in await self.pool.fetch(*QUERIES.schedule_versions_of(schedule_id=row.schedule_id))
        ]
        fires: list[dict[str, Any]] = []
        if row.state == "active" and row.next_run_at is not None:
            fires = preview_with_dst(
                {
                    k: v
                    for k, v in schedule.items()
                    if k in ("kind", "expression", "time_zone", "dst_repeat", "dst_gap", "anchor", "start_at", "end_at")
                    and v is not None
                },
                row.next_run_at - timedelta(microseconds=1),
                10,
                await calendar_by_id(self.pool, row.tenant_id, row.calendar_id) if row.calendar_id else None,
            )
        window = {"from": format_instant(window_from), "to": format_instant(window_to)}
        return html(
            200,
            pages.schedule_page(
                schedule,
                versions,
                fires,
                timeline,
                window,
                occurrences,
                session.principal,
                session.csrf_token,
                local_of,
                _notice(request.query),
            ),
        )

    async def occurrences(self, request: ConsoleRequest, schedule_id: str) -> Reply:
        session = request.session
        assert session is not None
        row = await self._schedule_row(session.principal.scope, schedule_id)
        after_at, after_id = decode_cursor(request.query.get("cursor"))
        rows = [
            Occurrence.from_row(o)
            for o in await self.pool.fetch(
                *QUERIES.console_occurrences(
                    schedule_id=row.schedule_id, after_at=after_at, after_id=after_id, limit=101
                )
            )
        ]
        next_cursor = encode_cursor(rows[99].scheduled_for, rows[99].occurrence_id) if len(rows) > 100 else None
        return html(
            200,
            pages.occurrences_page(
                schedule_to_json(row),
                [_occurrence_json(o) for o in rows[:100]],
                next_cursor,
                session.principal,
                session.csrf_token,
            ),
        )

    async def occurrence(self, request: ConsoleRequest, occurrence_id: str) -> Reply:
        session = request.session
        assert session is not None
        row = await self._occurrence_row(session.principal.scope, occurrence_id)
        attempts = [
            attempt_to_json(Attempt.from_row(a))
            for a in await self.pool.fetch(*QUERIES.list_attempts(occurrence_id=row.occurrence_id))
        ]
        return html(
            200,
            pages.occurrence_page(
                _occurrence_json(row),
                attempts,
                session.principal,
                session.csrf_token,
                NOTICES.get(request.query.get("done", "")),
            ),
        )

    # ----------------------------------------------------------------- actions

    async def act(self, request: ConsoleRequest, schedule_id: str, action: str) -> Reply:
        session = request.session
        assert session is not None
        row = await self._schedule_row(session.principal.scope, schedule_id)
        tenant_id, sid = row.tenant_id, row.schedule_id
        by = session.principal.name + " (console)"
        if action in ("pause", "resume", "cancel"):
            await getattr(self.control, f"{action}_schedule")(tenant_id, sid)
            log.info(
                "console action",
                extra={
                    "action": f"console.{action}",
                    "schedule_id": str(sid),
                    "tenant_id": tenant_id,
                    "principal": session.principal.name,
                },
            )
            done = {"pause": "paused", "resume": "resumed", "cancel": "canceled"}[action]
            return redirect(f"/ui/schedules/{sid}?done={done}")
        if action == "trigger":
            await self.requested.trigger_now(tenant_id, sid, by)
            return redirect(f"/ui/schedules/{sid}?done=triggered")
        if action == "backfill":
            window_from = _instant(request.form.get("from"), "from")
            window_to = _instant(request.form.get("to"), "to")
            if window_from is None or window_to is None:
                raise InvalidInput("from" if window_from is None else "to", "is required", "2026-11-29T09:00:00Z")
            result = await self.requested.backfill(tenant_id, sid, window_from, window_to, by)
            return redirect(
                query(
                    f"/ui/schedules/{sid}",
                    **{
                        "from": instant(window_from),
                        "to": instant(window_to),
                        "done": "backfilled",
                        "created": result.created + result.refired,
                    },
                )
            )
        raise NotFound("action", action)

    async def replay(self, request: ConsoleRequest, occurrence_id: str) -> Reply:
        session = request.session
        assert session is not None
        row = await self._occurrence_row(session.principal.scope, occurrence_id)
        await dead_letters.replay_dead_letter(self.pool, row.tenant_id, row.occurrence_id, self.clock)
        return redirect(f"/ui/occurrences/{row.occurrence_id}?done=replayed")


def _notice(params: Mapping[str, str]) -> str | None:
    done = params.get("done", "")
    if done == "backfilled":
        created = params.get("created", "")
        return f"Backfill: {int(created)} slot(s) released." if created.isdigit() else "Backfill done."
    return NOTICES.get(done)


def _recent(occurrences: list[dict[str, Any]]) -> Markup:
    return pages.join(
        pages.render(
            '<tr><td><a href="/ui/occurrences/{id}">{short}</a></td><td>{slot}</td><td>v{v}</td><td>{state}</td>'
            "<td>{attempts}</td><td>{origin}</td></tr>",
            id=o["occurrence_id"],
            short=o["occurrence_id"][:8],
            slot=o["scheduled_for"],
            v=o["schedule_version"],
            state=pages._verdict(o["state"]),
            attempts=o["attempt_count"],
            origin=o["origin"],
        )
        for o in occurrences
    )


def _occurrence_json(row: Occurrence) -> dict[str, Any]:
    """The API's view of an occurrence plus what the console shows of its end."""
    return {
        **occurrence_to_json(row),
        "finished_at": instant(row.finished_at),
        "dead_reason": row.dead_reason,
        "last_error_class": row.last_error_class,
        "last_error_message": row.last_error_message,
    }


def _definition_from_form(form: Mapping[str, str]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for name in ("kind", "expression", "time_zone", "target", "misfire_policy", "overlap_policy"):
        value = (form.get(name) or "").strip()
        if value:
            body[name] = value
    raw = (form.get("payload") or "").strip()
    if raw:
        body["payload"] = field_json(raw, "payload", '{"plan": "pro"}')
    return body


def _instant(raw: str | None, field: str) -> datetime | None:
    if raw is None or not raw.strip():
        return None
    try:
        value = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError as err:
        raise InvalidInput(field, "is not an ISO-8601 instant", "2026-11-29T09:00:00Z") from err
    if value.tzinfo is None:
        raise InvalidInput(field, "needs an offset or Z", "2026-11-29T09:00:00Z")
    return value.astimezone(UTC)


def _status(err: ChronoqError) -> int:
    return err.http_status


def _json(status: int, value: Any) -> Reply:
    return Reply(status, orjson.dumps(value), b"application/json")


def _static(name: str) -> Reply:
    if name not in STATIC:
        return Reply(404, b"not found", b"text/plain")
    data = resources.files("engine.api.console").joinpath("static").joinpath(name).read_bytes()
    return Reply(200, data, STATIC[name], [(b"cache-control", b"max-age=300")])


async def _read(receive: Receive) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks), False

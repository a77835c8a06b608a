"""The Python client for services: the HTTP API and signed Kafka commands.

    client = ChronoqClient("http://127.0.0.1:8080", api_token)
    schedule = await client.create_schedule({"kind": "cron", "expression": "0 9 * * *",
                                             "time_zone": "Europe/Berlin", "target": "billing.invoice"},
                                            idempotency_key="invoice-schedule-42")

    async with CommandProducer(bootstrap, tenant_id, signing_key) as commands:
        command_id = await commands.send("pause", schedule_id=schedule["schedule_id"])

The HTTP side uses only the standard library (requests run in a worker
thread), so a service needs nothing beyond chronoq itself; it never touches
the engine's database.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from schemas.errors import ChronoqError


class ApiError(ChronoqError):
    """The API refused a request: ``status``, ``code`` and, for invalid input, ``field``."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        self.status = status
        self.code = code
        self.field = field
        super().__init__(f"HTTP {status} {code}: {message}")

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        return self.status in (429, 503)


class ChronoqClient:
    """HTTP client of the control plane, scoped to the tenant of ``api_token``."""

    def __init__(self, base_url: str, api_token: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_token = api_token
        self.timeout = timeout

    async def create_schedule(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return await self.request("POST", "/v1/schedules", body, headers)

    async def get_schedule(self, schedule_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/v1/schedules/{_segment(schedule_id)}")

    async def list_schedules(self, *, state: str | None = None, target: str | None = None,
                             cursor: str | None = None, limit: int | None = None) -> dict[str, Any]:
        query = {k: v for k, v in {"state": state, "target": target, "cursor": cursor, "limit": limit}.items()
                 if v is not None}
        return await self.request("GET", "/v1/schedules?" + urllib.parse.urlencode(query))

    async def update_schedule(self, schedule_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", f"/v1/schedules/{_segment(schedule_id)}", changes)

    async def pause_schedule(self, schedule_id: str) -> dict[str, Any]:
        return await self.request("POST", f"/v1/schedules/{_segment(schedule_id)}/pause")

    async def resume_schedule(self, schedule_id: str) -> dict[str, Any]:
        return await self.request("POST", f"/v1/schedules/{_segment(schedule_id)}/resume")

    async def cancel_schedule(self, schedule_id: str) -> dict[str, Any]:
        return await self.request("POST", f"/v1/schedules/{_segment(schedule_id)}/cancel")

    async def list_occurrences(self, schedule_id: str, cursor: str | None = None) -> dict[str, Any]:
        query = "?" + urllib.parse.urlencode({"cursor": cursor}) if cursor else ""
        return await self.request("GET", f"/v1/schedules/{_segment(schedule_id)}/occurrences{query}")

    async def get_occurrence(self, occurrence_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/v1/occurrences/{_segment(occurrence_id)}")

    async def preview(self, body: dict[str, Any]) -> list[dict[str, str]]:
        return (await self.request("POST", "/v1/preview", body))["fires"]

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict[str, str] | None = None) -> Any:
        """One API call; raises ApiError with the server's error details on 4xx/5xx."""
        return await asyncio.to_thread(self._request, method, path, body, headers or {})

    def _request(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.api_token}", "Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            try:
                error = json.loads(err.read())["error"]
            except (ValueError, KeyError, TypeError):
                error = {"code": "http_error", "message": err.reason}
            raise ApiError(err.code, error.get("code", "error"), error.get("message", ""),
                           error.get("field")) from None


def _segment(value: str) -> str:
    return urllib.parse.quote(str(value), safe="")

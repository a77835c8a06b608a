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
import uuid
from datetime import UTC, datetime
from typing import Any

from schemas.commands import HEADER_SIGNATURE, Command, CommandResult, decode_command_result, sign
from schemas.errors import ChronoqError, MalformedMessage
from schemas.kafka_security import PLAINTEXT, KafkaSecurity, start_client
from schemas.topics import (
    COMMAND_RESULTS_TOPIC,
    COMMANDS_TOPIC,
    DEFAULT_PARTITIONS,
    FETCH_WAIT_MS,
    command_results_topic,
    create_missing_topics,
    topic_partitions,
)


class ApiError(ChronoqError):
    """The API refused a request: ``status``, ``code`` and, for invalid input or a quota, ``field``.

    ``transient`` is true for 429 (a quota: retry once it has room) and 503
    (the database is unavailable: retry shortly).
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        self.status = status
        self.code = code  # type: ignore[misc]  # the server's code, per instance
        self.field = field
        super().__init__(f"HTTP {status} {code}: {message}")

    @property
    def http_status(self) -> int:  # type: ignore[override]
        return self.status

    @property
    def transient(self) -> bool:  # type: ignore[override]
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

    async def list_schedules(
        self,
        *,
        state: str | None = None,
        target: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        query = {
            k: v
            for k, v in {"state": state, "target": target, "cursor": cursor, "limit": limit}.items()
            if v is not None
        }
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

    async def get_tenant(self) -> dict[str, Any]:
        """This token's tenant: its quotas and its usage of them (live schedules, summed trigger rate)."""
        return await self.request("GET", "/v1/tenant")

    async def preview(self, body: dict[str, Any]) -> list[dict[str, str]]:
        """The next fires of a definition (``preview_exclusions`` for what its calendar removes too)."""
        return (await self.request("POST", "/v1/preview", body))["fires"]

    async def preview_exclusions(self, body: dict[str, Any]) -> dict[str, Any]:
        """The whole preview: ``fires`` (with ``rule``), ``excluded``, ``excluded_dates``, ``runs_left``."""
        return await self.request("POST", "/v1/preview", body)

    async def preview_schedule(self, schedule_id: str, count: int = 10, after: str | None = None) -> dict[str, Any]:
        query = urllib.parse.urlencode({k: v for k, v in {"count": count, "from": after}.items() if v is not None})
        return await self.request("GET", f"/v1/schedules/{_segment(schedule_id)}/preview?{query}")

    async def create_calendar(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", "/v1/calendars", body)

    async def get_calendar(self, name: str) -> dict[str, Any]:
        return await self.request("GET", f"/v1/calendars/{_segment(name)}")

    async def list_calendars(self, cursor: str | None = None, limit: int | None = None) -> dict[str, Any]:
        query = {k: v for k, v in {"cursor": cursor, "limit": limit}.items() if v is not None}
        return await self.request("GET", "/v1/calendars?" + urllib.parse.urlencode(query))

    async def update_calendar(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", f"/v1/calendars/{_segment(name)}", changes)

    async def delete_calendar(self, name: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/v1/calendars/{_segment(name)}")

    async def import_calendar(
        self, name: str, ics: bytes, time_zone: str | None = None, description: str | None = None
    ) -> dict[str, Any]:
        """Replace (or create) the calendar's dates from an iCalendar file of all-day events."""
        query = urllib.parse.urlencode(
            {k: v for k, v in {"time_zone": time_zone, "description": description}.items() if v is not None}
        )
        return await self.request(
            "POST", f"/v1/calendars/{_segment(name)}/import?{query}", ics, {"Content-Type": "text/calendar"}
        )

    async def calendar_versions(self, name: str) -> list[dict[str, Any]]:
        return (await self.request("GET", f"/v1/calendars/{_segment(name)}/versions"))["items"]

    async def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """One API call; raises ApiError with the server's error details on 4xx/5xx."""
        return await asyncio.to_thread(self._request, method, path, body, headers or {})

    def _request(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
        data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.api_token}", "Content-Type": "application/json", **headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            try:
                error = json.loads(err.read())["error"]
            except (ValueError, KeyError, TypeError):
                error = {"code": "http_error", "message": err.reason}
            raise ApiError(err.code, error.get("code", "error"), error.get("message", ""), error.get("field")) from None


def _segment(value: str) -> str:
    return urllib.parse.quote(str(value), safe="")


class CommandProducer:
    """Signs and produces scheduling commands for one tenant (async context manager).

    ``signing_key`` is the hex string ``chronoq tenant create`` printed. Each
    command gets a fresh command_id (returned) unless one is given; resending
    the same command_id is safe: the engine applies a command once.
    """

    def __init__(
        self, kafka_bootstrap: str, tenant_id: str, signing_key: str | bytes, security: KafkaSecurity = PLAINTEXT
    ) -> None:
        from aiokafka import AIOKafkaProducer

        self.tenant_id = tenant_id
        self.signing_key = bytes.fromhex(signing_key) if isinstance(signing_key, str) else signing_key
        self.kafka_bootstrap, self.security = kafka_bootstrap, security
        self.producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=False, **security.client_options()
        )

    async def __aenter__(self) -> CommandProducer:
        await start_client(self.producer, self.kafka_bootstrap, self.security)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.stop()

    async def send(
        self,
        action: str,
        *,
        schedule_id: str | None = None,
        body: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        command_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """Produce one signed command and wait for the broker's acknowledgement."""
        command = Command(
            command_id or uuid.uuid4(),
            self.tenant_id,
            action,
            datetime.now(UTC),
            uuid.UUID(str(schedule_id)) if schedule_id else None,
            idempotency_key,
            body,
        )
        value = command.encode()
        await self.producer.send_and_wait(
            COMMANDS_TOPIC,
            value,
            key=self.tenant_id.encode(),
            headers=[(HEADER_SIGNATURE, sign(self.signing_key, value).encode())],
        )
        return command.command_id


class CommandResults:
    """Waits for the results of one tenant's commands.

    A tenant's results arrive on its own topic (``chronoq.command-results.<tenant>``);
    commands that could not be attributed to a tenant (malformed, badly signed)
    are answered on the shared ``chronoq.command-results`` with the command id
    and the reason only. This reads both, so ``wait_for`` sees every answer to
    the commands it sent, and never another tenant's results.

    Start it BEFORE sending: it reads from the end of the topics as of
    :meth:`start`, so earlier results are not replayed.
    """

    def __init__(self, kafka_bootstrap: str, tenant_id: str, security: KafkaSecurity = PLAINTEXT) -> None:
        from aiokafka import AIOKafkaConsumer

        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=FETCH_WAIT_MS,
            **security.client_options(),
        )
        self.kafka_bootstrap, self.security = kafka_bootstrap, security
        self.topics = [command_results_topic(tenant_id), COMMAND_RESULTS_TOPIC]
        self._seen: dict[uuid.UUID, CommandResult] = {}

    async def __aenter__(self) -> CommandResults:
        from aiokafka import TopicPartition

        await create_missing_topics(
            self.kafka_bootstrap, [COMMANDS_TOPIC, *self.topics], DEFAULT_PARTITIONS, self.security
        )
        await start_client(self.consumer, self.kafka_bootstrap, self.security)
        # From an admin client: this consumer assigns partitions itself, so it
        # has no metadata for the topic on Apache Kafka (schemas.topics says why).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        assigned: list[TopicPartition] = []
        for topic in self.topics:
            partitions = await topic_partitions(self.kafka_bootstrap, topic, self.security)
            while not partitions:
                if loop.time() > deadline:
                    await self.consumer.stop()
                    raise TimeoutError(f"topic {topic} has no partitions 30 s after creating it")
                await asyncio.sleep(0.05)  # created a moment ago
                partitions = await topic_partitions(self.kafka_bootstrap, topic, self.security)
            assigned.extend(TopicPartition(topic, p) for p in sorted(partitions))
        self.consumer.assign(assigned)
        await self.consumer.seek_to_end()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()

    async def wait_for(self, command_id: uuid.UUID, timeout: float = 30.0) -> CommandResult:
        """The result of ``command_id``; TimeoutError if none arrives in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while command_id not in self._seen:
            if loop.time() > deadline:
                raise TimeoutError(f"no result for command {command_id} within {timeout} s")
            batches = await self.consumer.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    try:
                        result = decode_command_result(record.value)
                    except MalformedMessage:
                        continue  # not a result chronoq wrote: nothing to wait for in it
                    self._seen[result.command_id] = result
        return self._seen[command_id]

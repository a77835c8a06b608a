"""Scheduling commands on Kafka (``chronoq.commands``) and their results
(``chronoq.command-results``), format version 1.

A command is a JSON object::

    {"format": 1, "command_id": "uuid", "tenant_id": "acme",
     "action": "create" | "update" | "pause" | "resume" | "cancel",
     "issued_at": "2026-11-29T10:00:00Z",
     "schedule_id": "uuid" (all but create), "idempotency_key": "..." (create, optional),
     "body": {...} (create: the schedule definition; update: the fields to change)}

keyed by tenant_id (a tenant's commands stay in order), with the header
``chronoq-signature: hex(HMAC-SHA256(signing_key, value))`` over the exact
value bytes, so no canonical form is needed and no secret travels in the log.

A result, keyed by command_id::

    {"format": 1, "command_id": "uuid", "tenant_id": "acme" | null,
     "status": "applied" | "rejected", "schedule": {...} | null,
     "error": {"code": "...", "message": "...", "field": "..."} | null}
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from schemas.messages import MalformedMessage, decode_json_object, format_instant

FORMAT_VERSION = 1
ACTIONS = ("create", "update", "pause", "resume", "cancel")
HEADER_SIGNATURE = "chronoq-signature"


@dataclass(frozen=True)
class Command:
    command_id: uuid.UUID
    tenant_id: str
    action: str
    issued_at: datetime
    schedule_id: uuid.UUID | None = None
    idempotency_key: str | None = None
    body: dict[str, Any] | None = None

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "format": FORMAT_VERSION,
                "command_id": str(self.command_id),
                "tenant_id": self.tenant_id,
                "action": self.action,
                "issued_at": format_instant(self.issued_at),
                "schedule_id": str(self.schedule_id) if self.schedule_id else None,
                "idempotency_key": self.idempotency_key,
                "body": self.body,
            }
        )


def sign(signing_key: bytes, value: bytes) -> str:
    return hmac.new(signing_key, value, hashlib.sha256).hexdigest()


def signature_valid(signing_key: bytes, value: bytes, signature: str | None) -> bool:
    """Constant-time check of a command's signature."""
    if not signature:
        return False
    return hmac.compare_digest(sign(signing_key, value), signature)


def decode_command(value: bytes | None) -> Command:
    """Parse a command (signature not checked here); MalformedMessage says what is wrong."""
    data = decode_json_object(value, "command")
    try:
        command_id = uuid.UUID(str(data.get("command_id")))
    except ValueError as err:
        raise MalformedMessage("command_id must be a UUID") from err
    tenant_id, action = data.get("tenant_id"), data.get("action")
    if not isinstance(tenant_id, str) or not tenant_id:
        raise MalformedMessage("tenant_id must be a non-empty string")
    if action not in ACTIONS:
        raise MalformedMessage(f"action must be one of {', '.join(ACTIONS)}")
    try:
        issued_at = datetime.fromisoformat(str(data.get("issued_at")).replace("Z", "+00:00"))
    except ValueError as err:
        raise MalformedMessage("issued_at must be an ISO-8601 instant") from err
    if issued_at.tzinfo is None:
        raise MalformedMessage("issued_at needs an offset or Z")
    schedule_id = None
    if action != "create":
        try:
            schedule_id = uuid.UUID(str(data.get("schedule_id")))
        except ValueError as err:
            raise MalformedMessage(f"schedule_id must be a UUID for {action}") from err
    body = data.get("body")
    if action in ("create", "update") and not isinstance(body, dict):
        raise MalformedMessage(f"body must be a JSON object for {action}")
    key = data.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 200):
        raise MalformedMessage("idempotency_key must be a string of 1-200 characters")
    return Command(command_id, tenant_id, action, issued_at, schedule_id, key, body)


@dataclass(frozen=True)
class CommandResult:
    command_id: uuid.UUID
    tenant_id: str | None
    status: str  # applied | rejected
    schedule: dict[str, Any] | None = None
    error: dict[str, Any] | None = field(default=None)

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "format": FORMAT_VERSION,
                "command_id": str(self.command_id),
                "tenant_id": self.tenant_id,
                "status": self.status,
                "schedule": self.schedule,
                "error": self.error,
            }
        )

    def to_json(self) -> dict[str, Any]:
        return orjson.loads(self.encode())


def decode_command_result(value: bytes) -> CommandResult:
    data = orjson.loads(value)
    return CommandResult(
        uuid.UUID(data["command_id"]), data.get("tenant_id"), data["status"], data.get("schedule"), data.get("error")
    )

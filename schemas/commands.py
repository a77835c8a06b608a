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

from schemas import record_fields as fields
from schemas.errors import MalformedMessage
from schemas.exact_json import InexactNumber, check_exact
from schemas.messages import decode_json_object, format_instant
from schemas.topics import TENANT_ID_PATTERN

FORMAT_VERSION = 1
ACTIONS = ("create", "update", "pause", "resume", "cancel")
HEADER_SIGNATURE = "chronoq-signature"
MAX_SIGNATURE = 128  # hex of an HMAC-SHA256 is 64 characters
MAX_IDEMPOTENCY_KEY = 200


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


def signature_of(headers: fields.Headers) -> str | None:
    """The ``chronoq-signature`` header as text (None when absent or null), or MalformedMessage."""
    return fields.header_text(headers, HEADER_SIGNATURE, MAX_SIGNATURE)


def decode_command(value: bytes | None) -> Command:
    """Parse a command (signature not checked here); MalformedMessage says what is wrong, nothing else is raised."""
    data = decode_json_object(value, "command")
    try:
        check_exact(value or b"")  # a value (bytes) it is: decode_json_object refused anything else
    except InexactNumber as err:
        raise MalformedMessage(f"command {err}", err.top or "body") from err
    command_id = fields.uuid_field(data, "command_id")
    tenant_id = fields.text(data, "tenant_id", 63)
    if not TENANT_ID_PATTERN.fullmatch(tenant_id):
        raise MalformedMessage(
            "field 'tenant_id' is not a tenant id (1-63 lowercase letters, digits, '-' or '_')", "tenant_id"
        )
    action = fields.choice(data, "action", ACTIONS)
    issued_at = fields.instant(data, "issued_at")
    schedule_id = fields.uuid_field(data, "schedule_id") if action != "create" else None
    body = data.get("body")
    if action in ("create", "update") and not isinstance(body, dict):
        raise MalformedMessage(f"field 'body' must be a JSON object for {action}", "body")
    if action not in ("create", "update"):
        body = None
    key = fields.optional_text(data, "idempotency_key", MAX_IDEMPOTENCY_KEY)
    if key == "":
        raise MalformedMessage(f"field 'idempotency_key' must be 1-{MAX_IDEMPOTENCY_KEY} characters", "idempotency_key")
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


RESULT_STATUSES = ("applied", "rejected")


def decode_command_result(value: bytes | None) -> CommandResult:
    """Decode a command result or raise MalformedMessage (and nothing else)."""
    data = decode_json_object(value, "command result")
    schedule, error = data.get("schedule"), data.get("error")
    if schedule is not None and not isinstance(schedule, dict):
        raise MalformedMessage("field 'schedule' must be an object or null", "schedule")
    if error is not None and not isinstance(error, dict):
        raise MalformedMessage("field 'error' must be an object or null", "error")
    return CommandResult(
        fields.uuid_field(data, "command_id"),
        fields.optional_text(data, "tenant_id", 63),
        fields.choice(data, "status", RESULT_STATUSES),
        schedule,
        error,
    )

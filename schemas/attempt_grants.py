"""Attempt grants: the engine's answer to each ``started`` it applied (the cancel barrier).

Topic ``chronoq.attempt-grants``, written only by the engine's attempt processor, after the transaction
that applied the ``started`` committed; read by the consumer runtime, which calls the handler only once
the answer for its lease token is ``granted``. Encoded with orjson as a JSON object, format 1::

    {"format": 1, "occurrence_id": "uuid", "lease_token": "uuid", "consumer_group": "billing",
     "result": "granted"}
    {"format": 1, "occurrence_id": "uuid", "lease_token": "uuid", "consumer_group": "billing",
     "result": "refused", "reason": "canceled"}

The answer is derived from the occurrence's state after the transaction, not from the event's verdict
alone: a ``started`` read again after a crash between the commit and the reply (a duplicate) is still
answered ``granted`` while the occurrence is RUNNING on that lease token.

**Partitioning.** Every reply for one consumer group goes to one partition, :func:`grant_partition` of
the group (a pure function both sides compute): a runtime instance assigns itself that partition only
(no consumer group: every instance of the group reads it and keeps the answers for its own tokens), so
no instance reads other groups' replies. The record key is the occurrence id.

**Answer groups (format 2).** The answers to ``started`` events that came in a group (format 2 of
``schemas/attempt_events.py``) go back as groups too: one record per consumer group holding up to
:data:`MAX_GROUP_GRANTS` answers, the group named once::

    {"format": 2, "consumer_group": "billing", "grants": [{"occurrence_id": "uuid", "lease_token": "uuid",
     "result": "granted"}, ...]}

The engine answers in the form it was asked: a runtime that sends single events (an older one) gets single
answers, so engines can be upgraded before runtimes. The group's key is its first answer's occurrence id.
"""

from __future__ import annotations

import functools
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from schemas import record_fields as fields
from schemas.errors import MalformedMessage
from schemas.frozen_records import quick_init
from schemas.messages import HEADER_FORMAT, HEADER_OCCURRENCE_ID, Record, decode_json_object

FORMAT_VERSION = 1
_FORMAT_HEADER = str(FORMAT_VERSION).encode()
GROUP_FORMAT = 2
_GROUP_FORMAT_HEADER = str(GROUP_FORMAT).encode()
_FORMATS = frozenset({FORMAT_VERSION, GROUP_FORMAT})
#: Answers in one group record at most (~120 bytes each).
MAX_GROUP_GRANTS = 1000

GRANTED = "granted"
REFUSED = "refused"
RESULTS = (GRANTED, REFUSED)

#: Why a ``started`` was refused.
CANCELED = "canceled"  # the occurrence is CANCELED (a cancel or an update committed first)
FENCED = "fenced"  # another lease is current (a later claim took over, or the delivery moved on)
FINISHED = "finished"  # the occurrence reached another final state (SUCCEEDED, DEAD, ...)
UNKNOWN = "unknown"  # the engine has no such occurrence
FOREIGN_GROUP = "foreign_group"  # the group does not own the occurrence's target
NOT_AUTHENTICATED = "not_authenticated"  # the event was not signed by the target's consumer side
REFUSAL_REASONS = (CANCELED, FENCED, FINISHED, UNKNOWN, FOREIGN_GROUP, NOT_AUTHENTICATED)

MAX_CONSUMER_GROUP = 255


@quick_init
@dataclass(frozen=True)
class AttemptGrant:
    """The engine's answer to one ``started``: ``granted``, or ``refused`` with a reason."""

    occurrence_id: uuid.UUID
    lease_token: uuid.UUID
    consumer_group: str
    result: str
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise MalformedMessage(f"field 'result' must be one of {', '.join(RESULTS)}", "result")
        if self.result == REFUSED and self.reason not in REFUSAL_REASONS:
            raise MalformedMessage(f"a refused grant needs a reason: one of {', '.join(REFUSAL_REASONS)}", "reason")
        if self.result == GRANTED and self.reason is not None:
            raise MalformedMessage("a granted answer has no reason", "reason")
        group = self.consumer_group
        if not isinstance(group, str) or not group or len(group) > MAX_CONSUMER_GROUP or not _wire_text(group):
            raise MalformedMessage(
                f"field 'consumer_group' must be a non-empty string of at most {MAX_CONSUMER_GROUP} characters"
                " without NUL or lone surrogates",
                "consumer_group",
            )

    @property
    def granted(self) -> bool:
        return self.result == GRANTED

    @functools.cached_property
    def key(self) -> bytes:
        return str(self.occurrence_id).encode()

    def headers(self) -> list[tuple[str, bytes]]:
        return [(HEADER_FORMAT, _FORMAT_HEADER), (HEADER_OCCURRENCE_ID, self.key)]

    def encode(self) -> bytes:
        """The answer alone, as a format-1 record value."""
        return orjson.dumps(
            {"format": FORMAT_VERSION, "consumer_group": self.consumer_group, **self._answer()}, default=str
        )

    def _answer(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "occurrence_id": self.occurrence_id,
            "lease_token": self.lease_token,
            "result": self.result,
        }
        if self.reason is not None:
            data["reason"] = self.reason
        return data


def encode_grant_group(grants: Sequence[AttemptGrant]) -> Record:
    """One group record (key, value, headers) of 1 to :data:`MAX_GROUP_GRANTS` answers for one consumer group."""
    if not 0 < len(grants) <= MAX_GROUP_GRANTS:
        raise ValueError(f"a group holds 1 to {MAX_GROUP_GRANTS} answers, not {len(grants)}")
    group = grants[0].consumer_group
    if any(grant.consumer_group != group for grant in grants):
        raise ValueError("the answers of one group record are for one consumer group")
    value = orjson.dumps(
        {"format": GROUP_FORMAT, "consumer_group": group, "grants": [grant._answer() for grant in grants]},
        default=str,
    )
    return grants[0].key, value, [(HEADER_FORMAT, _GROUP_FORMAT_HEADER)]


def _wire_text(text: str) -> bool:
    """Text JSON on the wire can carry: no NUL, no lone surrogate."""
    if "\x00" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def decode_attempt_grant(value: bytes | None) -> AttemptGrant:
    """Decode a single (format 1) grant or raise MalformedMessage saying what is wrong (strict: every field
    checked)."""
    data = decode_json_object(value, "attempt grant")
    return _grant_from_object(data, fields.text(data, "consumer_group", MAX_CONSUMER_GROUP))


def decode_attempt_grants(value: bytes | None) -> list[AttemptGrant]:
    """The answers of an attempt-grants record, in order: one for a single answer (format 1), the group's for a
    group (format 2); MalformedMessage if the record or any answer of a group is not well formed."""
    data = fields.json_object(value, "attempt grant", _FORMATS)
    group = fields.text(data, "consumer_group", MAX_CONSUMER_GROUP)
    if data["format"] == FORMAT_VERSION:
        return [_grant_from_object(data, group)]
    return fields.entries(data, "grants", MAX_GROUP_GRANTS, lambda entry: _grant_from_object(entry, group))


def _grant_from_object(data: dict[str, Any], consumer_group: str) -> AttemptGrant:
    result = fields.choice(data, "result", RESULTS)
    reason = fields.choice(data, "reason", REFUSAL_REASONS) if result == REFUSED else None
    if result == GRANTED and data.get("reason") is not None:
        raise MalformedMessage("a granted answer has no reason", "reason")
    return AttemptGrant(
        # Matched against the runtime's own waiting attempts, never handed to user code (record_fields).
        occurrence_id=fields.uuid_field(data, "occurrence_id", internal=True),
        lease_token=fields.uuid_field(data, "lease_token", internal=True),
        consumer_group=consumer_group,
        result=result,
        reason=reason,
    )


def grant_partition(consumer_group: str, partitions: int) -> int:
    """The partition of ``chronoq.attempt-grants`` that carries every answer for ``consumer_group``.

    CRC-32 of the group's UTF-8 bytes modulo the topic's partition count: stable across processes and
    languages (unlike Python's ``hash``), so the engine and every runtime instance agree on it.
    """
    if partitions < 1:
        raise ValueError("the attempt-grants topic has no partitions")
    return zlib.crc32(consumer_group.encode()) % partitions

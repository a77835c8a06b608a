"""Every decoder is total: any bytes and headers give a typed message or MalformedMessage, nothing else.

Hypothesis feeds each decoder random bytes, right-shaped JSON with fields of
the wrong type, NUL characters, huge and negative numbers, NaN and extreme
instants, with random headers (null values, non-UTF-8 bytes). Whatever a
decoder accepts must also encode again: an accepted record holds only values
the wire can carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.attempt_events import AttemptRecord, decode_attempt_record, encode_group
from schemas.attempt_grants import AttemptGrant, decode_attempt_grants, encode_grant_group
from schemas.commands import Command, decode_command, decode_command_result, signature_of
from schemas.dead_letter_messages import decode_dead_occurrence
from schemas.errors import MalformedMessage
from schemas.messages import HEADER_TENANT, OccurrenceMessage, decode_occurrence, decode_schedule_state
from schemas.target_bindings import decode_target_binding
from tests.support.hostile_records import VALID, hostile_headers, records


def _occurrence(value: bytes | None, headers: Any) -> OccurrenceMessage:
    return decode_occurrence(value, headers)


def _command(value: bytes | None, headers: Any) -> Command:
    signature_of(headers)
    return decode_command(value)


class _AttemptRecord:
    """A decoded attempts-topic record that encodes back to its own form (one event, or a group)."""

    def __init__(self, record: AttemptRecord) -> None:
        self.record = record

    def encode(self) -> bytes:
        events = self.record.events
        return encode_group(events)[1] if self.record.grouped else events[0].encode()


class _GrantRecord:
    def __init__(self, grants: list[AttemptGrant], grouped: bool) -> None:
        self.grants, self.grouped = grants, grouped

    def encode(self) -> bytes:
        return encode_grant_group(self.grants)[1] if self.grouped else self.grants[0].encode()


DECODERS: dict[str, Callable[[bytes | None, Any], Any]] = {
    "occurrence": _occurrence,
    "schedule_state": lambda value, headers: decode_schedule_state(value),
    "command": _command,
    "command_result": lambda value, headers: decode_command_result(value),
    "attempt_event": lambda value, headers: _AttemptRecord(decode_attempt_record(value)),
    "attempt_event_group": lambda value, headers: _AttemptRecord(decode_attempt_record(value)),
    "attempt_grant": lambda value, headers: _GrantRecord(decode_attempt_grants(value), grouped=False),
    "attempt_grant_group": lambda value, headers: _GrantRecord(decode_attempt_grants(value), grouped=True),
    "dead_occurrence": lambda value, headers: decode_dead_occurrence(value),
    "target_binding": lambda value, headers: decode_target_binding(value),
}


def check_total(kind: str, value: bytes | None, headers: Any) -> None:
    try:
        message = DECODERS[kind](value, headers)
    except MalformedMessage as err:
        assert str(err) and (err.field is None or isinstance(err.field, str))
        return
    message.encode()  # accepted ⇒ every value fits the wire again


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_valid_records_decode_to_themselves(kind):
    decoded = DECODERS[kind](VALID[kind], [("chronoq-signature", b"ab"), (HEADER_TENANT, b"acme")])
    assert decoded.encode() == VALID[kind]


@pytest.mark.parametrize("kind", sorted(DECODERS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_bytes_and_headers_give_a_message_or_a_rejection(kind, data):
    check_total(kind, data.draw(records(kind)), data.draw(hostile_headers))


@pytest.mark.parametrize(
    "raw, field",
    [
        ("0001-01-01T00:00:00+01:00", "changed_at"),  # the finding: OverflowError stopped every consumer app
        ("9999-12-31T23:59:59-01:00", "changed_at"),
        ("1799-12-31T23:59:59Z", "changed_at"),
    ],
)
def test_an_instant_outside_the_range_is_a_rejection_naming_the_field(raw, field):
    data = orjson.loads(VALID["schedule_state"])
    data["changed_at"] = raw
    with pytest.raises(MalformedMessage) as caught:
        decode_schedule_state(orjson.dumps(data))
    assert caught.value.field == field


def test_a_null_or_binary_signature_header_is_a_rejection_not_a_crash():
    assert signature_of([("chronoq-signature", None)]) is None
    with pytest.raises(MalformedMessage):
        signature_of([("chronoq-signature", b"\xff\xfe")])


def test_a_body_and_a_header_that_disagree_about_the_tenant_are_rejected():
    with pytest.raises(MalformedMessage) as caught:
        decode_occurrence(VALID["occurrence"], [(HEADER_TENANT, b"globex")])
    assert caught.value.field == HEADER_TENANT


@pytest.mark.parametrize(
    "field, value",
    [
        ("tenant_id", "acme\x00"),
        ("idempotency_key", "k\x00"),
        ("tenant_id", "Not A Tenant"),
        ("issued_at", "0001-01-01T00:00:00+01:00"),
    ],
)
def test_commands_with_nul_or_impossible_values_are_rejected_naming_the_field(field, value):
    data = orjson.loads(VALID["command"])
    data[field] = value
    with pytest.raises(MalformedMessage) as caught:
        decode_command(orjson.dumps(data))
    assert caught.value.field == field

import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.identity import is_slot_occurrence, occurrence_id
from schemas.messages import (
    MalformedMessage,
    OccurrenceMessage,
    decode_occurrence,
    format_instant,
)

UTC = UTC


def sample(**overrides):
    fields: dict[str, Any] = dict(
        occurrence_id=uuid.uuid4(),
        schedule_id=uuid.uuid4(),
        schedule_version=3,
        tenant_id="acme",
        target="billing.invoice",
        scheduled_for=datetime(2026, 11, 1, 5, 30, tzinfo=UTC),
        available_at=datetime(2026, 11, 1, 5, 30, 12, 500000, tzinfo=UTC),
        attempt=2,
        priority="flexible",
        deadline=None,
        payload={"invoice": 42, "items": [1, 2]},
    )
    fields.update(overrides)
    return OccurrenceMessage(**fields)


def test_round_trip_keeps_every_field():
    message = sample()
    assert decode_occurrence(message.encode()) == message


def test_wire_format_is_versioned_utc_json():
    data = orjson.loads(sample().encode())
    assert data["format"] == 1
    assert data["scheduled_for"] == "2026-11-01T05:30:00Z"
    assert data["available_at"] == "2026-11-01T05:30:12.500000Z"


def test_unknown_fields_are_ignored_for_forward_compatibility():
    data = orjson.loads(sample().encode())
    data["added_in_a_later_release"] = True
    assert decode_occurrence(orjson.dumps(data)).tenant_id == "acme"


@pytest.mark.parametrize(
    "value, fragment",
    [
        (None, "tombstone"),
        (b"\xff\xfe not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (orjson.dumps({"format": 99}), "unknown message format 99"),
    ],
)
def test_undecodable_messages_say_why(value, fragment):
    with pytest.raises(MalformedMessage, match=fragment):
        decode_occurrence(value)


@pytest.mark.parametrize(
    "field, bad",
    [
        ("occurrence_id", "nope"),
        ("scheduled_for", "yesterday"),
        ("scheduled_for", "2026-01-01T00:00:00"),
        ("attempt", 0),
        ("tenant_id", ""),
        ("schedule_version", "1"),
    ],
)
def test_invalid_field_is_named(field, bad):
    data = orjson.loads(sample().encode())
    data[field] = bad
    with pytest.raises(MalformedMessage, match=field):
        decode_occurrence(orjson.dumps(data))


def test_the_binding_version_round_trips_and_is_absent_when_unknown():
    stamped = sample(binding_version=7)
    assert orjson.loads(stamped.encode())["binding_version"] == 7
    assert decode_occurrence(stamped.encode()) == stamped
    # An older engine's message: no field at all (so it re-encodes byte for byte), read as None.
    older = sample()
    assert "binding_version" not in orjson.loads(older.encode())
    assert decode_occurrence(older.encode()).binding_version is None
    data = orjson.loads(older.encode())
    data["binding_version"] = None
    assert decode_occurrence(orjson.dumps(data)).binding_version is None


@pytest.mark.parametrize("bad", [0, -1, 2**31, 2**62, 1.5, "3", True, [], {"v": 1}])
def test_a_hostile_binding_version_is_rejected_naming_the_field(bad):
    data = orjson.loads(sample().encode())
    data["binding_version"] = bad
    with pytest.raises(MalformedMessage) as caught:
        decode_occurrence(orjson.dumps(data))
    assert caught.value.field == "binding_version" and "binding_version" in str(caught.value)


@pytest.mark.parametrize("binding_version", [None, 1, 2**31 - 1])
def test_the_materializers_encoding_is_the_messages_encoding(binding_version):
    from engine.loops.occurrence_rows import encode_occurrence
    from engine.records import DueSchedule
    from tests.unit.test_records import due_row

    schedule = DueSchedule.from_row(due_row())
    at = datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
    oid = uuid.uuid4()
    raw = encode_occurrence(oid, str(schedule.schedule_id), schedule, at, at, None, binding_version)
    expected = OccurrenceMessage(
        oid, schedule.schedule_id, schedule.version, "acme", "billing.invoice", at, at, 1, "flexible", None,
        {"plan": "pro"}, binding_version,
    )  # fmt: skip
    assert decode_occurrence(raw) == expected
    assert orjson.loads(raw) == orjson.loads(expected.encode())


def test_occurrence_id_is_deterministic_and_zone_independent():
    schedule = uuid.UUID("00000000-0000-4000-8000-000000000001")
    instant = datetime(2026, 3, 8, 7, 30, tzinfo=UTC)
    from zoneinfo import ZoneInfo

    local = instant.astimezone(ZoneInfo("America/New_York"))
    assert occurrence_id(schedule, 1, instant) == occurrence_id(schedule, 1, local)
    # Pinned value: changing the derivation would break dedupe across an upgrade.
    assert occurrence_id(schedule, 1, instant) == uuid.UUID("89f76299-97fd-5481-aa09-2c089c0df435")


@given(st.integers(1, 1000), st.datetimes(timezones=st.just(UTC)), st.datetimes(timezones=st.just(UTC)))
def test_occurrence_ids_differ_when_inputs_differ(version, a, b):
    schedule = uuid.UUID("00000000-0000-4000-8000-000000000001")
    assert (occurrence_id(schedule, version, a) == occurrence_id(schedule, version, b)) == (a == b)
    assert occurrence_id(schedule, version, a) != occurrence_id(schedule, version + 1, a)


@given(st.integers(1, 1000), st.datetimes(timezones=st.timezones()), st.uuids())
def test_only_the_slots_own_id_is_taken_for_the_slots_occurrence(version, at, other):
    schedule = uuid.UUID("00000000-0000-4000-8000-000000000001")
    assert is_slot_occurrence(occurrence_id(schedule, version, at), schedule, version, at)
    assert not is_slot_occurrence(occurrence_id(schedule, version + 1, at), schedule, version, at)
    assert not is_slot_occurrence(other, schedule, version, at)  # a manual run's id (uuid4 or its own uuid5)


def test_naive_instants_are_refused():
    with pytest.raises(ValueError):
        occurrence_id(uuid.uuid4(), 1, datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        format_instant(datetime(2026, 1, 1))


def test_schedule_state_round_trip_and_key():
    from schemas.messages import ScheduleStateMessage, decode_schedule_state

    state = ScheduleStateMessage(uuid.uuid4(), "acme", 4, "canceled", datetime(2026, 11, 29, tzinfo=UTC))
    assert decode_schedule_state(state.encode()) == state
    assert state.key == str(state.schedule_id).encode()

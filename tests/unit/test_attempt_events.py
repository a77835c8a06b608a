"""The attempt event and dead-letter formats: round trips and what a reader rejects."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.attempt_events import (
    CANCEL_REASONS,
    MAX_GROUP_BYTES,
    MAX_GROUP_EVENTS,
    AttemptEvent,
    AttemptRecord,
    decode_attempt_event,
    decode_attempt_record,
    encode_group,
    encode_groups,
)
from schemas.dead_letter_messages import (
    DeadOccurrenceMessage,
    decode_dead_occurrence,
    occurrence_id_of,
)
from schemas.messages import MalformedMessage, OccurrenceMessage

OCC = uuid.uuid4()
TOKEN = uuid.uuid4()

events = st.one_of(
    st.builds(
        AttemptEvent.started,
        st.uuids(),
        st.integers(1, 100),
        st.uuids(),
        st.floats(0.1, 3600),
        st.text(min_size=1, max_size=20),
        st.text(max_size=20),
    ),
    st.builds(AttemptEvent.heartbeat, st.uuids(), st.integers(1, 100), st.uuids(), st.floats(0.1, 3600)),
    st.builds(AttemptEvent.succeeded, st.uuids(), st.integers(1, 100), st.uuids()),
    st.builds(
        AttemptEvent.failed,
        st.uuids(),
        st.integers(1, 100),
        st.uuids(),
        st.text(min_size=1, max_size=50),
        st.text(max_size=300),
        st.booleans(),
    ),
    st.builds(
        AttemptEvent.canceled, st.uuids(), st.integers(1, 100), st.sampled_from(CANCEL_REASONS), st.none() | st.uuids()
    ),
    st.builds(AttemptEvent.already_applied, st.uuids(), st.integers(1, 100), st.none() | st.uuids()),
)


@given(events)
def test_every_event_round_trips(event):
    assert decode_attempt_event(event.encode()) == event
    assert event.key == str(event.occurrence_id).encode()


def test_the_wire_format_is_plain_json():
    data = orjson.loads(AttemptEvent.started(OCC, 2, TOKEN, 30.0, "billing", "host:1").encode())
    assert data == {
        "format": 1,
        "event": "started",
        "occurrence_id": str(OCC),
        "attempt": 2,
        "lease_token": str(TOKEN),
        "lease_ttl": 30.0,
        "consumer_group": "billing",
        "worker": "host:1",
    }


def test_unknown_fields_are_ignored():
    data = orjson.loads(AttemptEvent.succeeded(OCC, 1, TOKEN).encode())
    data["added_later"] = {"x": 1}
    assert decode_attempt_event(orjson.dumps(data)) == AttemptEvent.succeeded(OCC, 1, TOKEN)


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda d: d.pop("lease_token"), "lease_token"),
        (lambda d: d.update(attempt=0), "attempt"),
        (lambda d: d.update(attempt=True), "attempt"),
        (lambda d: d.update(event="exploded"), "unknown attempt event"),
        (lambda d: d.update(format=9), "format"),
        (lambda d: d.update(occurrence_id="nope"), "occurrence_id"),
        (lambda d: d.update(lease_ttl=-1), "lease_ttl"),
        (lambda d: d.update(permanent="yes"), "permanent"),
    ],
)
def test_malformed_events_are_rejected_with_the_reason(mutate, problem):
    data = orjson.loads(AttemptEvent.started(OCC, 1, TOKEN, 30.0).encode())
    mutate(data)
    with pytest.raises(MalformedMessage, match=problem):
        decode_attempt_event(orjson.dumps(data))


@pytest.mark.parametrize("raw", [None, b"", b"\x00garbage", b"[]"])
def test_garbage_is_malformed(raw):
    with pytest.raises(MalformedMessage):
        decode_attempt_event(raw)


def test_failed_needs_an_error_class_and_canceled_a_reason():
    with pytest.raises(MalformedMessage):
        AttemptEvent("failed", OCC, 1, TOKEN)
    with pytest.raises(MalformedMessage):
        AttemptEvent("canceled", OCC, 1, reason="because")


def test_long_error_messages_are_cut():
    event = AttemptEvent.failed(OCC, 1, TOKEN, "E" * 500, "m" * 10_000)
    assert event.error_class is not None and event.error_message is not None
    assert len(event.error_class) == 200 and len(event.error_message) == 2000


def test_dead_occurrence_records_round_trip_and_poison_is_told_apart():
    at = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    occurrence = OccurrenceMessage(OCC, uuid.uuid4(), 1, "acme", "billing.invoice", at, at, 3, payload={"n": 1})
    record = DeadOccurrenceMessage(occurrence, 3, "max_attempts", "TimeoutError", "slow", at)
    assert decode_dead_occurrence(record.encode()) == record
    assert occurrence_id_of(record.encode()) == OCC
    assert occurrence_id_of(b"\x00garbage") is None


def test_a_started_event_carries_its_claim_order_and_older_ones_have_none():
    """Issue 11, takeover by claim order: the field round-trips, is optional, and is checked as an integer."""
    event = AttemptEvent.started(uuid.uuid4(), 1, uuid.uuid4(), 30.0, "billing", claim_order=2**40)
    assert decode_attempt_event(event.encode()).claim_order == 2**40
    older = AttemptEvent.started(uuid.uuid4(), 1, uuid.uuid4(), 30.0, "billing")
    assert b"claim_order" not in older.encode()
    assert decode_attempt_event(older.encode()).claim_order is None
    bad = older.encode().replace(b'"billing"', b'"billing","claim_order":"7"')
    with pytest.raises(MalformedMessage) as raised:
        decode_attempt_event(bad)
    assert raised.value.field == "claim_order"


@given(st.lists(events, min_size=1, max_size=20))
def test_a_group_holds_its_events_in_order_and_a_single_record_one(group):
    key, value, headers = encode_group(group)
    assert decode_attempt_record(value) == AttemptRecord(group, grouped=True)
    assert key == group[0].key and dict(headers)["chronoq-format"] == b"2"
    assert decode_attempt_record(group[0].encode()) == AttemptRecord(group[:1], grouped=False)


@pytest.mark.parametrize(
    "events_field, problem",
    [
        ([], "1 to 500"),
        ([{}] * 501, "1 to 500"),
        ("started", "1 to 500"),
        ([["started"]], "events[0] is not a JSON object"),
        ([{"event": "started"}], "events[0]: field 'occurrence_id'"),
    ],
)
def test_a_malformed_group_is_rejected_whole_saying_which_event(events_field, problem):
    with pytest.raises(MalformedMessage, match=problem.replace("[", r"\[").replace("]", r"\]")):
        decode_attempt_record(orjson.dumps({"format": 2, "events": events_field}))


def test_a_group_names_the_event_at_fault_and_a_single_reader_refuses_groups():
    good = AttemptEvent.succeeded(OCC, 1, TOKEN)
    data = orjson.loads(encode_group([good, good])[1])
    data["events"][1]["attempt"] = 0
    with pytest.raises(MalformedMessage, match=r"events\[1\]: field 'attempt'") as raised:
        decode_attempt_record(orjson.dumps(data))
    assert raised.value.field == "attempt"
    with pytest.raises(MalformedMessage, match="format 2"):
        decode_attempt_event(encode_group([good])[1])  # decode_attempt_event reads single records only


def test_a_group_is_one_to_max_events():
    good = AttemptEvent.succeeded(OCC, 1, TOKEN)
    with pytest.raises(ValueError):
        encode_group([])
    with pytest.raises(ValueError):
        encode_group([good] * (MAX_GROUP_EVENTS + 1))
    assert len(decode_attempt_record(encode_group([good] * MAX_GROUP_EVENTS)[1]).events) == MAX_GROUP_EVENTS


@given(st.lists(events, min_size=1, max_size=1200), st.integers(0, 2000))
def test_groups_keep_every_event_in_order_within_their_bounds(group, error_length):
    """A batch's failed events may each carry 2,000 characters of error text: 500 of them would pass the
    brokers' largest record, so groups are bounded in bytes as well as events."""
    group = [
        AttemptEvent.failed(e.occurrence_id, e.attempt, TOKEN, "E", "x" * error_length) if i % 3 == 0 else e
        for i, e in enumerate(group)
    ]
    records = list(encode_groups(group))
    decoded = [decode_attempt_record(value) for _, value, _ in records]
    assert [e for d in decoded for e in d.events] == group
    assert all(len(d.events) <= MAX_GROUP_EVENTS for d in decoded)
    assert all(len(value) <= MAX_GROUP_BYTES for _, value, _ in records)
    assert all(key == d.events[0].key for (key, _, _), d in zip(records, decoded, strict=True))


def test_a_batch_of_long_failures_is_split_below_the_byte_bound():
    failed = [AttemptEvent.failed(uuid.uuid4(), 1, TOKEN, "E" * 200, "x" * 2000) for _ in range(MAX_GROUP_EVENTS)]
    records = list(encode_groups(failed))
    assert len(records) > 4 and all(len(value) <= MAX_GROUP_BYTES for _, value, _ in records)
    assert [e for _, value, _ in records for e in decode_attempt_record(value).events] == failed

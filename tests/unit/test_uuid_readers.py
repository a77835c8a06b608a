"""The two ways a UUID field is read (schemas/record_fields.py) accept the same strings as the same value.

Ids that stay inside chronoq (attempt events in the engine, answers in the consumer runtime) are read as
asyncpg's C UUID (``FastUUID``), the rest as ``uuid.UUID`` itself; a reader must never accept, refuse or
mean a different id depending on which one it uses, and ids handed to user code must stay ``uuid.UUID``
(orjson writes no subclass of it).
"""

from __future__ import annotations

import uuid

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.attempt_events import AttemptEvent, decode_attempt_record, encode_group
from schemas.attempt_grants import GRANTED, AttemptGrant, decode_attempt_grants, encode_grant_group
from schemas.errors import MalformedMessage
from schemas.identity import FastUUID, random_uuid
from schemas.messages import decode_occurrence
from schemas.record_fields import optional_uuid
from tests.support.hostile_records import VALID

#: What uuid.UUID reads besides hex digits and hyphens: braces, a URN prefix, int()'s "_" and "+", spaces and
#: other Unicode digits.
_NOISE = "{}-_+ :urnid\x00é１٣gG"


@st.composite
def _uuid_like(draw: st.DrawFn) -> str:
    text = str(draw(st.uuids()))
    if draw(st.booleans()):
        text = text.upper() if draw(st.booleans()) else text.replace("-", "")
    edits = draw(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(_NOISE)), max_size=3))
    for at, char in edits:
        text = text[:at] + char + text[at + 1 :]
    return text


def _read(text: str, internal: bool) -> uuid.UUID | None:
    try:
        return optional_uuid({"id": text}, "id", internal=internal)
    except MalformedMessage:
        return None


@given(st.one_of(_uuid_like(), st.text(max_size=40)))
def test_both_readers_accept_the_same_strings_as_the_same_id(text):
    exact, internal = _read(text, internal=False), _read(text, internal=True)
    assert (exact is None) == (internal is None)
    if exact is not None:
        assert internal == exact and exact == internal
        assert hash(internal) == hash(exact) and str(internal) == str(exact)
        assert type(exact) is uuid.UUID


@given(st.uuids())
def test_canonical_text_is_read_as_the_quick_type_and_sorts_as_uuid_does(value):
    read = optional_uuid({"id": str(value)}, "id", internal=True)
    assert type(read) is FastUUID and read == value
    other = uuid.uuid4()
    assert (read < other) == (value < other)


def test_ids_for_user_code_stay_uuid_and_internal_ones_are_quick():
    occurrence_id, token = uuid.uuid4(), uuid.uuid4()
    started = AttemptEvent.started(occurrence_id, 1, token, 30.0, consumer_group="g", worker="w")
    events = decode_attempt_record(encode_group([started])[1]).events
    assert type(events[0].occurrence_id) is FastUUID and events[0] == started
    grant = AttemptGrant(occurrence_id, token, "g", GRANTED)
    (answer,) = decode_attempt_grants(encode_grant_group([grant])[1])
    assert type(answer.lease_token) is FastUUID and answer == grant
    # the occurrence a handler gets: orjson must write its ids without a default
    message = decode_occurrence(VALID["occurrence"])
    assert type(message.occurrence_id) is uuid.UUID and type(message.schedule_id) is uuid.UUID
    assert orjson.dumps(message.occurrence_id)


def test_random_ids_are_version_4_and_distinct():
    ids = [random_uuid() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for value in ids[:50]:
        assert value.version == 4 and value.variant == uuid.RFC_4122
        assert uuid.UUID(str(value)) == value


@pytest.mark.parametrize("text", ["", "not-a-uuid", "12345678-1234-1234-1234-1234567890123", "\ud800" * 36])
def test_text_neither_reads_is_a_rejection_naming_the_field(text):
    for internal in (False, True):
        with pytest.raises(MalformedMessage, match="'id'"):
            optional_uuid({"id": text}, "id", internal=internal)

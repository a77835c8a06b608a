"""quick_init builds the same frozen records as the dataclass's own __init__, only faster.

Oracle: the generated ``__init__`` quick_init keeps as ``__dataclass_init__``. For arbitrary arguments
(valid or not: most draws fail a record's validation) both must give equal instances with equal fields
and hash, or raise the same exception with the same message.
"""

from __future__ import annotations

import dataclasses
import pickle
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.occurrence import Occurrence
from engine.loops.attempt_authentication import ReceivedEvent
from schemas.attempt_events import AttemptEvent
from schemas.attempt_grants import AttemptGrant
from schemas.frozen_records import quick_init
from schemas.messages import OccurrenceMessage

RECORDS = [AttemptEvent, AttemptGrant, OccurrenceMessage, Occurrence, ReceivedEvent]

# Values of every kind the records' fields take, and of kinds they refuse.
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2**31),
    st.floats(allow_nan=False, min_value=-1, max_value=1e6),
    st.sampled_from(["started", "succeeded", "failed", "canceled", "granted", "refused", "fenced", "stale_version"]),
    st.text(max_size=8),
    st.uuids(),
    st.datetimes(timezones=st.just(UTC)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _outcome(build, args: list, kwargs: dict):
    try:
        record = build(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the exception is the outcome compared
        return ("raised", type(err), str(err))
    return ("built", {k: v for k, v in vars(record).items() if k != "cancellation"}, record)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_quick_init_builds_what_the_dataclass_init_builds(cls, data):
    fields = dataclasses.fields(cls)
    required = [f for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    optional = [f for f in fields if f not in required and f.name != "cancellation"]
    args = [data.draw(values, label=f.name) for f in required]
    given_optional = data.draw(st.lists(st.sampled_from(optional), unique=True)) if optional else []
    kwargs = {f.name: data.draw(values, label=f.name) for f in given_optional}
    quick = _outcome(cls, args, kwargs)
    oracle = _outcome(lambda *a, **k: _build_with_oracle(cls, a, k), args, kwargs)
    assert quick[:2] == oracle[:2]
    if quick[0] == "built":
        assert quick[2] == oracle[2]
        assert _hash(quick[2]) == _hash(oracle[2])  # a dict payload makes both unhashable alike


def _hash(record) -> int | str:
    try:
        return hash(record)
    except TypeError as err:
        return str(err)


def _build_with_oracle(cls, args, kwargs):
    record = object.__new__(cls)
    cls.__dataclass_init__(record, *args, **kwargs)
    return record


def test_a_record_built_quickly_stays_frozen_and_round_trips():
    event = AttemptEvent.succeeded(uuid.uuid4(), 2, uuid.uuid4(), scheduled_for=datetime(2026, 12, 3, tzinfo=UTC))
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.attempt = 3  # type: ignore[misc]
    assert dataclasses.replace(event, attempt=3).attempt == 3
    assert pickle.loads(pickle.dumps(event)) == event
    assert event.key == str(event.occurrence_id).encode()  # a cached_property still lands in the instance dict
    with pytest.raises(TypeError, match="missing"):
        AttemptEvent("started")  # type: ignore[call-arg]


def test_each_default_factory_gives_every_instance_its_own_value():
    now = datetime(2026, 12, 3, tzinfo=UTC)
    first = OccurrenceMessage(uuid.uuid4(), uuid.uuid4(), 1, "acme", "billing.invoice", now, now)
    second = OccurrenceMessage(uuid.uuid4(), uuid.uuid4(), 1, "acme", "billing.invoice", now, now)
    assert first.payload == {} and first.payload is not second.payload


def test_what_quick_init_cannot_build_is_refused_at_decoration():
    @dataclasses.dataclass
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True)
    class KeywordOnly:
        a: int = dataclasses.field(kw_only=True)

    @dataclasses.dataclass(frozen=True)
    class NotInit:
        a: int
        b: int = dataclasses.field(init=False, default=0)

    @dataclasses.dataclass(frozen=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int] = 0

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    for cls in (Mutable, KeywordOnly, NotInit, WithInitVar, Slotted):
        with pytest.raises(TypeError):
            quick_init(cls)

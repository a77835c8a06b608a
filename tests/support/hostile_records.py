"""Hostile Kafka records for fuzzing: random bytes, right-shaped JSON with wrong types, NUL, huge and
negative numbers, NaN, extreme instants, and headers with null or non-UTF-8 values.

``records(kind)`` mutates a valid record of each kind (``VALID``); ``hostile_headers`` draws header lists;
``hostile(kind, n)`` draws ``n`` producible (key, value, headers) triples. Used by the decoder unit fuzz,
the processor fuzz on the real stack and ``load_tests/fuzz_topics.py``.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from schemas.attempt_events import AttemptEvent, encode_group
from schemas.attempt_grants import AttemptGrant, encode_grant_group
from schemas.commands import Command, CommandResult
from schemas.dead_letter_messages import DeadOccurrenceMessage
from schemas.messages import HEADER_TENANT, OccurrenceMessage, ScheduleStateMessage
from schemas.target_bindings import TargetBindingMessage

AT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
OCC = uuid.UUID("6f1c2a0e-4d0b-5c8e-9a51-63686f6e6f71")
OCCURRENCE = OccurrenceMessage(
    OCC, uuid.uuid4(), 3, "acme", "billing.invoice", AT, AT, 2, "flexible", AT, {"invoice": 42}, 4
)

#: A valid record of each kind: the shape the fuzzer mutates.
VALID: dict[str, bytes] = {
    "occurrence": OCCURRENCE.encode(),
    "schedule_state": ScheduleStateMessage(uuid.uuid4(), "acme", 2, "paused", AT).encode(),
    "command": Command(uuid.uuid4(), "acme", "update", AT, uuid.uuid4(), "key-1", {"expression": "0 9 * * *"}).encode(),
    "command_result": CommandResult(uuid.uuid4(), "acme", "applied", {"schedule_id": "x"}).encode(),
    "attempt_event": AttemptEvent.failed(OCC, 2, uuid.uuid4(), "TimeoutError", "slow", permanent=True).encode(),
    "attempt_grant": AttemptGrant(OCC, uuid.uuid4(), "billing", "refused", "canceled").encode(),
    # Groups (format 2): what batch handlers send and the engine answers them with.
    "attempt_event_group": encode_group(
        [
            AttemptEvent.started(OCC, 2, uuid.uuid4(), 30.0, "billing", "host:1", 7, AT),
            AttemptEvent.failed(OCC, 2, uuid.uuid4(), "TimeoutError", "slow", permanent=True),
        ]
    )[1],
    "attempt_grant_group": encode_grant_group(
        [
            AttemptGrant(OCC, uuid.uuid4(), "billing", "granted"),
            AttemptGrant(OCC, uuid.uuid4(), "billing", "refused", "fenced"),
        ]
    )[1],
    "dead_occurrence": DeadOccurrenceMessage(OCCURRENCE, 3, "max_attempts", "TimeoutError", "slow", AT).encode(),
    "target_binding": TargetBindingMessage("billing.invoice", ("acme", "globex"), 2, AT).encode(),
}


EXTREME_INSTANTS = [
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00",
    "0001-01-01T00:00:00Z",
    "1799-12-31T23:59:59Z",
    "2026-13-01T00:00:00Z",
    "2026-11-29T10:00:00",
    "2026-11-29",
    "2026-11-29T10:00:00+23:59",
    "+002026-11-29T10:00:00Z",
    "2026-11-29T10:00:00\x00Z",
]

hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**31 - 2, max_value=2**64),
    st.integers(max_value=0, min_value=-(2**63)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from("\x00a-:Z0"), max_size=8),
    st.sampled_from(EXTREME_INSTANTS),
    st.just("x" * 5000),
    st.just(str(OCC)),
    st.just("acme\x00"),
)
hostile_values = st.recursive(
    hostile_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
hostile_headers = st.one_of(
    st.none(),
    st.lists(
        st.tuples(
            st.sampled_from(["chronoq-signature", HEADER_TENANT, "chronoq-occurrence-id", "traceparent", "x"]),
            st.one_of(st.none(), st.binary(max_size=80), st.just(b"\xff\xfe"), st.just(b"acme")),
        ),
        max_size=4,
    ),
)


def _dumps(data: Any) -> bytes:
    """JSON text as a hostile producer writes it: NaN and 400-digit integers included (orjson refuses both)."""
    return json.dumps(data, allow_nan=True).encode()


@st.composite
def mutated(draw: st.DrawFn, kind: str) -> bytes:
    data = orjson.loads(VALID[kind])
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        name = draw(st.sampled_from(sorted(data) + ["unknown", "occurrence"]))
        if draw(st.integers(0, 5)) == 0:
            data.pop(name, None)
        else:
            data[name] = draw(hostile_values)
    if draw(st.booleans()) and isinstance(data.get("occurrence"), dict) and data["occurrence"]:
        nested = data["occurrence"]
        nested[draw(st.sampled_from(sorted(nested)))] = draw(hostile_values)
    for name in ("events", "grants"):  # a group's entries: each is checked like a record of its own
        entries = data.get(name)
        if draw(st.booleans()) and isinstance(entries, list) and entries and isinstance(entries[0], dict):
            entry = entries[draw(st.integers(0, len(entries) - 1))]
            if isinstance(entry, dict):
                entry[draw(st.sampled_from(sorted(entry) + ["format", "unknown"]))] = draw(hostile_values)
    return _dumps(data)


#: Kinds whose topic carries a second shape: the hostile records of one are drawn from both.
_ALSO = {"attempt_event": "attempt_event_group", "attempt_grant": "attempt_grant_group"}


def records(kind: str) -> st.SearchStrategy[bytes | None]:
    return st.one_of(
        st.none(),
        st.binary(max_size=200),
        mutated(kind),
        mutated(_ALSO.get(kind, kind)),
        st.just(b"[" * 2000 + b"]" * 2000),
        st.just(_dumps({"format": 1, "payload": 10**400})),
        st.just(b'{"format": 1e400}'),
        hostile_values.map(_dumps),
    )


def draw_many(strategy: st.SearchStrategy, count: int) -> list:
    """``count`` examples of ``strategy`` (generation only: nothing to shrink, the property is checked after)."""
    drawn: list = []

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example) -> None:
        drawn.append(example)

    collect()
    return drawn


def hostile(kind: str, count: int) -> list[tuple[bytes | None, bytes | None, list]]:
    keys = st.one_of(st.none(), st.binary(max_size=40))
    drawn = draw_many(st.tuples(keys, records(kind), hostile_headers.map(lambda h: h or [])), count)
    # A record needs a key or a value (a tombstone with neither cannot be produced).
    return [(b"tombstone" if key is None and value is None else key, value, headers) for key, value, headers in drawn]

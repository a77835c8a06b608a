"""A plain on-time cohort's members planned from their rows (engine/loops/occurrence_rows.py
``cohort_member_rows``) stage exactly what the materializer's general path stages for the same members with
the cohort's decision: ids, message bytes, instants, lane, bucket, ahead/late choice, lateness and rounds.

And the message bytes assembled from pieces are the bytes ``orjson.dumps`` writes for the message's fields,
for any text.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.loops.materializer import Materializer, MaterializeReport, _Decided, _Pacing
from engine.loops.occurrence_rows import MICROSECOND, PlainCohort, encode_message
from engine.records import COHORT_FIELDS, DueSchedule
from engine.rules.timing import MisfireDecision
from schemas.messages import FORMAT_VERSION, decode_occurrence, format_instant

TOP = datetime(2026, 12, 7, 17, 0, tzinfo=UTC)
texts = st.text(min_size=1, max_size=12)  # any text: quotes, escapes, non-ASCII
payloads = st.dictionaries(
    texts, st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), texts, st.booleans(), st.none()), max_size=3
).map(lambda value: orjson.dumps(value).decode())

members = st.fixed_dictionaries(
    {
        "schedule_id": st.uuids(),
        "tenant_id": st.sampled_from(["acme", "t-2", 'quo"te', "zürich"]),
        "start_at": st.none(),
        "version": st.integers(min_value=1, max_value=2**31 - 1),
        "target": st.sampled_from(["billing.invoice", "load.target-0"]),
        "payload_json": payloads,
        "priority": st.sampled_from(["strict", "flexible"]),
        "flexible_window_s": st.sampled_from([0, 1, 59, 300, 3600]),
        "deadline_s": st.sampled_from([None, 0, 30, 3600]),
        "overlap_policy": st.sampled_from(["allow", "allow", "allow", "queue_one"]),
        "runs": st.integers(min_value=0, max_value=10),
        "weight": st.integers(min_value=1, max_value=4),
    }
)


def _shared(cohort_id: uuid.UUID, shard: int, cursor: datetime, policy: str) -> tuple[object, ...]:
    values = {
        "kind": "cron", "expression": "* * * * *", "time_zone": "UTC", "dst_repeat": "first", "dst_gap": "shift",
        "anchor": None, "end_at": None, "misfire_policy": policy, "max_lateness_s": 60, "calendar_id": None,
        "max_runs": None, "next_run_at": cursor, "shard": shard, "cohort_id": cohort_id, "cohort_version": 3,
    }  # fmt: skip
    return tuple(values[name] for name in COHORT_FIELDS)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(members, min_size=1, max_size=12),
    fires=st.integers(min_value=1, max_value=3),
    seal_offset_s=st.one_of(st.none(), st.integers(min_value=-120, max_value=240)),
    versions=st.one_of(st.none(), st.just({"billing.invoice": 4})),
    policy=st.sampled_from(["fire_once", "skip", "catch_up:3"]),
    threshold_s=st.integers(min_value=0, max_value=600),
)
def test_a_plain_cohorts_members_stage_what_the_general_path_stages(
    rows, fires, seal_offset_s, versions, policy, threshold_s
):
    cohort_id, shard = uuid.uuid4(), 9
    enqueue = [TOP + timedelta(minutes=n) for n in range(fires)]
    decision = MisfireDecision(
        enqueue=enqueue, missed=[], missed_unlisted=0, next_run_at=TOP + timedelta(minutes=fires)
    )
    seals = (
        None
        if seal_offset_s is None
        else {(shard, lane): TOP + timedelta(seconds=seal_offset_s) for lane in ("strict", "flexible")}
    )
    threshold_us = timedelta(seconds=threshold_s) // MICROSECOND
    shared = _shared(cohort_id, shard, TOP, policy)

    general = Materializer(pool=None)
    decided = [_Decided(DueSchedule.of_member(row, shared), None, decision, threshold_us) for row in rows]
    expected, _, _ = general._plan_batch(decided, TOP, seals, MaterializeReport(), _Pacing(), versions)

    fast = Materializer(pool=None)
    plan = PlainCohort(cohort_id, shard, tuple(enqueue), threshold_us, policy)
    staged, cursors, ranges = fast._plan_batch(
        [], TOP, seals, MaterializeReport(), None, versions, None, [(plan, rows)]
    )

    assert staged == expected
    assert [len(column) for column in (*cursors, *ranges)] == [0] * 11  # a member's cursor is its cohort's


@settings(max_examples=300, deadline=None)
@given(
    tenant=texts,
    target=texts,
    priority=texts,
    payload=payloads,
    version=st.integers(min_value=1, max_value=2**31 - 1),
    binding=st.one_of(st.none(), st.integers(min_value=1, max_value=2**31 - 1)),
    jitter_ms=st.integers(min_value=0, max_value=3_600_000),
    deadline_s=st.one_of(st.none(), st.integers(min_value=1, max_value=86_400)),
)
def test_the_assembled_message_is_the_messages_json(
    tenant, target, priority, payload, version, binding, jitter_ms, deadline_s
):
    occ, schedule = uuid.uuid4(), uuid.uuid4()
    available = TOP + timedelta(milliseconds=jitter_ms)
    deadline = TOP + timedelta(seconds=deadline_s) if deadline_s else None
    raw = encode_message(
        occ, str(schedule), version, tenant, target, priority, payload, TOP, available, deadline, binding
    )
    fields = {
        "format": FORMAT_VERSION, "occurrence_id": str(occ), "schedule_id": str(schedule), "schedule_version": version,
        "tenant_id": tenant, "target": target, "scheduled_for": format_instant(TOP),
        "available_at": format_instant(available), "attempt": 1, "priority": priority,
        "deadline": format_instant(deadline) if deadline else None,
    }  # fmt: skip
    tail = b"}" if binding is None else b',"binding_version":' + str(binding).encode() + b"}"
    assert raw == orjson.dumps(fields)[:-1] + b',"payload":' + payload.encode() + tail
    assert orjson.loads(raw) == {
        **fields,
        "payload": orjson.loads(payload),
        **({} if binding is None else {"binding_version": binding}),
    }


def test_a_member_message_reads_back_as_the_occurrence():
    occ, schedule = uuid.uuid4(), uuid.uuid4()
    raw = encode_message(occ, str(schedule), 3, "acme", "billing.invoice", "strict", '{"a": [1, 2]}', TOP, TOP, None, 2)
    message = decode_occurrence(raw)
    assert (message.occurrence_id, message.schedule_id, message.schedule_version) == (occ, schedule, 3)
    assert (message.payload, message.binding_version, message.deadline) == ({"a": [1, 2]}, 2, None)

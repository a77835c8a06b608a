"""The rows a materializer pass stages per occurrence: ids, message bytes, instants, lane, bucket and round.

A burst multiplies whatever is done here by the number of occurrences, so whatever depends only on the
schedule or only on the instant is computed once, and a **plain on-time cohort** (engine/rules/cohorts.py
``plain_on_time``: on-time fires every member shares, nothing missed, caught up or exhausted) has its members
planned straight from their rows (``cohort_member_rows``), without a schedule record or per-schedule
bookkeeping each: a cohort's members differ only in the fields ``cohort_members`` reads. The materializer's
general path (``Materializer._occurrences``) plans every other schedule; both produce the same staged rows for
the same member (tests/unit/test_cohort_member_rows.py holds them equal).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import orjson

from engine.loops.tenant_gate import StagedColumns
from engine.rules import timing
from schemas.dispatch_lanes import LANES, bucket_of_micros, lane_of, micros_of
from schemas.identity import OCCURRENCE_NAMESPACE_BYTES, FastUUID, micros_text, uuid5_int
from schemas.messages import FORMAT_VERSION, format_instant
from schemas.topics import occurrence_topic, schedule_key

#: The staging table's columns (schemas/queries/materializer.sql create_staging), in a staged row's order.
STAGING_COLUMNS = (
    "occurrence_id",
    "schedule_id",
    "schedule_version",
    "tenant_id",
    "target",
    "scheduled_us",
    "available_us",
    "state",
    "topic",
    "message_key",
    "message",
    "held",
    "ahead",
    "shard",
    "lane",
    "bucket_us",
    "wrr_round",
    "late_after_us",
    "misfire_policy",
    "tenant_held",
    "cohort_id",
)
TENANT_HOLD_COLUMNS = StagedColumns(
    tenant_id=STAGING_COLUMNS.index("tenant_id"),
    available_at=STAGING_COLUMNS.index("available_us"),
    state=STAGING_COLUMNS.index("state"),
    held=STAGING_COLUMNS.index("held"),
    ahead=STAGING_COLUMNS.index("ahead"),
    late_after=STAGING_COLUMNS.index("late_after_us"),
    misfire_policy=STAGING_COLUMNS.index("misfire_policy"),
    tenant_held=STAGING_COLUMNS.index("tenant_held"),
)

MICROSECOND = timedelta(microseconds=1)

#: What each occurrence of one instant stages: its id's last name part, the instant and its bucket (epoch µs).
InstantParts = tuple[bytes, int, int]


class OccurrenceIds:
    """``schemas.identity.occurrence_id`` for many instants of one schedule version, with the
    schedule's part of the uuid5 name encoded once (tests/unit/test_materializer_plan.py keeps the two equal).

    The ids are asyncpg's UUID (a ``uuid.UUID`` subclass, equal and hashing alike) built from the
    digest with the version and variant bits set (``schemas.identity.uuid5_int``): half the cost of
    ``uuid.UUID(bytes=, version=5)`` and a tenth of its ``str()``, which the message needs. A burst pays both
    once per occurrence.
    """

    __slots__ = ("schedule_text", "_prefix")

    def __init__(self, schedule_id: Any, version: int) -> None:
        self.schedule_text = str(schedule_id)
        self._prefix = OCCURRENCE_NAMESPACE_BYTES + f"{self.schedule_text}/{version}/".encode()

    def of(self, micros: bytes) -> FastUUID:
        return FastUUID(uuid5_int(self._prefix + micros).to_bytes(16))


def instant_parts(instant: datetime) -> InstantParts:
    """What each occurrence of ``instant`` stages, computed once per instant of a pass: the last part of its
    id's name, and the instant and its bucket as epoch microseconds (staged as int8: asyncpg encodes a
    timestamptz in ~0.56 µs, an int8 in a tenth of that, and a row has four)."""
    micros = micros_of(instant)
    return micros_text(instant), micros, bucket_of_micros(micros)


def encode_occurrence(
    occ_id: Any,
    schedule_text: str,
    schedule: Any,
    scheduled_for: datetime,
    available_at: datetime,
    deadline: datetime | None,
    binding_version: int | None = None,
) -> bytes:
    """The occurrence message of ``schedule`` (anything with ``version``, ``tenant_id``, ``target``,
    ``priority`` and ``payload_json``, such as a DueSchedule): ``encode_message`` with its fields."""
    return encode_message(
        occ_id, schedule_text, schedule.version, schedule.tenant_id, schedule.target, schedule.priority,
        schedule.payload_json, scheduled_for, available_at, deadline, binding_version,
    )  # fmt: skip


def encode_message(
    occ_id: Any,
    schedule_text: str,
    version: int,
    tenant_id: str,
    target: str,
    priority: str,
    payload_json: str,
    scheduled_for: datetime,
    available_at: datetime,
    deadline: datetime | None,
    binding_version: int | None,
) -> bytes:
    """The occurrence message (schemas.messages format 1) with the stored payload spliced in as JSON text.

    The bytes ``orjson.dumps`` writes for the message's fields in this order (tests/unit/test_cohort_member_rows.py
    holds them equal for any text), assembled from pieces: each text value is JSON-encoded once per value
    and each instant once per instant, and the payload is not decoded and re-encoded. ``OccurrenceMessage``
    reads it back equal to the message ``OccurrenceMessage.encode()`` writes.
    """
    return assemble_message(
        str(occ_id), member_part(schedule_text, version, tenant_id, target), scheduled_for, available_at,
        _json_text(priority), deadline, payload_json.encode(), message_tail(binding_version),
    )  # fmt: skip


_HEAD = b'{"format":' + orjson.dumps(FORMAT_VERSION) + b',"occurrence_id":"'
#: a few texts (tenants, targets, priorities) JSON-encoded once each
_json_text = functools.lru_cache(maxsize=4096)(orjson.dumps)


@functools.lru_cache(maxsize=65536)
def _instant_json(instant: datetime) -> bytes:
    return orjson.dumps(format_instant(instant))


def member_part(schedule_text: str, version: int, tenant_id: str, target: str) -> bytes:
    """What every occurrence message of one schedule version repeats, from after its id to ``scheduled_for``."""
    return (
        b'","schedule_id":' + orjson.dumps(schedule_text) + b',"schedule_version":' + orjson.dumps(version)
        + b',"tenant_id":' + _json_text(tenant_id) + b',"target":' + _json_text(target) + b',"scheduled_for":'
    )  # fmt: skip


def message_tail(binding_version: int | None) -> bytes:
    """The message's last bytes, after its payload."""
    return b"}" if binding_version is None else b',"binding_version":' + orjson.dumps(binding_version) + b"}"


def assemble_message(
    occ_text: str,
    member: bytes,
    scheduled_for: datetime,
    available_at: datetime,
    priority_json: bytes,
    deadline: datetime | None,
    payload: bytes,
    tail: bytes,
) -> bytes:
    """One occurrence message from its pieces (``encode_message``)."""
    return b"".join(
        (_HEAD, occ_text.encode(), member, _instant_json(scheduled_for), b',"available_at":',
         _instant_json(available_at), b',"attempt":1,"priority":', priority_json, b',"deadline":',
         _instant_json(deadline) if deadline else b"null", b',"payload":', payload, tail)
    )  # fmt: skip


class PlainCohort(NamedTuple):
    """A locked cohort whose fire is plain on-time work, as its members' rows are planned: its id and shard,
    the instants its decision enqueues, the lateness threshold (µs) and misfire policy its deliveries carry."""

    cohort_id: Any
    shard: int
    enqueue: tuple[datetime, ...]
    threshold_us: int
    misfire_policy: str


def cohort_member_rows(
    cohort: PlainCohort,
    members: Iterable[Mapping[str, Any]],
    seals_us: Mapping[tuple[int, str], int] | None,
    instants: dict[datetime, InstantParts],
    take_round: Callable[[Any, str, int], int],
    versions: Mapping[str, int] | None,
) -> list[tuple[Any, ...]]:
    """The staged rows (column order: STAGING_COLUMNS) of a plain on-time cohort's members, each row
    (``cohort_members``: id, tenant, version, target, payload, priority, windows, overlap policy, weight) as the
    general path stages that member with the cohort's decision: the same ids, message bytes, lane, bucket,
    ahead/late choice and rounds (taken in member order, then instant order). ``seals_us``: each owned
    (shard, lane)'s seal (None: no shard leases, every delivery goes late); ``instants`` memoizes each
    instant's parts across the pass; ``versions``: each target's binding version."""
    shard, cohort_id, policy_text = cohort.shard, cohort.cohort_id, cohort.misfire_policy
    threshold_us = cohort.threshold_us
    fires: list[tuple[datetime, bytes, int, int]] = []
    for scheduled_for in cohort.enqueue:
        parts = instants.get(scheduled_for)
        if parts is None:
            parts = instants[scheduled_for] = instant_parts(scheduled_for)
        fires.append((scheduled_for, *parts))
    lane_seals = {lane: seals_us.get((shard, lane)) if seals_us is not None else None for lane in LANES}
    out: list[tuple[Any, ...]] = []
    for row in members:
        schedule_id, version, tenant, target = row["schedule_id"], row["version"], row["tenant_id"], row["target"]
        priority, payload_json, deadline_s = row["priority"], row["payload_json"], row["deadline_s"]
        lane = lane_of(priority)
        seal_us = lane_seals[lane]
        ids = OccurrenceIds(schedule_id, version)
        schedule_text = ids.schedule_text
        message_key = schedule_key(schedule_text)
        topic = occurrence_topic(target)
        held = row["overlap_policy"] != "allow"
        window = timedelta(seconds=row["flexible_window_s"]) if lane == "flexible" else None
        deadline = timedelta(seconds=deadline_s) if deadline_s else None
        binding_version = versions.get(target) if versions else None
        weight = row["weight"]
        member = member_part(schedule_text, version, tenant, target)
        priority_json, payload, tail = _json_text(priority), payload_json.encode(), message_tail(binding_version)
        for scheduled_for, id_text, scheduled_us, instant_bucket_us in fires:
            occ_id = ids.of(id_text)
            if window is not None:
                jitter = timing.jitter_offset(occ_id, window)
                available_at, available_us = scheduled_for + jitter, scheduled_us + jitter // MICROSECOND
                bucket_us = bucket_of_micros(available_us)
            else:
                available_at, available_us, bucket_us = scheduled_for, scheduled_us, instant_bucket_us
            late_after_us = None if held else available_us + threshold_us
            message = assemble_message(
                str(occ_id), member, scheduled_for, available_at, priority_json,
                scheduled_for + deadline if deadline else None, payload, tail,
            )  # fmt: skip
            ahead = seal_us is not None and not held and bucket_us >= seal_us
            wrr_round = take_round((shard, lane, bucket_us), tenant, weight) if ahead else 0
            out.append(
                (occ_id, schedule_id, version, tenant, target, scheduled_us, available_us, "SCHEDULED", topic,
                 message_key, message, held, ahead, shard, lane, bucket_us, wrr_round, late_after_us,
                 policy_text if late_after_us is not None else None, False, cohort_id)
            )  # fmt: skip
    return out

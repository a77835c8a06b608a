"""Schedule cohorts: which schedules may share one cursor, and when a cohort's pass is plain work.

A cohort is a set of schedules of one tenant and one shard that fire at the same instants and are judged
alike when late (migration 0026; docs/dispatch.md "Cohorts"). The materializer advances the cohort's cursor
once per fire instead of every member's row. Only what is the same for every member may decide a cohort's
fires: the time spec and the misfire policy. Anything judged per schedule keeps a schedule out:

* an end (``end_at``) or a run limit (``max_runs``): the schedule completes on its own;
* an exclusion calendar: its versions are read per pass, its skipped slots counted per schedule;
* an overlap policy other than ``allow``: the overlap gate holds its deliveries one by one;
* a one-time schedule: it fires once and completes.

``start_at`` is not part of the key: a schedule joins at its first fire, which is at or after its start, and
from there on its fires are its cohort's.

Pure: no I/O; tests/unit/test_cohort_rules.py property-tests both functions.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import NamedTuple

from engine.rules import timing

#: The most members a create adds a cohort to (more: a new cohort with the same key). A pass takes whole
#: cohorts, so this bounds how far one cohort can push a pass past its batch size.
COHORT_CAP = 256


class CohortSpec(NamedTuple):
    """What decides a cohort's fires and misfire verdicts: the fields every member has alike (stored on the
    cohort's row, so a pass reads them once per cohort)."""

    kind: str
    expression: str
    time_zone: str
    dst_repeat: str
    dst_gap: str
    anchor: datetime | None
    misfire_policy: str
    max_lateness_s: int

    @property
    def key(self) -> str:
        """The cohort key: equal exactly when every field is (the anchor as microseconds since the epoch, so
        equal instants written in other zones match)."""
        anchor_us = "" if self.anchor is None else str(round(self.anchor.timestamp() * 1_000_000))
        text = "\x1f".join(
            (self.kind, self.expression, self.time_zone, self.dst_repeat, self.dst_gap, anchor_us,
             self.misfire_policy, str(self.max_lateness_s))
        )  # fmt: skip
        return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def cohort_spec(
    *,
    kind: str,
    expression: str,
    time_zone: str,
    dst_repeat: str,
    dst_gap: str,
    anchor: datetime | None,
    misfire_policy: str,
    max_lateness_s: int,
    end_at: datetime | None,
    calendar_id: object | None,
    max_runs: int | None,
    overlap_policy: str,
) -> CohortSpec | None:
    """The spec schedules that may share a cursor have in common, or None for a schedule that keeps its own.

    Two schedules with the same spec (of the same tenant and shard) fire at the same instants after any
    common cursor and get the same misfire decision at any instant: every field that decides either is in it.
    """
    if kind == "once" or end_at is not None or calendar_id is not None or max_runs is not None:
        return None
    if overlap_policy != "allow":
        return None
    return CohortSpec(kind, expression, time_zone, dst_repeat, dst_gap, anchor, misfire_policy, max_lateness_s)


def plain_on_time(decision: timing.MisfireDecision) -> bool:
    """Whether a cohort's misfire decision is work every member can share as is: on-time fires and a next
    cursor, nothing missed, caught up or exhausted. Anything else dissolves the cohort (each member is then
    judged on its own: catch-up is paced per tenant, missed slots are recorded per schedule)."""
    return (
        bool(decision.enqueue)
        and decision.next_run_at is not None
        and not decision.missed
        and not decision.missed_unlisted
        and not decision.catch_up
        and decision.missed_range is None
        and not decision.excluded
        and not decision.runs_exhausted
    )

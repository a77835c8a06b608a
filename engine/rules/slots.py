"""Slots: a schedule's scheduled instants, each run at most once across the schedule's versions.

A **slot** is (schedule_id, scheduled_for). An occurrence is one version's
materialization of a slot (its id derives from schedule, version and instant).
A change of the schedule (update, pause, cancel) cancels the unfinished
occurrences of older versions; what happens to each slot then depends on
whether its occurrence may already have reached a consumer:

* **never published** (SCHEDULED, and no delivery row of it was ever claimed
  or sent): the slot is *released* — the occurrence is CANCELED and a newer
  version may materialize the same instant again, following its misfire
  policy;
* **possibly published** (ENQUEUED, RETRY_WAIT, or SCHEDULED with an outbox
  row claimed, acknowledged but not yet marked, or failed with an unknown
  outcome, or with an ahead-lane row before its shard's seal — a relay may
  have read it, and publishes what it read): the occurrence is CANCELED and
  *keeps* the slot. No newer version
  materializes it (the engine's unique index on held slots turns that insert
  into a no-op); consumers skip the obsolete delivery by version, or, if one
  already applied it, that was the slot's one run;
* **RUNNING**: not canceled (its worker holds a lease and may be committing);
  it finishes, a failure of it is not retried, and it keeps the slot.

No lifecycle change is meant to produce a second run of a slot: a change
decides only slots that have not run. A dead-letter replay re-delivers the
same occurrence (same id), which consumers dedupe. Running an instant again on
purpose takes a new schedule (or a one-off trigger at a new instant).

Where the schedule's cursor goes (pure, below): update and resume continue
from the durable cursor, never from "now"; the materializer then judges every
instant from there with the misfire policy (on time, MISSED, fire_once,
catch_up), so a slot that fell due during the change is recorded, never
silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.rules.occurrence_states import State
from engine.rules.timing import TimeSpec, next_fire_after

_BEFORE = timedelta(microseconds=1)


@dataclass(frozen=True)
class Invalidation:
    """What a change did to the older versions' unfinished occurrences (the API reports the counts)."""

    canceled: int = 0  # CANCELED now, in the name of the new version
    released: int = 0  # of those, never published: the slot may run under the new version
    still_running: int = 0  # RUNNING: not canceled; they finish, a failure is not retried
    earliest_released: datetime | None = None  # the earliest released slot's instant
    never_started: int = 0  # canceled before any attempt started (SCHEDULED, ENQUEUED): not runs


def may_release(state: str, possibly_published: bool) -> bool:
    """Whether an unfinished occurrence of an older version gives its slot up when it is canceled.

    Only a SCHEDULED occurrence none of whose deliveries ever left the outbox: SCHEDULED alone does
    not mean unpublished (a relay's claim in flight, an acknowledgement not yet marked).
    """
    return state == State.SCHEDULED.value and not possibly_published


def cursor_from(durable: datetime | None, earliest_released: datetime | None) -> datetime | None:
    """The instant a changed schedule resumes from: its durable cursor, or the earliest slot the change
    released if that comes first (materialized ahead, never published: it is judged again)."""
    candidates = [instant for instant in (durable, earliest_released) if instant is not None]
    return min(candidates) if candidates else None


def updated_cursor(
    spec: TimeSpec, start: datetime | None, now: datetime, first_from_now: datetime | None
) -> datetime | None:
    """The new definition's first fire at or after ``start`` (the durable cursor, see :func:`cursor_from`),
    or at or after ``now`` if the cursor is ahead of it.

    A cursor behind now (the materializer is behind) is continued: the instants that fell due are judged
    by the misfire policy, never skipped. A cursor ahead of now (fires materialized ahead) is moved back to
    now: the new definition's own instants in between are due in the future; those the old version still
    holds (possibly published) are no-ops for the materializer (the unique index occurrences_slot, migration 0028).
    ``first_from_now`` (what a new schedule would get) answers when there is no cursor, or nothing fires
    after it.
    """
    if start is None:
        return first_from_now
    continued = next_fire_after(spec, min(start, now) - _BEFORE)
    return continued if continued is not None else first_from_now

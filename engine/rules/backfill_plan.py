"""What a backfill does with each past slot of a window. Pure.

A backfill asks for every slot of the current definition in a past window.
For each slot, given the occurrences that already exist at that instant (of
any version, in the hot table or the archive: an archived SUCCEEDED slot ran):

* one that ran or may still run (SUCCEEDED, DEAD, or in flight: SCHEDULED,
  ENQUEUED, RUNNING, RETRY_WAIT) — the slot is **present**: nothing is done
  (a DEAD one is replayed from the dead letters, not backfilled);
* one of the current version that never ran (MISSED, SKIPPED_OVERLAP) — it is
  **re-fired**: the same occurrence, the same id, back to SCHEDULED (moved back from the archive first
  when the history pruner had moved it there);
* otherwise (none, or only older versions' MISSED/CANCELED/SKIPPED ones) — a
  new occurrence is **created** with the deterministic id of (schedule,
  current version, slot).

So running a backfill twice creates nothing the second time: every slot is
present by then.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

PRESENT_STATES = frozenset({"SUCCEEDED", "DEAD", "SCHEDULED", "ENQUEUED", "RUNNING", "RETRY_WAIT"})
REFIRE_STATES = frozenset({"MISSED", "SKIPPED_OVERLAP"})


@dataclass(frozen=True)
class ExistingOccurrence:
    occurrence_id: uuid.UUID
    version: int
    scheduled_for: datetime
    state: str
    archived: bool = False  # moved to the archive by the history pruner: a refire moves it back first


@dataclass
class BackfillPlan:
    create: list[datetime] = field(default_factory=list)
    refire: list[ExistingOccurrence] = field(default_factory=list)
    present: dict[str, int] = field(default_factory=dict)  # state -> slots left alone

    @property
    def released(self) -> int:
        return len(self.create) + len(self.refire)


def plan_backfill(
    slots: Sequence[datetime], existing: Iterable[ExistingOccurrence], current_version: int
) -> BackfillPlan:
    """Decide every slot (ascending) given the occurrences at those instants."""
    at: dict[datetime, list[ExistingOccurrence]] = {}
    for occ in existing:
        at.setdefault(occ.scheduled_for, []).append(occ)
    plan = BackfillPlan()
    for slot in slots:
        found = at.get(slot, [])
        live = [occ for occ in found if occ.state in PRESENT_STATES]
        if live:
            state = max(live, key=lambda occ: occ.version).state
            plan.present[state] = plan.present.get(state, 0) + 1
            continue
        current = [occ for occ in found if occ.version == current_version]
        if current:
            if current[0].state in REFIRE_STATES:
                plan.refire.append(current[0])
            else:  # CANCELED at the current version: a consumer canceled it cooperatively; leave it
                plan.present[current[0].state] = plan.present.get(current[0].state, 0) + 1
            continue
        plan.create.append(slot)
    return plan

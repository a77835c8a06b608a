"""The one consumer group per target whose attempt events count.

Several consumer groups may read a target's topic (billing applies it, audit
observes it), but only one may report attempts: the engine's attempt ledger
applies the events of the target's owning group and ignores every other
group's (``Verdict.FOREIGN``, ``chronoq.foreign_group_attempt_events``), so an
observer can neither take the owner's lease over nor settle its attempt.

* **first start claims**: a target without an owner is claimed, in the attempt
  processor's transaction, by the group of the first ``started`` the engine
  applies for it;
* an operator **registers** (or changes) the owner explicitly
  (``chronoq target owner TARGET GROUP``), e.g. before a second group is
  deployed, or to move reporting to a new group. The new owner's events count
  from then on; a lease of the previous owner still running is not taken over
  (its later events are ignored, and the reaper judges its lease).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from schemas.clock import Clock
from schemas.errors import InvalidInput
from schemas.queries import QUERIES

MAX_CONSUMER_GROUP = 255


@dataclass(frozen=True)
class AttemptOwner:
    target: str
    consumer_group: str
    registered_by: str  # first_start | operator
    registered_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "consumer_group": self.consumer_group,
            "registered_by": self.registered_by,
            "registered_at": self.registered_at.isoformat(),
        }


async def register_attempt_owner(pool: asyncpg.Pool, target: str, consumer_group: str, clock: Clock) -> AttemptOwner:
    """Make ``consumer_group`` the only group whose attempt events count for ``target`` (replacing any owner)."""
    if not target or not target.strip():
        raise InvalidInput("target", "is a non-empty target name", "billing.invoice")
    if not consumer_group or not consumer_group.strip() or len(consumer_group) > MAX_CONSUMER_GROUP:
        raise InvalidInput(
            "consumer_group", f"is a non-empty group name of at most {MAX_CONSUMER_GROUP} characters", "billing"
        )
    row = await pool.fetchrow(
        *QUERIES.register_attempt_owner(target=target, consumer_group=consumer_group, now=clock.now())
    )
    return AttemptOwner(row["target"], row["consumer_group"], row["registered_by"], row["registered_at"])


async def attempt_owner(pool: asyncpg.Pool, target: str) -> str | None:
    """The group whose attempt events count for ``target``, or None before any group started an attempt."""
    rows = await pool.fetch(*QUERIES.attempt_owners(targets=[target]))
    return rows[0]["consumer_group"] if rows else None

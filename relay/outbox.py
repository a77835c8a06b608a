"""Database side of the relay: claim due outbox rows, mark them sent, release them.

A claim is a fresh token with an expiry. Marking sent requires the token, so
a relay that was paused past its claim (another relay has since re-claimed and
published the rows) changes nothing when it wakes up. A row is marked sent
only after the broker acknowledged it; a crash anywhere before that leaves the
row unsent and it is published again (a duplicate, never a loss).

A row the broker refuses for a reason about the row itself is given back with
a delay (:meth:`OutboxStore.refuse`) and, once refused often enough,
quarantined (:meth:`OutboxStore.quarantine`): never claimed again, its
occurrence DEAD with the reason, in the dead-letter list.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from schemas.clock import Clock
from schemas.dispatch_lateness import LateDelivery, judge_late
from schemas.queries import QUERIES
from schemas.topics import OCCURRENCE_TOPIC_PREFIX


@dataclass(frozen=True)
class OutboxRow:
    id: int
    occurrence_id: uuid.UUID
    tenant_id: str
    topic: str
    message_key: bytes
    message: bytes
    scheduled_for: datetime
    available_at: datetime
    late_after: datetime | None = None  # an on-time occurrence's delivery: late after this instant
    misfire_policy: str | None = None  # its schedule's policy, applied when it is published late


@dataclass(frozen=True)
class Claim:
    token: uuid.UUID
    rows: list[OutboxRow]
    now: datetime | None = None  # the claim's instant (None: nothing claimed)


@dataclass(frozen=True)
class LateJudgement:
    """skip: claimed rows not to publish (recorded MISSED at dispatch, or finished meanwhile).
    missed: rows recorded MISSED (claimed or not). published_late: late rows the policy still publishes."""

    skip: frozenset[int]
    missed: int
    published_late: int


@dataclass(frozen=True)
class MarkResult:
    marked: int
    marked_at: datetime


class OutboxStore:
    def __init__(self, pool: asyncpg.Pool, clock: Clock) -> None:
        self.pool = pool
        self.clock = clock

    async def claim(self, limit: int, claim_ttl: timedelta) -> Claim:
        """Claim up to ``limit`` due rows for ``claim_ttl``."""
        token = uuid.uuid4()
        records = await self.pool.fetch(
            *QUERIES.claim_due_outbox(
                now=self.clock.now(), limit=limit, token=token, claim_ttl_s=claim_ttl.total_seconds()
            )
        )
        rows = [dict(r) for r in records]
        now = rows[0].pop("claimed_at") if rows else None
        for row in rows[1:]:
            row.pop("claimed_at")
        return Claim(token, [OutboxRow(**row) for row in rows], now)

    async def judge_late(self, token: uuid.UUID, rows: Sequence[OutboxRow], now: datetime) -> LateJudgement:
        """Lateness at dispatch for claimed ``rows`` past their late_after: the policy of each one's schedule
        applied to all of that schedule's due deliveries still to be judged (``judge_late``), in one
        transaction."""
        ids = [row.id for row in rows]
        async with self.pool.acquire() as conn, conn.transaction():
            found = await conn.fetch(*QUERIES.late_outbox_candidates(ids=ids, token=token, now=now))
            done = {f["id"] for f in found if f["done"]}
            verdict = judge_late(
                [
                    LateDelivery(f["id"], f["schedule_id"], f["available_at"], f["late_after"], f["misfire_policy"])
                    for f in found
                    if not f["done"] and f["late_after"] is not None and f["misfire_policy"] is not None
                ],
                now,
            )
            written = await conn.fetchrow(
                *QUERIES.judge_outbox_rows(
                    missed_ids=list(verdict.missed), kept_ids=list(verdict.published_late), now=now
                )
            )
        recorded = set(written["missed_ids"])
        return LateJudgement(frozenset((recorded | done) & set(ids)), len(recorded), written["kept"])

    async def mark_sent(self, token: uuid.UUID, ids: Sequence[int]) -> MarkResult:
        """Mark acknowledged rows sent, if this claim still holds them."""
        row = await self.pool.fetchrow(*QUERIES.mark_outbox_sent(now=self.clock.now(), ids=list(ids), token=token))
        return MarkResult(row["marked"], row["marked_at"])

    async def release(self, token: uuid.UUID, ids: Sequence[int], error: str) -> None:
        """Give unpublished rows back for an immediate retry."""
        await self.pool.execute(*QUERIES.release_outbox_claims(ids=list(ids), token=token, error=error[:1000]))

    async def refuse(self, token: uuid.UUID, ids: Sequence[int], error: str, retry_after: timedelta) -> dict[int, int]:
        """Give refused rows back for a later try; each row's refusals so far, by id."""
        rows = await self.pool.fetch(
            *QUERIES.refuse_outbox_rows(
                now=self.clock.now(),
                ids=list(ids),
                token=token,
                error=error[:1000],
                retry_after_s=retry_after.total_seconds(),
            )
        )
        return {r["id"]: r["poison_failures"] for r in rows}

    async def quarantine(self, ids: Sequence[int], error_class: str, error: str) -> list[asyncpg.Record]:
        """Never publish these rows; their waiting occurrences go DEAD (returned: occurrence_id, tenant_id,
        target)."""
        return await self.pool.fetch(
            *QUERIES.quarantine_outbox_rows(
                now=self.clock.now(),
                ids=list(ids),
                error_class=error_class[:200],
                error=error[:1000],
                occurrence_topic_prefix=OCCURRENCE_TOPIC_PREFIX,
            )
        )

    async def backlog(self) -> int:
        return await self.pool.fetchval(*QUERIES.outbox_backlog(now=self.clock.now()))

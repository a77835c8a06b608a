"""Database side of the ahead lane: seal, read pages in key order, move the cursor once per page.

All SQL is behind :class:`AheadLaneStore` (``schemas/queries/dispatch.sql``).
Every write is conditional on the lease epoch the caller passes, so a relay
whose node lost a shard changes nothing for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

import asyncpg

from schemas.clock import Clock
from schemas.dispatch_lanes import START_KEY, CursorKey, aware, instant_of_micros
from schemas.dispatch_lateness import LateDelivery, judge_late
from schemas.queries import QUERIES

#: An ahead-lane row as read_ahead_page returns it (an asyncpg Record; fields by name): shard, bucket_us,
#: wrr_round, occurrence_id, tenant_id, topic, message_key, message, available_us, discarded, late_after_us,
#: occurrence_header, tenant_header. The ``*_us`` instants are integer microseconds since the Unix epoch
#: (schemas.dispatch_lanes.micros_of), late_after_us None when the row cannot be late.
#: Records, not objects: a burst reads hundreds of thousands of them and every per-row allocation shows
#: in the dispatch rate (a datetime per instant did: see the query's comment).
AheadRow: TypeAlias = asyncpg.Record


def key_of(row: AheadRow) -> CursorKey:
    """The cursor key of an ahead-lane row."""
    return CursorKey(instant_of_micros(row["bucket_us"]), row["wrr_round"], row["occurrence_id"])


@dataclass(frozen=True)
class LoggedRange:
    """A part (from, to] of a shard's move, ``rows`` rows, logged with its own acknowledgement instant
    (None: the page's)."""

    start: CursorKey
    end: CursorKey
    rows: int
    acked_at: datetime | None = None


@dataclass(frozen=True)
class CursorMove:
    """One shard's progress in an acknowledged page, logged as ``ranges``: consecutive, the first from the
    shard's cursor, the last ending where the cursor moves (never empty). A page can hold several seconds of
    a shard's rows, released one second after the other: each second's rows are logged with the instant
    their own acknowledgements arrived, not the page's last."""

    shard: int
    epoch: int
    ranges: tuple[LoggedRange, ...]

    @property
    def end(self) -> CursorKey:
        return self.ranges[-1].end


@dataclass(frozen=True)
class Seal:
    sealed_until: dict[int, datetime]  # shard -> seal, for the shards still held
    now: datetime  # the database's instant (or the injected clock's)


@dataclass(frozen=True)
class LateJudgement:
    """What lateness at dispatch decided for the late rows a relay holds.

    skip: occurrence ids not to publish (recorded MISSED now, or discarded before).
    missed: rows recorded MISSED (any shard of the lane, held or not yet read).
    published_late: rows the policy still publishes although late.
    """

    skip: frozenset[uuid.UUID]
    missed: int
    published_late: int


@dataclass(frozen=True)
class Quarantined:
    occurrence_id: uuid.UUID
    shard: int
    lane: str
    tenant_id: str
    topic: str
    error: str
    tries: int


class AheadLaneStore:
    def __init__(self, pool: asyncpg.Pool, clock: Clock, node_id: str) -> None:
        self.pool = pool
        self.clock = clock
        self.node_id = node_id

    async def seal(self, lane: str, epochs: Mapping[int, int], boundary: datetime) -> Seal:
        """Seal ``lane`` of the given shards up to ``boundary`` (never backwards); waits for open
        materializer transactions on them, so every row before the seal is committed once this returns."""
        shards = sorted(epochs)
        rows = await self.pool.fetch(
            *QUERIES.seal_lanes(
                shards=shards, epochs=[epochs[s] for s in shards], until=boundary, node=self.node_id, lane=lane,
                now=self.clock.now(),
            )
        )  # fmt: skip
        now = rows[0]["now"] if rows else await self.now()
        return Seal({r["shard"]: aware(r["sealed_until"]) for r in rows}, now)

    async def now(self) -> datetime:
        """The injected clock's instant, else the database's."""
        return await self.pool.fetchval(*QUERIES.current_instant(now=self.clock.now()))

    async def positions(self, lane: str, shards: Sequence[int]) -> dict[int, CursorKey]:
        rows = await self.pool.fetch(*QUERIES.cursor_positions(shards=list(shards), lane=lane))
        found = {
            r["shard"]: CursorKey(aware(r["published_bucket"]), r["published_round"], r["published_id"]) for r in rows
        }
        return {s: found.get(s, START_KEY) for s in shards}

    async def read_page(
        self, lane: str, positions: Mapping[int, CursorKey], seals: Mapping[int, datetime], rows_per_shard: int
    ) -> list[AheadRow]:
        """The next rows of ``lane``: up to ``rows_per_shard`` per shard after its position, before its seal,
        ordered by shard then key (so each shard's rows are a prefix of what is left of it)."""
        shards = [s for s in sorted(positions) if s in seals]
        if not shards:
            return []
        keys = [positions[s] for s in shards]
        rows: list[AheadRow] = await self.pool.fetch(
            *QUERIES.read_ahead_page(
                shards=shards, buckets=[k.bucket for k in keys], rounds=[k.wrr_round for k in keys],
                ids=[k.occurrence_id for k in keys], seals=[seals[s] for s in shards], lane=lane,
                per_shard=rows_per_shard,
            )
        )  # fmt: skip
        return rows

    async def advance(
        self, lane: str, moves: Sequence[CursorMove], acked_at: datetime | None = None
    ) -> tuple[int, datetime]:
        """Move the cursors of an acknowledged page and log each move's ranges (one statement) with their
        acknowledgement instants (a range's own, else ``acked_at``: the relay's estimate of the database
        clock when the broker's last acknowledgement of the page arrived; else the injected clock's or the
        database's now); returns how many cursors moved (fewer than ``moves`` when a shard's epoch moved on:
        nothing of it is logged) and the page's instant logged."""
        shards = [m.shard for m in moves for _ in m.ranges]
        ranges = [r for m in moves for r in m.ranges]
        starts, ends = [r.start for r in ranges], [r.end for r in ranges]
        row = await self.pool.fetchrow(
            *QUERIES.advance_cursors(
                shards=[m.shard for m in moves], epochs=[m.epoch for m in moves],
                to_buckets=[m.end.bucket for m in moves], to_rounds=[m.end.wrr_round for m in moves],
                to_ids=[m.end.occurrence_id for m in moves], log_shards=shards,
                log_from_buckets=[k.bucket for k in starts], log_from_rounds=[k.wrr_round for k in starts],
                log_from_ids=[k.occurrence_id for k in starts], log_to_buckets=[k.bucket for k in ends],
                log_to_rounds=[k.wrr_round for k in ends], log_to_ids=[k.occurrence_id for k in ends],
                log_rows=[r.rows for r in ranges], log_acked_ats=[r.acked_at for r in ranges],
                now=self.clock.now(), node=self.node_id, lane=lane, acked_at=acked_at,
            )
        )  # fmt: skip
        return row["moved"], row["acked_at"]

    async def judge_late(
        self, lane: str, epochs: Mapping[int, int], rows: Sequence[AheadRow], now: datetime
    ) -> LateJudgement:
        """Lateness at dispatch for ``rows`` (held, due, past their late_after): the policy of each one's
        schedule applied to all of that schedule's due rows still to be judged (``judge_late``), written in
        one transaction conditional on the lease epochs."""
        firsts: dict[tuple[int, bytes], AheadRow] = {}
        for row in rows:
            group = (row["shard"], row["message_key"])
            if group not in firsts or key_of(row) < key_of(firsts[group]):
                firsts[group] = row
        starts = list(firsts.values())
        async with self.pool.acquire() as conn, conn.transaction():
            found = await conn.fetch(
                *QUERIES.late_ahead_candidates(
                    shards=[r["shard"] for r in starts], keys=[r["message_key"] for r in starts],
                    buckets=[instant_of_micros(r["bucket_us"]) for r in starts],
                    rounds=[r["wrr_round"] for r in starts],
                    ids=[r["occurrence_id"] for r in starts], held_ids=[r["occurrence_id"] for r in rows],
                    lane=lane, now=now,
                )
            )  # fmt: skip
            discarded = {f["occurrence_id"] for f in found if f["discarded"]}
            verdict = judge_late(
                [
                    LateDelivery(
                        (f["shard"], f["bucket"], f["wrr_round"], f["occurrence_id"]),
                        (f["shard"], f["message_key"]),
                        f["available_at"],
                        f["late_after"],
                        f["misfire_policy"],
                    )
                    for f in found
                    if not f["discarded"] and f["late_after"] is not None and f["misfire_policy"] is not None
                ],
                now,
            )
            missed: list[Any] = list(verdict.missed)
            kept: list[Any] = list(verdict.published_late)
            shards = sorted(epochs)
            written = await conn.fetchrow(
                *QUERIES.judge_ahead_rows(
                    shards=shards, epochs=[epochs[s] for s in shards], node=self.node_id, lane=lane, now=now,
                    missed_shards=[m[0] for m in missed], missed_buckets=[m[1] for m in missed],
                    missed_rounds=[m[2] for m in missed], missed_ids=[m[3] for m in missed],
                    kept_shards=[k[0] for k in kept], kept_buckets=[k[1] for k in kept],
                    kept_rounds=[k[2] for k in kept], kept_ids=[k[3] for k in kept],
                )
            )  # fmt: skip
        recorded = set(written["missed_ids"])
        held = {r["occurrence_id"] for r in rows}
        return LateJudgement(frozenset((recorded | discarded) & held), len(recorded), written["kept"])

    async def quarantine(self, rows: Sequence[Quarantined]) -> None:
        """Set poison rows aside with their error (the cursor then passes them)."""
        await self.pool.execute(
            *QUERIES.quarantine_rows(
                occurrence_ids=[q.occurrence_id for q in rows], shards=[q.shard for q in rows],
                lanes=[q.lane for q in rows], tenant_ids=[q.tenant_id for q in rows], topics=[q.topic for q in rows],
                errors=[q.error[:1000] for q in rows], tries=[q.tries for q in rows], now=self.clock.now(),
            )
        )  # fmt: skip

    async def backlog(self) -> dict[str, int]:
        """Due ahead-lane rows not yet passed by their cursor, per lane."""
        rows = await self.pool.fetch(*QUERIES.ahead_backlog(now=self.clock.now()))
        return {r["lane"]: r["due"] for r in rows}

"""Shard leases: each engine node heartbeats, renews its leases and rebalances, with no coordinator.

Every ``interval`` a node: records its heartbeat; renews the leases it holds
(a lease another node has taken since is dropped at once); reads who is live
and who owns what; and applies its part of the pure plan
(``engine.rules.shard_rebalance``): release shards above its target (after
it stopped working on them), acquire free ones (an acquisition bumps the
shard's epoch, which fences the previous owner's every later write). The
result is published in a :class:`~schemas.shard_ownership.ShardOwnership`
that the materializer and the relay of this node read.

Expiry is judged on the database's clock only. A node that cannot renew for
``lease_ttl`` forgets its shards locally before anyone else may take them;
one that is paused (SIGSTOP) past its lease wakes up fenced: its epochs are
stale, so its writes change nothing, and the server-side timeouts of its
connections (``engine.loops.service.DATA_PLANE_SERVER_SETTINGS``) have ended any transaction it
held open, so it holds no lock the new owner waits for.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass

import asyncpg
from opentelemetry import metrics

from engine.loops.lease_thread import LoopTicks
from engine.rules.shard_rebalance import Lease, plan_rebalance
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock, pause
from schemas.error_classification import DATABASE_ERRORS
from schemas.queries import QUERIES
from schemas.shard_ownership import ShardOwnership

log = logging.getLogger("chronoq.shard_leases")

#: Server settings of the lease loop's own connection. Its commits do not wait for the WAL to reach disk:
#: in an Apache Kafka 500,000 run both nodes' renewals took 2.9-3.4 s of "statements" and returned at the
#: same millisecond while the materializers wrote passes of 20,000 (a flush of their WAL, not a lock), two
#: such stalls from losing every shard. Durability buys a lease nothing: after a crash that loses the last
#: renewals a lease looks expired sooner, another node takes the shard with a bumped epoch, and the epoch
#: fencing that already guards every write refuses the old owner's. An acquisition is as safe: any write
#: made under the new epoch commits synchronously and so flushes the WAL that holds the acquisition.
LEASE_SERVER_SETTINGS = {"synchronous_commit": "off"}


def default_node_id() -> str:
    """host:pid plus a random suffix: unique per process start, readable in engine_nodes."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class ShardLeaseConfig:
    """interval: seconds between rounds (heartbeat, renew, rebalance; default 1).
    lease_ttl: seconds a lease and a heartbeat last without renewal (default 6); a dead node's shards
        move after at most this plus one interval.
    max_moves: shards acquired or released per round (default 64), so a joining node ramps up smoothly.
    loop_stall_limit: seconds the node's event loop may go without ticking before a lease loop on a thread
        of its own (``engine.loops.lease_thread``) stops heartbeating and renewing (default 15): a wedged node
        then gives its shards up as a dead one does, while a congested one keeps them.
    """

    interval: float = 1.0
    lease_ttl: float = 6.0
    max_moves: int = 64
    loop_stall_limit: float = 15.0

    def validate(self) -> None:
        if self.lease_ttl <= 2 * self.interval:
            raise ValueError("lease_ttl must exceed twice the interval, or leases lapse between renewals")
        if self.max_moves < 1:
            raise ValueError("max_moves must be at least 1")
        if self.loop_stall_limit < self.lease_ttl:
            raise ValueError("loop_stall_limit must be at least lease_ttl, or a slow loop loses shards sooner off it")


@dataclass
class LeaseRound:
    owned: int = 0
    acquired: tuple[int, ...] = ()
    released: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    live_nodes: int = 0


class ShardLeases:
    def __init__(
        self,
        pool: asyncpg.Pool,
        ownership: ShardOwnership,
        config: ShardLeaseConfig | None = None,
        clock: Clock | None = None,
        meter: metrics.Meter | None = None,
        ticks: LoopTicks | None = None,
    ) -> None:
        """``ticks``: the node loop's ticks, when this runs on a thread of its own (``engine.loops.lease_thread``)."""
        self.pool = pool
        self.ownership = ownership
        self.ticks = ticks
        self._standing_down = False
        self.node_id = ownership.node_id
        self.config = config or ShardLeaseConfig()
        self.config.validate()
        self.clock = clock or DatabaseClock()
        meter = meter or obs.get_meter("engine")
        self._owned_gauge = meter.create_gauge(obs.SHARDS_OWNED, unit="1")
        self._moves = meter.create_counter(obs.SHARD_MOVES, unit="1")
        self._renewal_gap = meter.create_histogram(obs.SHARD_RENEWAL_GAP, unit="s")
        self._renewed_at = time.monotonic()

    async def run_once(self) -> LeaseRound:
        """One round: heartbeat, renew, plan, release, acquire; the ownership reflects the result."""
        cfg, now = self.config, self.clock.now()
        result = LeaseRound()
        held = self.ownership.snapshot()
        began = time.monotonic()
        async with self.pool.acquire() as conn:
            connected = time.monotonic()
            await conn.execute(*QUERIES.heartbeat_node(node=self.node_id, ttl_s=cfg.lease_ttl, now=now))
            if held:
                shards = sorted(held)
                renewed = {
                    r["shard"]: r["epoch"]
                    for r in await conn.fetch(
                        *QUERIES.renew_shards(
                            shards=shards, epochs=[held[s] for s in shards], node=self.node_id, ttl_s=cfg.lease_ttl,
                            now=now,
                        )
                    )
                }  # fmt: skip
                result.lost = tuple(s for s in shards if s not in renewed)
                if result.lost:
                    log.warning(
                        "shards lost to another node",
                        extra={"action": "shard.lost", "node_id": self.node_id, "shards": list(result.lost)},
                    )
                held = renewed
                self.ownership.replace(held)
            self._record_renewal(began, connected)
            live = [r["node_id"] for r in await conn.fetch(*QUERIES.live_nodes(now=now))]
            picture = {
                r["shard"]: Lease(r["owner"], r["expired"]) for r in await conn.fetch(*QUERIES.lease_picture(now=now))
            }
            plan = plan_rebalance(self.node_id, live, picture, len(picture), cfg.max_moves)
            result.live_nodes = len(live)
            if plan.release:
                # Stop working on them here first; the database release lets another node take them.
                self.ownership.drop(plan.release)
                released = [
                    r["shard"]
                    for r in await conn.fetch(
                        *QUERIES.release_shards(
                            shards=list(plan.release), epochs=[held[s] for s in plan.release], node=self.node_id,
                            now=now,
                        )
                    )
                ]  # fmt: skip
                held = {s: e for s, e in held.items() if s not in plan.release}
                result.released = tuple(released)
            if plan.acquire:
                acquired = {
                    r["shard"]: r["epoch"]
                    for r in await conn.fetch(
                        *QUERIES.acquire_shards(
                            shards=list(plan.acquire), node=self.node_id, ttl_s=cfg.lease_ttl, now=now
                        )
                    )
                }
                held = {**held, **acquired}
                result.acquired = tuple(sorted(acquired))
        self.ownership.replace(held)
        result.owned = len(held)
        self._owned_gauge.set(result.owned, {"node_id": self.node_id})
        if result.acquired or result.released:
            self._moves.add(len(result.acquired), {"direction": "acquired"})
            self._moves.add(len(result.released), {"direction": "released"})
            log.info(
                "shards rebalanced",
                extra={
                    "action": "shard.rebalanced",
                    "node_id": self.node_id,
                    "acquired": len(result.acquired),
                    "released": len(result.released),
                    "owned": result.owned,
                    "target": plan.target,
                    "live_nodes": len(live),
                },
            )
        return result

    def _record_renewal(self, began: float, connected: float) -> None:
        """Record the time since the previous renewal; a gap past half the ttl is logged with where it went
        (the wait before the round began: this process's event loop; the wait for a connection; the
        statements: the database), because a gap of ``lease_ttl`` costs the node its shards."""
        renewed = time.monotonic()
        gap, self._renewed_at = renewed - self._renewed_at, renewed
        self._renewal_gap.record(gap, {"node_id": self.node_id})
        if gap > self.config.lease_ttl / 2:
            log.warning(
                "shard lease renewal late",
                extra={
                    "action": "shard.renewal_late",
                    "node_id": self.node_id,
                    "gap_s": round(gap, 3),
                    "lease_ttl_s": self.config.lease_ttl,
                    "connection_wait_s": round(connected - began, 3),
                    "statements_s": round(renewed - connected, 3),
                },
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Hold leases until ``stop``; then release them all and leave the live list."""
        try:
            while not stop.is_set():
                if self._node_loop_wedged():
                    await pause(stop, self.config.interval)
                    continue
                try:
                    await self.run_once()
                except DATABASE_ERRORS as err:
                    log.error(
                        "shard lease round failed; retrying",
                        extra={"action": "shard.lease_error", "node_id": self.node_id, "error": repr(err)},
                    )
                    if time.monotonic() - self._renewed_at > self.config.lease_ttl - self.config.interval:
                        # The leases may lapse before the next renewal: stop acting on them now.
                        self.ownership.replace({})
                await pause(stop, self.config.interval)
        finally:
            await self.release_all()

    def _node_loop_wedged(self) -> bool:
        """True while the node's loop has not ticked for ``loop_stall_limit``: this round neither heartbeats nor
        renews, and the node stops acting on its shards, so they expire and move as a dead node's would (a
        relay that wakes up later is fenced by the new owners' epochs). Renewing resumes with the ticks."""
        if self.ticks is None:
            return False
        stalled = self.ticks.stalled_for()
        wedged = stalled > self.config.loop_stall_limit
        if wedged != self._standing_down:
            self._standing_down = wedged
            log.warning(
                "node event loop stalled; leases left to expire" if wedged else "node event loop back; leasing again",
                extra={"action": "shard.loop_wedged" if wedged else "shard.loop_back", "node_id": self.node_id,
                       "stalled_s": round(stalled, 3)},
            )  # fmt: skip
        if wedged:
            self.ownership.replace({})
            self._owned_gauge.set(0, {"node_id": self.node_id})
        return wedged

    async def release_all(self) -> None:
        """Clean stop: release every lease at once so other nodes need not wait for expiry."""
        held = self.ownership.snapshot()
        self.ownership.replace({})
        try:
            async with self.pool.acquire() as conn:
                if held:
                    shards = sorted(held)
                    await conn.execute(
                        *QUERIES.release_shards(
                            shards=shards, epochs=[held[s] for s in shards], node=self.node_id, now=self.clock.now()
                        )
                    )
                await conn.execute(*QUERIES.remove_node(node=self.node_id))
        except DATABASE_ERRORS as err:
            log.warning(
                "could not release shards on stop; they expire instead",
                extra={"action": "shard.release_error", "node_id": self.node_id, "error": repr(err)},
            )

"""Which shards an engine node should acquire or release: the rebalance planner, without a coordinator.

Pure: every node runs :func:`plan_rebalance` on the same picture of the
database (live nodes, current leases) and acts only on its own part of the
plan, so the nodes converge without talking to each other:

1. The live nodes, sorted by id, each get a *target*: ``N // L`` shards, plus
   one for the first ``N % L`` nodes. The targets add up to exactly N, so
   whenever a shard is free some live node is below its target and takes it.
2. A node above its target releases its highest-numbered shards (the ones it
   acquired last in the common case), at most ``max_moves`` per round.
3. A node below its target acquires free shards (never owned, released, or
   whose lease expired), at most ``max_moves`` per round, preferring shards
   that hash to it (rendezvous order), so a node that restarts tends to get
   its old shards back and the others keep theirs.

A node that is not in its own live list (its heartbeat expired) plans to
release everything: it may have been paused, and the others are already
taking its shards. The database enforces the real invariant (one owner per
shard, fencing epochs); the planner only decides who tries what.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Lease:
    """One shard's lease as read from the database (expiry judged on the database clock)."""

    owner: str | None
    expired: bool

    @property
    def free(self) -> bool:
        return self.owner is None or self.expired


@dataclass(frozen=True)
class RebalancePlan:
    target: int  # shards this node should own once the nodes agree
    acquire: tuple[int, ...] = ()  # free shards to try to take (they may be gone by then)
    release: tuple[int, ...] = ()  # own shards to give up


def targets(live_nodes: Iterable[str], shard_count: int) -> dict[str, int]:
    """Each live node's share: N // L, one more for the first N % L nodes by id; the shares sum to N."""
    nodes = sorted(set(live_nodes))
    if not nodes:
        return {}
    base, extra = divmod(shard_count, len(nodes))
    return {node: base + (1 if rank < extra else 0) for rank, node in enumerate(nodes)}


def _affinity(node: str, shard: int) -> bytes:
    return hashlib.blake2b(f"{node}/{shard}".encode(), digest_size=8).digest()


def plan_rebalance(
    me: str, live_nodes: Iterable[str], leases: Mapping[int, Lease], shard_count: int, max_moves: int = 32
) -> RebalancePlan:
    """What ``me`` should acquire and release this round (see the module docstring for the rules)."""
    if shard_count < 1:
        raise ValueError("shard_count must be at least 1")
    if max_moves < 1:
        raise ValueError("max_moves must be at least 1")
    mine = sorted(s for s, lease in leases.items() if lease.owner == me and not lease.expired)
    share = targets(live_nodes, shard_count)
    if me not in share:
        return RebalancePlan(target=0, release=tuple(mine))
    target = share[me]
    if len(mine) > target:
        return RebalancePlan(target=target, release=tuple(reversed(mine[target:]))[:max_moves])
    wanted = min(target - len(mine), max_moves)
    free = [s for s in range(shard_count) if leases.get(s, Lease(None, True)).free]
    free.sort(key=lambda s: _affinity(me, s))
    return RebalancePlan(target=target, acquire=tuple(sorted(free[:wanted])))

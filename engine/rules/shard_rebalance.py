"""Which shards an engine node should acquire or release: the rebalance planner, without a coordinator.

Pure: every node runs :func:`plan_rebalance` on the same picture of the
database (live nodes, current leases) and acts only on its own part of the
plan, so the nodes converge without talking to each other:

1. The live nodes, sorted by id, each get a *target*: ``N // L`` shards, plus
   one for the first ``N % L`` nodes. The targets add up to exactly N, so
   whenever a shard is free some live node is below its target and takes it.
2. A node above its target releases shards outside its *home range* first,
   then its highest-numbered ones, at most ``max_moves`` per round. The home
   range is the rank-th of L contiguous ranges of the shards, exactly as
   large as the target (``schemas.shard_placement.home_range``).
3. A node below its target acquires free shards (never owned, released, or
   whose lease expired), at most ``max_moves`` per round, those of its home
   range first, lowest first.

Home ranges are what make a node produce to few partitions: the ahead relay
places a shard's records on the partition covering its shard range
(``schemas.shard_placement.partition_of_shard``), so a node owning a
contiguous range produces to about P / L of a topic's P partitions, in
batches L times larger than if every node produced to all of them. A node
restarting under the same id (``DataPlaneConfig.node_id``; the default id is
new at every process start) among the same nodes has the same rank, hence the
same home range: it gets its old shards back.
Nodes joining or leaving shift the ranks, and the shards move towards the new
ranges only as far as the targets require: a node at its target keeps what
it has, so placement may stay partly off-range, which costs batch size, never
correctness.

A node that is not in its own live list (its heartbeat expired) plans to
release everything: it may have been paused, and the others are already
taking its shards. The database enforces the real invariant (one owner per
shard, fencing epochs); the planner only decides who tries what.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from schemas.shard_placement import home_range


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
    home = home_range(sorted(share).index(me), len(share), shard_count)
    if len(mine) > target:
        # Off-range shards first (highest first), then the highest of the home range.
        giving_up = sorted(mine, key=lambda s: (s in home, -s))[: len(mine) - target]
        return RebalancePlan(target=target, release=tuple(giving_up[:max_moves]))
    wanted = min(target - len(mine), max_moves)
    free = [s for s in range(shard_count) if leases.get(s, Lease(None, True)).free]
    free.sort(key=lambda s: (s not in home, s))
    return RebalancePlan(target=target, acquire=tuple(sorted(free[:wanted])))

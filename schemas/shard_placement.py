"""Where a shard lives: its engine node's home range and its occurrence topics' partition.

Shards are cut into contiguous ranges twice, by the same rule:

* the live engine nodes, sorted by id, each have a *home range*: the rank-th of L contiguous ranges of
  the N shards, as large as the node's share; the rebalance planner prefers shards in a node's home range
  (``engine.rules.shard_rebalance``);
* an occurrence topic's P partitions each take a contiguous range of the shards:
  ``partition = shard * P // N``. Both publishers place an occurrence record there, its shard read
  from its key (the schedule id, ``schemas.topics.schedule_key``), so both lanes put a schedule's
  occurrences on the same partition (``placement``); any other key is hashed (murmur2) as before.

So a node whose shards are its home range produces to about P / L partitions instead of all P. Measured
(docs/benchmarks.md, "Partitions by shard range"): two nodes producing to all 32 partitions of four
topics sent batches half as large as one node did, and tansu's CPU per dispatched row doubled; placed by
shard range, tansu's CPU per row fell by 40 % and the 500,000 burst's dispatch rate rose by 17 %.

A schedule's shard never changes, so its occurrences keep one partition (their order) for as long as the
topic's partition count does, which is what key hashing promised too; one tenant's burst still spreads
over every partition, because its schedules hash over all the shards. Pure, no I/O (the pure rules
use it: ``engine.rules.shard_rebalance``).
"""

from __future__ import annotations

import functools
import uuid

#: The logical shard count N: fixed for the life of a database (each schedule row stores its shard).
SHARD_COUNT = 256


def shard_of(schedule_id: uuid.UUID) -> int:
    """The shard of a schedule: the first four bytes of its id, mod :data:`SHARD_COUNT`."""
    return int.from_bytes(schedule_id.bytes[:4], "big") % SHARD_COUNT


def shard_of_key(key: bytes | None) -> int | None:
    """The shard of a record keyed by a schedule id in its text form (its first eight hex digits are the
    id's first four bytes, :func:`shard_of`), or None for any other key."""
    if key is None or len(key) != 36 or key[8:9] != b"-":
        return None
    try:
        return int(key[:8], 16) % SHARD_COUNT
    except ValueError:
        return None


def placement(key: bytes | None, partitions: int) -> int | None:
    """The partition of an occurrence record with this key on a topic of ``partitions`` partitions, or
    None when the key names no schedule (the caller hashes it)."""
    shard = shard_of_key(key)
    return None if shard is None else partition_table(partitions)[shard]


@functools.lru_cache(maxsize=64)
def partition_table(partitions: int) -> tuple[int, ...]:
    """:func:`partition_of_shard` of every shard for a topic of ``partitions`` partitions, computed once per
    count: a relay places every record of a burst, and placing them was ~6 % of the nodes' CPU there, half of
    it the checks and calls of partition_of_shard (py-spy, a 500,000 burst, docs/benchmarks.md stop 40)."""
    return tuple(partition_of_shard(shard, partitions) for shard in range(SHARD_COUNT))


def home_range(rank: int, nodes: int, shard_count: int = SHARD_COUNT) -> range:
    """The shards of the ``rank``-th of ``nodes`` live nodes (by id): contiguous, in rank order, covering
    every shard once; ``shard_count // nodes`` each, one more for the first ``shard_count % nodes`` ranks
    (the rebalance planner's targets, so a node's home holds exactly its share)."""
    if nodes < 1 or not 0 <= rank < nodes:
        raise ValueError(f"rank {rank} is not among {nodes} nodes")
    base, extra = divmod(shard_count, nodes)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def partition_of_shard(shard: int, partitions: int, shard_count: int = SHARD_COUNT) -> int:
    """The partition, of a topic with ``partitions`` partitions, that ``shard``'s records go to.

    Non-decreasing in the shard, every partition gets a contiguous range of shards (all of them some
    when ``partitions <= shard_count``), and the same shard always gets the same partition.
    """
    if partitions < 1:
        raise ValueError("a topic has at least one partition")
    if not 0 <= shard < shard_count:
        raise ValueError(f"shard {shard} is outside 0..{shard_count - 1}")
    return shard * partitions // shard_count

"""Weighted round-robin across tenants, as a number written on each dispatch row.

The relay reads each shard's due rows in the order of its ahead-lane key
``(bucket, wrr_round, occurrence_id)``. Writing ``wrr_round = seq // weight``
(``seq``: the row's index among the same tenant's rows in the same shard,
lane and bucket) makes that order a weighted round-robin: round r holds at
most ``weight`` rows of each tenant, so a tenant with 20 due rows is finished
within its first rounds while a tenant with 400,000 waits for its later ones —
one tenant's burst cannot delay the others, and nothing is reordered at
dispatch time (the order is an index range scan, and a crash republishes the
same order).

Pure. The materializer keeps a :class:`RoundCounter` per process: it is exact
while one node owns a shard (the only writer of its ahead rows); after a
restart or failover the counts start again at 0 for rows still to be written,
which only interleaves them a little earlier — never a loss or a duplicate.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping


class RoundCounter:
    """Next sequence number per (bucket key, tenant), for the last ``capacity`` keys used."""

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._next: OrderedDict[tuple[Hashable, str], int] = OrderedDict()

    def take(self, bucket_key: Hashable, tenant: str, weight: int) -> int:
        """The round of the next row of ``tenant`` in ``bucket_key`` (weight >= 1)."""
        if weight < 1:
            raise ValueError("weight must be at least 1")
        key = (bucket_key, tenant)
        seq = self._next.pop(key, 0)
        self._next[key] = seq + 1
        if len(self._next) > self.capacity:
            self._next.popitem(last=False)
        return seq // weight


def assign_rounds(
    rows: Iterable[tuple[Hashable, str]],
    weights: Mapping[str, int],
    counter: RoundCounter | None = None,
    default_weight: int = 1,
) -> list[int]:
    """The round of each (bucket key, tenant) row, in input order."""
    counter = counter or RoundCounter()
    return [counter.take(key, tenant, weights.get(tenant, default_weight)) for key, tenant in rows]

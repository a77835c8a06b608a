"""Logical shards: shard = hash(schedule_id) mod SHARD_COUNT.

Engine nodes lease shards; the count is fixed for the life of a database
(every schedule row stores its shard when it is created).
"""

from __future__ import annotations

from schemas.shard_placement import SHARD_COUNT, shard_of

__all__ = ["SHARD_COUNT", "shard_of"]

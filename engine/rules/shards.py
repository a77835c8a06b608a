"""Logical shards: shard = hash(schedule_id) mod SHARD_COUNT.

Engine nodes lease shards; the count is fixed for the life of a database
(every schedule row stores its shard when it is created).
"""

from __future__ import annotations

import uuid

SHARD_COUNT = 256


def shard_of(schedule_id: uuid.UUID) -> int:
    """The shard of a schedule: the first four bytes of its id, mod :data:`SHARD_COUNT`."""
    return int.from_bytes(schedule_id.bytes[:4], "big") % SHARD_COUNT

"""The shards this process owns right now, with their fencing epochs.

Written by the engine's shard-lease loop, read by the materializer and the
relay (which must not import the engine, hence this pure type in schemas).
An owner's every write on behalf of a shard carries the epoch read here, and
the database refuses it if the epoch is no longer current: losing a shard
here is only the fast path; the epoch check is the guarantee.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping


class ShardOwnership:
    """shard → epoch, with an event that is set whenever the set changes."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._epochs: dict[int, int] = {}
        self.version = 0
        self.changed = asyncio.Event()

    def snapshot(self) -> dict[int, int]:
        """A copy of shard → epoch (stable while the caller works with it)."""
        return dict(self._epochs)

    def epoch(self, shard: int) -> int | None:
        return self._epochs.get(shard)

    def __contains__(self, shard: object) -> bool:
        return shard in self._epochs

    def __len__(self) -> int:
        return len(self._epochs)

    def replace(self, epochs: Mapping[int, int]) -> None:
        """Set the owned shards to exactly ``epochs``; signal if anything changed."""
        if dict(epochs) != self._epochs:
            self._epochs = dict(epochs)
            self.version += 1
            self.changed.set()

    def drop(self, shards: set[int] | list[int] | tuple[int, ...]) -> None:
        """Forget shards at once (lost or released): nothing more is done for them here."""
        remaining = {s: e for s, e in self._epochs.items() if s not in set(shards)}
        self.replace(remaining)

"""The shards this process owns right now, with their fencing epochs.

Written by the engine's shard-lease loop, read by the materializer and the
relay (which must not import the engine, hence this pure type in schemas).
An owner's every write on behalf of a shard carries the epoch read here, and
the database refuses it if the epoch is no longer current: losing a shard
here is only the fast path; the epoch check is the guarantee.

The lease loop may run on a thread of its own (``engine.loops.lease_thread``):
every change builds a new mapping and swaps it in, so a reader on the node's
loop always sees one whole set, and ``changed`` is set on the loop it belongs
to (``bind_loop``).
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
        self._home: asyncio.AbstractEventLoop | None = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop whose tasks wait on ``changed``; a change made on another thread signals it there."""
        self._home = loop

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
            self._signal()

    def _signal(self) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._home is None or running is self._home:
            self.changed.set()
        elif not self._home.is_closed():
            self._home.call_soon_threadsafe(self.changed.set)

    def drop(self, shards: set[int] | list[int] | tuple[int, ...]) -> None:
        """Forget shards at once (lost or released): nothing more is done for them here."""
        remaining = {s: e for s, e in self._epochs.items() if s not in set(shards)}
        self.replace(remaining)

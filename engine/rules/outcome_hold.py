"""Outcomes wait behind starts while starts stream in: which attempt events the processor applies now.

Every batch handler waits for the engine's answer to its ``started`` (the cancel barrier) before it calls
the handler. Nobody waits for the engine to apply an outcome or a heartbeat: the app's dedupe row already
made the effect single, and the lease reaper judges leases only up to what the processor has applied
(``attempt_event_progress``), so an outcome applied later never times a healthy attempt out. During a
burst both compete for the same two cores, and applying an outcome costs about what a start does (the
lock, an occurrence update, an attempt update). So while starts stream in (``starts`` or more within
``window`` seconds), the processor applies them and **holds** the outcomes and heartbeats read with them, in
memory and in order; it applies them once starts stop streaming, or the oldest has waited ``max_age``
seconds, ``release`` per round (docs/consumer-runtime.md); past ``max_events`` (~1.2 kB each) it holds no
more. The window is seconds, not one poll: runtimes send their starts a batch at a time and wait for the
answers, so a burst's starts come in waves, and a hold that lapsed between two waves would put the
backlog of outcomes in front of the next wave's answers (measured, docs/benchmarks.md stop 59).

Pure: every method takes the instant (monotonic seconds). Guarantees (property-tested in
tests/unit/test_outcome_hold.py):

* each occurrence's events come back in the order they were read: a start goes ahead only as the first
  event of its occurrence among its partition's events not yet given back; anything read after a held event
  of the same occurrence waits behind it;
* nothing admitted is lost: every item comes back exactly once (from :meth:`admit` or :meth:`release`),
  except those the caller reads again (:meth:`admit` of an offset already read drops the held items from
  there on) or stops owning (:meth:`forget`), and :meth:`rollback` puts back what a failed apply took;
* :meth:`held_from` is at or below the offset of every held item of its partition: an offset committed up
  to it never passes a held event, so a crash reads every held event again;
* a start is never held behind a start or an outcome of another occurrence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

E = TypeVar("E")
Partition = int | None

#: A release round after a poll that read nothing applies this many rounds' worth: nobody waits for an answer,
#: and each round costs the reader an idle poll (its fetch wait) before the next.
IDLE_ROUNDS = 4


@dataclass(frozen=True)
class HoldLimits:
    """starts: starts admitted within ``window`` seconds that make a stream (0: never hold). max_age: the
    longest an event is held (s). max_events: held at most, all partitions together. release: held events
    given back per :meth:`OutcomeHold.release` (a round), so a long hold's backlog is applied between polls
    that keep answering starts."""

    starts: int = 500
    window: float = 2.0
    max_age: float = 60.0
    max_events: int = 250_000
    release: int = 8_000

    def validate(self) -> None:
        if self.starts < 0 or self.window <= 0 or self.max_age < 0 or self.max_events < 0 or self.release < 1:
            raise ValueError(
                "outcome hold: starts, max_age and max_events must be 0 or more, window more than 0, release 1 or more"
            )


@dataclass(frozen=True)
class _Kept(Generic[E]):
    """A partition's hold as it was (for :meth:`OutcomeHold.rollback`)."""

    held: list[E] | None
    since: float | None
    read_to: int | None


class OutcomeHold(Generic[E]):
    """Per partition, the events read and not given back yet, in read order (see the module docstring).

    ``is_start``, ``occurrence`` and ``offset`` say of an item whether it is a ``started``, which occurrence
    it is about and the offset of its record (the events of a group record share one)."""

    def __init__(
        self,
        limits: HoldLimits,
        is_start: Callable[[E], bool],
        occurrence: Callable[[E], Hashable],
        offset: Callable[[E], int],
    ) -> None:
        limits.validate()
        self.limits = limits
        self._is_start = is_start
        self._occurrence = occurrence
        self._offset = offset
        self._held: dict[Partition, list[E]] = {}
        self._since: dict[Partition, float] = {}  # when each partition's oldest held item was admitted
        self._read_to: dict[Partition, int] = {}  # past the last offset admitted
        self._starts: deque[tuple[float, int]] = deque()  # (when, starts admitted), oldest first
        self._count = 0

    @property
    def held(self) -> int:
        """Events held, all partitions together."""
        return self._count

    def holds(self, partition: Partition) -> bool:
        return partition in self._held

    def items(self) -> Iterator[E]:
        """Every held event, partition by partition, in order."""
        for held in self._held.values():
            yield from held

    def partitions(self) -> list[Partition]:
        """The partitions holding events."""
        return list(self._held)

    def read_to(self, partition: Partition) -> int | None:
        """Past the last offset admitted of the partition (every record before it is applied or held)."""
        return self._read_to.get(partition)

    def held_from(self, partition: Partition) -> int | None:
        """The offset of the partition's first held record (commit no further), None when it holds nothing."""
        held = self._held.get(partition)
        return self._offset(held[0]) if held else None

    def oldest(self) -> float | None:
        """When the oldest held event was admitted."""
        return min(self._since.values(), default=None)

    def streaming(self, now: float) -> bool:
        """``starts`` or more starts were admitted within ``window`` seconds before ``now``."""
        while self._starts and self._starts[0][0] <= now - self.limits.window:
            self._starts.popleft()
        return self.limits.starts > 0 and sum(n for _, n in self._starts) >= self.limits.starts

    def holding(self, now: float, more: int = 0) -> bool:
        """Whether events are held now (with ``more`` held besides): starts stream in, and neither the age nor
        the count limit is reached."""
        oldest = self.oldest()
        return (
            self.streaming(now)
            and self._count + more <= self.limits.max_events
            and (oldest is None or now - oldest < self.limits.max_age)
        )

    def mark(self, partitions: Iterable[Partition]) -> dict[Partition, _Kept[E]]:
        """The hold of ``partitions`` as it is now, for :meth:`rollback` if applying what comes back fails."""
        return {p: _Kept(self._held.get(p), self._since.get(p), self._read_to.get(p)) for p in partitions}

    def rollback(self, kept: Mapping[Partition, _Kept[E]]) -> None:
        """Put the partitions back as :meth:`mark` saw them (their items were not applied: the caller reads the
        records it handed over again, and gets the held ones back later)."""
        for partition, was in kept.items():
            self._count -= len(self._held.pop(partition, ()))
            self._since.pop(partition, None)
            self._read_to.pop(partition, None)
            if was.since is not None:
                self._since[partition] = was.since
            if was.read_to is not None:
                self._read_to[partition] = was.read_to
            if was.held:
                self._held[partition] = was.held
                self._count += len(was.held)

    def admit(self, partition: Partition, items: Sequence[E], now: float) -> list[E]:
        """The events of ``partition`` to apply now, of those held and ``items`` (read after them, in order).
        The rest is held while :meth:`holding`, and otherwise too behind the partition's events still held
        (within ``max_events``): those are applied by :meth:`release` rounds, a bounded share each, never all
        at once in one reader's unit, which would keep the next starts waiting behind it. Items at an offset
        already admitted are a re-read (a rewind, a partition assigned again): held items from that offset on
        are dropped first, as they come again in ``items``."""
        if not items:
            return []
        first = self._offset(items[0])
        if first < self._read_to.get(partition, first):
            self._drop_from(partition, first)
        self._read_to[partition] = self._offset(items[-1]) + 1
        held = self._held.pop(partition, [])
        self._count -= len(held)
        pending = [*held, *items]
        ahead, rest = self._split(pending)
        if ahead:
            self._starts.append((now, len(ahead)))
        since = self._since.pop(partition, now)
        within = self._count + len(rest) <= self.limits.max_events
        if rest and within and (held or (self.holding(now, len(rest)) and now - since < self.limits.max_age)):
            self._held[partition] = rest
            self._since[partition] = since
            self._count += len(rest)
            return ahead
        return ahead + rest

    def release(self, now: float, idle: bool = False) -> dict[Partition, list[E]]:
        """Held events to apply now, when no longer holding: up to ``release`` of them (``IDLE_ROUNDS`` times
        as many when the last poll read nothing: no start is waiting), shared evenly by the holding partitions
        (they are applied side by side, one lane each), each partition's from its first, what a partition
        leaves of its share going to the longest-held ones. Empty while holding."""
        if not self._held or self.holding(now):
            return {}
        budget = self.limits.release * (IDLE_ROUNDS if idle else 1)
        partitions = sorted(self._held, key=lambda p: self._since[p])[:budget]
        share = budget // len(partitions)
        take = {p: min(len(self._held[p]), share) for p in partitions}
        left = budget - sum(take.values())
        for partition in partitions:  # what the others left, longest-held first
            more = min(len(self._held[partition]) - take[partition], left)
            take[partition] += more
            left -= more
        out: dict[Partition, list[E]] = {}
        for partition, n in take.items():
            held = self._held[partition]
            out[partition] = held[:n]
            self._count -= n
            if n < len(held):
                self._held[partition] = held[n:]  # still waiting since the same admission: its age goes on
            else:
                del self._held[partition]
                del self._since[partition]
        return out

    def forget(self, partitions: Iterable[Partition]) -> int:
        """Drop what is held of ``partitions`` (no longer this processor's: their next owner reads them from
        the committed offset, at or below :meth:`held_from`). Returns how many events were dropped."""
        dropped = 0
        for partition in partitions:
            dropped += len(self._held.pop(partition, ()))
            self._since.pop(partition, None)
            self._read_to.pop(partition, None)
        self._count -= dropped
        return dropped

    def _drop_from(self, partition: Partition, offset: int) -> None:
        held = self._held.get(partition)
        if not held:
            return
        kept = [item for item in held if self._offset(item) < offset]
        self._count -= len(held) - len(kept)
        if kept:
            self._held[partition] = kept
        else:
            del self._held[partition]
            del self._since[partition]

    def _split(self, pending: Sequence[E]) -> tuple[list[E], list[E]]:
        return starts_ahead(pending, self._is_start, self._occurrence)


def starts_ahead(
    items: Iterable[E], is_start: Callable[[E], bool], occurrence: Callable[[E], Hashable]
) -> tuple[list[E], list[E]]:
    """The starts that are the first of ``items`` about their occurrence, and the rest, each in order: each
    occurrence's events keep their order whichever of the two goes first."""
    seen: set[Hashable] = set()
    ahead: list[E] = []
    rest: list[E] = []
    for item in items:
        about = occurrence(item)
        (ahead if is_start(item) and about not in seen else rest).append(item)
        seen.add(about)
    return ahead, rest

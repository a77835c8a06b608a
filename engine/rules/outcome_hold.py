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
more (but for events of an occurrence with events held, which must wait behind them). The window is
seconds, not one poll: runtimes send their starts a batch at a time and wait for the answers, so a burst's
starts come in waves, and a hold that lapsed between two waves would put the backlog of outcomes in front of
the next wave's answers (measured, docs/benchmarks.md stop 59).

Pure: every method takes the instant (monotonic seconds). Guarantees (property-tested in
tests/unit/test_outcome_hold.py):

* each occurrence's events come back in the order they were read: anything read after a held event of the
  same occurrence waits behind it; a start goes ahead of the events held unless its occurrence has one;
* nothing admitted is lost: every item comes back exactly once (from :meth:`admit` or :meth:`release`),
  except those the caller reads again (:meth:`admit` of an offset already read drops the held items from
  there on) or stops owning (:meth:`forget`), and :meth:`rollback` puts back what a failed apply took;
* :meth:`held_from` is at or below the offset of every held item of its partition: an offset committed up
  to it never passes a held event, so a crash reads every held event again;
* a start is never held behind the events of another occurrence.
"""

from __future__ import annotations

from collections import Counter, deque
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
    max_age: float = 150.0
    max_events: int = 600_000
    release: int = 8_000

    def validate(self) -> None:
        if self.starts < 0 or self.window <= 0 or self.max_age < 0 or self.max_events < 0 or self.release < 1:
            raise ValueError(
                "outcome hold: starts, max_age and max_events must be 0 or more, window more than 0, release 1 or more"
            )


class _Lane(Generic[E]):
    """One partition's held events in read order, how many of them each occurrence has (an occurrence with
    any held must wait behind them), and when the oldest was admitted. :meth:`OutcomeHold.admit` appends in
    place (a burst's backlog is never copied per read); anything that takes events out makes a new lane, so a
    lane :meth:`OutcomeHold.mark` saw is changed only by appends."""

    __slots__ = ("items", "per_occurrence", "since")

    def __init__(self, items: list[E], per_occurrence: Counter[Hashable], since: float) -> None:
        self.items = items
        self.per_occurrence = per_occurrence
        self.since = since


@dataclass(frozen=True)
class Kept(Generic[E]):
    """A partition's hold as :meth:`OutcomeHold.mark` saw it: its lane and that lane's length then."""

    lane: _Lane[E] | None
    length: int
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
        self._lanes: dict[Partition, _Lane[E]] = {}
        self._read_to: dict[Partition, int] = {}  # past the last offset admitted
        self._starts: deque[tuple[float, int]] = deque()  # (when, starts admitted), oldest first
        self._count = 0

    @property
    def held(self) -> int:
        """Events held, all partitions together."""
        return self._count

    def holds(self, partition: Partition) -> bool:
        return partition in self._lanes

    def items(self) -> Iterator[E]:
        """Every held event, partition by partition, in order."""
        for lane in self._lanes.values():
            yield from lane.items

    def partitions(self) -> list[Partition]:
        """The partitions holding events."""
        return list(self._lanes)

    def read_to(self, partition: Partition) -> int | None:
        """Past the last offset admitted of the partition (every record before it is applied or held)."""
        return self._read_to.get(partition)

    def held_from(self, partition: Partition) -> int | None:
        """The offset of the partition's first held record (commit no further), None when it holds nothing."""
        lane = self._lanes.get(partition)
        return self._offset(lane.items[0]) if lane else None

    def oldest(self) -> float | None:
        """When the oldest held event was admitted."""
        return min((lane.since for lane in self._lanes.values()), default=None)

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

    def mark(self, partitions: Iterable[Partition]) -> dict[Partition, Kept[E]]:
        """The hold of ``partitions`` as it is now, for :meth:`rollback` if applying what comes back fails."""
        kept = {}
        for p in partitions:
            lane = self._lanes.get(p)
            kept[p] = Kept(lane, len(lane.items) if lane else 0, self._read_to.get(p))
        return kept

    def rollback(self, kept: Mapping[Partition, Kept[E]]) -> None:
        """Put the partitions back as :meth:`mark` saw them (their items were not applied: the caller reads the
        records it handed over again, and gets the held ones back later)."""
        for partition, was in kept.items():
            self._lanes.pop(partition, None)
            self._read_to.pop(partition, None)
            if was.read_to is not None:
                self._read_to[partition] = was.read_to
            lane = was.lane
            if lane is not None:
                for item in lane.items[was.length :]:  # appended since: taken off again
                    _forget_one(lane.per_occurrence, self._occurrence(item))
                del lane.items[was.length :]
                self._lanes[partition] = lane
        self._count = sum(len(lane.items) for lane in self._lanes.values())

    def admit(self, partition: Partition, items: Sequence[E], now: float) -> list[E]:
        """The events of ``items`` (read in order after those held of ``partition``) to apply now; the rest is
        held. An event of an occurrence with events held waits behind them, whatever else holds; otherwise a
        start goes ahead, and any other event is held while :meth:`holding`. Held events come back through
        :meth:`release` rounds, a bounded share each, never all at once in one reader's unit, which would keep
        the next starts waiting behind it. Items at an offset already admitted are a re-read (a rewind, a
        partition assigned again): held items from that offset on are dropped first, as they come again."""
        if not items:
            return []
        first = self._offset(items[0])
        if first < self._read_to.get(partition, first):
            self._drop_from(partition, first)
        self._read_to[partition] = self._offset(items[-1]) + 1
        lane = self._lanes.get(partition)
        waiting = lane.per_occurrence if lane is not None else Counter()
        starts = sum(1 for item in items if self._is_start(item) and self._occurrence(item) not in waiting)
        if starts:
            self._starts.append((now, starts))
        holding = self.holding(now, len(items) - starts)
        ahead: list[E] = []
        out: list[E] = []
        held: list[E] = []
        applied: set[Hashable] = set()  # occurrences with an event in `out`: a later start of theirs follows it
        for item in items:
            occurrence = self._occurrence(item)
            if occurrence in waiting:
                held.append(item)
                waiting[occurrence] += 1
            elif self._is_start(item) and occurrence not in applied:
                ahead.append(item)
            elif holding:
                held.append(item)
                waiting[occurrence] += 1
            else:
                out.append(item)
                applied.add(occurrence)
        if held:
            if lane is None:
                lane = self._lanes[partition] = _Lane([], waiting, now)
            lane.items += held
            self._count += len(held)
        return ahead + out

    def release(self, now: float, idle: bool = False) -> dict[Partition, list[E]]:
        """Held events to apply now, when no longer holding: up to ``release`` of them (``IDLE_ROUNDS`` times
        as many when the last poll read nothing: no start is waiting), shared evenly by the holding partitions
        (they are applied side by side, one lane each), each partition's from its first, what a partition
        leaves of its share going to the longest-held ones. Empty while holding."""
        if not self._lanes or self.holding(now):
            return {}
        budget = self.limits.release * (IDLE_ROUNDS if idle else 1)
        partitions = sorted(self._lanes, key=lambda p: self._lanes[p].since)[:budget]
        share = budget // len(partitions)
        take = {p: min(len(self._lanes[p].items), share) for p in partitions}
        left = budget - sum(take.values())
        for partition in partitions:  # what the others left, longest-held first
            more = min(len(self._lanes[partition].items) - take[partition], left)
            take[partition] += more
            left -= more
        out: dict[Partition, list[E]] = {}
        for partition, n in take.items():
            lane = self._lanes.pop(partition)
            out[partition] = lane.items[:n]
            self._count -= n
            if n < len(lane.items):  # a new lane: the one a mark saw stays as it was; its age goes on
                self._lanes[partition] = self._without(lane, lane.items[:n], lane.items[n:])
        return out

    def forget(self, partitions: Iterable[Partition]) -> int:
        """Drop what is held of ``partitions`` (no longer this processor's: their next owner reads them from
        the committed offset, at or below :meth:`held_from`). Returns how many events were dropped."""
        dropped = 0
        for partition in partitions:
            lane = self._lanes.pop(partition, None)
            dropped += len(lane.items) if lane else 0
            self._read_to.pop(partition, None)
        self._count -= dropped
        return dropped

    def _drop_from(self, partition: Partition, offset: int) -> None:
        lane = self._lanes.pop(partition, None)
        if lane is None:
            return
        kept = [item for item in lane.items if self._offset(item) < offset]
        self._count -= len(lane.items) - len(kept)
        if kept:
            self._lanes[partition] = self._without(lane, [i for i in lane.items if self._offset(i) >= offset], kept)

    def _without(self, lane: _Lane[E], gone: list[E], kept: list[E]) -> _Lane[E]:
        per_occurrence = Counter(lane.per_occurrence)
        for item in gone:
            _forget_one(per_occurrence, self._occurrence(item))
        return _Lane(kept, per_occurrence, lane.since)


def _forget_one(per_occurrence: Counter[Hashable], occurrence: Hashable) -> None:
    per_occurrence[occurrence] -= 1
    if per_occurrence[occurrence] <= 0:
        del per_occurrence[occurrence]

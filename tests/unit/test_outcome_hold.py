"""engine.rules.outcome_hold: outcomes held behind a stream of starts, in order, and never past a commit."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.rules.outcome_hold import IDLE_ROUNDS, HoldLimits, OutcomeHold


@dataclass(frozen=True)
class Ev:
    """One attempt event as the hold sees it: its record's offset, its place in the record, its occurrence."""

    partition: int
    offset: int
    index: int
    occurrence: int
    start: bool


def new_hold(limits: HoldLimits) -> OutcomeHold[Ev]:
    return OutcomeHold(limits, lambda e: e.start, lambda e: e.occurrence, lambda e: e.offset)


def log_of(partition: int, records: list[list[tuple[int, bool]]]) -> list[list[Ev]]:
    """A partition's records, each a list of (occurrence, is start) events (an occurrence's events are all on
    one partition: its key's)."""
    return [
        [Ev(partition, offset, i, partition * 100 + occ, start) for i, (occ, start) in enumerate(events)]
        for offset, events in enumerate(records)
    ]


# A partition's log: records of one to four events about a few occurrences (so they repeat and interleave).
records = st.lists(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=4), max_size=12)
partition_logs = st.lists(records, min_size=1, max_size=3)
limits = st.builds(
    HoldLimits,
    starts=st.integers(0, 3),
    window=st.sampled_from([0.5, 1.0, 5.0]),
    max_age=st.sampled_from([0.0, 2.0, 60.0]),
    max_events=st.integers(0, 30),
    release=st.integers(1, 8),
)
# Each step: read up to n records of a partition at +dt seconds; a read may fail (rolled back) or the process
# may crash (a fresh hold reads again from the committed offsets); or a release round.
steps = st.lists(
    st.tuples(
        st.sampled_from(["read", "read", "read", "release", "idle", "release fails", "fail", "crash"]),
        st.integers(0, 2),
        st.integers(1, 4),
        st.sampled_from([0.0, 0.3, 1.5, 70.0]),
    ),
    max_size=40,
)


def pending_order(applied: list[Ev]) -> dict[int, list[tuple[int, int]]]:
    by_occurrence: dict[int, list[tuple[int, int]]] = {}
    for e in applied:
        by_occurrence.setdefault(e.occurrence, []).append((e.offset, e.index))
    return by_occurrence


class Consumer:
    """A processor's use of the hold over partitions' logs: reads, failed applies, release rounds, crashes, with
    a model of what the hold should keep (``waiting``) and the offsets it commits."""

    def __init__(self, logs: list, limit: HoldLimits) -> None:
        self.parts = {p: log_of(p, recs) for p, recs in enumerate(logs)}
        self.limit = limit
        self.committed = {p: 0 for p in self.parts}
        self.ever: set[Ev] = set()
        self.crash()

    def crash(self) -> None:
        """A fresh process: nothing held, reading again from the committed offsets."""
        self.hold = new_hold(self.limit)
        self.position = dict(self.committed)
        self.waiting: dict[int, list[Ev]] = {p: [] for p in self.parts}
        self.applied: list[Ev] = []

    def commit(self, p: int) -> None:
        read_to, held = self.hold.read_to(p), self.hold.held_from(p)
        if read_to is not None:
            self.committed[p] = max(self.committed[p], read_to if held is None else min(read_to, held))

    def given_back(self, p: int, events: list[Ev]) -> None:
        self.applied += events
        self.ever.update(events)
        self.waiting[p] = [e for e in self.waiting[p] if e not in events]

    def release(self, now: float, idle: bool) -> None:
        released = self.hold.release(now, idle)
        assert sum(len(events) for events in released.values()) <= self.limit.release * (IDLE_ROUNDS if idle else 1)
        for p, events in released.items():
            assert p is not None
            assert events == self.waiting[p][: len(events)]  # each partition's from its first
            self.given_back(p, events)
            self.commit(p)

    def release_fails(self, now: float) -> None:
        """A release round whose transaction failed: the hold is put back as it was before the round."""
        kept = self.hold.mark(self.hold.partitions())
        before = [(q, self.hold.held_from(q), self.hold.read_to(q)) for q in self.parts]
        held_before = list(self.hold.items())
        self.hold.release(now)
        self.hold.rollback(kept)
        assert [(q, self.hold.held_from(q), self.hold.read_to(q)) for q in self.parts] == before
        assert list(self.hold.items()) == held_before

    def read(self, p: int, n: int, now: float, fails: bool) -> None:
        chunk = self.parts[p][self.position[p] : self.position[p] + n]
        items = [e for record in chunk for e in record]
        if not items:
            return
        if fails:  # applying what came back failed: nothing applied, the chunk is read again later
            kept = self.hold.mark([p])
            before = (self.hold.held, self.hold.held_from(p), self.hold.read_to(p))
            self.hold.admit(p, items, now)
            self.hold.rollback(kept)
            assert (self.hold.held, self.hold.held_from(p), self.hold.read_to(p)) == before
            return
        blocked = {e.occurrence for e in self.waiting[p]}
        self.waiting[p] = self.waiting[p] + items
        out = self.hold.admit(p, items, now)
        for e in items:  # a start waits only behind an event of its own occurrence
            assert e in out or not e.start or e.occurrence in blocked, "a start waited behind other occurrences"
            if e not in out:
                blocked.add(e.occurrence)
        self.given_back(p, out)
        self.position[p] += len(chunk)
        self.commit(p)

    def check(self) -> None:
        assert self.hold.held == sum(len(w) for w in self.waiting.values())
        for p, waiting in self.waiting.items():
            held_from = self.hold.held_from(p)
            assert held_from == (waiting[0].offset if waiting else None)
            assert held_from is None or self.committed[p] <= held_from, "committed past a held event"


@settings(max_examples=400)
@given(partition_logs, limits, steps)
def test_nothing_before_a_commit_is_unapplied_and_each_occurrence_keeps_its_order(logs, limit, plan):
    """Reads, failed applies (rolled back), release rounds and crashes in any order: every event before a
    committed offset has been applied, and between crashes each occurrence's events are applied in read order,
    each once (a read again after a failure or a crash may apply some again, never out of order)."""
    run = Consumer(logs, limit)
    now = 0.0
    for action, p, n, dt in plan:
        now += dt
        if action == "crash":
            run.crash()
        elif action in ("release", "idle"):
            run.release(now, idle=action == "idle")
        elif action == "release fails":
            run.release_fails(now)
        else:
            run.read(p % len(run.parts), n, now, fails=action == "fail")
        run.check()
    for p, log in run.parts.items():
        for record in log[: run.committed[p]]:
            assert all(e in run.ever for e in record), "an event before the committed offset was never applied"
    for occurrence, order in pending_order(run.applied).items():
        assert order == sorted(order), f"occurrence {occurrence} applied out of order: {order}"


@given(partition_logs)
def test_without_limits_reached_every_event_comes_back_exactly_once_in_order(logs):
    """Starts streaming, no limit reached: admitted events come back once each, from admit or, once the
    starts stop, from release rounds; each occurrence's in read order."""
    hold = new_hold(HoldLimits(starts=1, window=1.0, max_age=1e9, max_events=10**6, release=3))
    out: list[Ev] = []
    everything: list[Ev] = []
    for p, recs in enumerate(logs):
        items = [e for record in log_of(p, recs) for e in record]
        everything += items
        out += hold.admit(p, items, 0.0)
        assert hold.held_from(p) == (min(e.offset for e in items if e not in out) if hold.holds(p) else None)
    while hold.held:
        released = hold.release(10.0)  # starts stopped streaming
        assert released
        out += [e for events in released.values() for e in events]
    assert sorted(out, key=id) == sorted(everything, key=id) and len(out) == len(everything)
    for occurrence, order in pending_order(out).items():
        assert order == sorted(order), occurrence


def burst(partition: int, first: int, occurrences: range, start: bool) -> list[Ev]:
    return [Ev(partition, first + i, 0, occ, start) for i, occ in enumerate(occurrences)]


def test_outcomes_wait_while_starts_stream_and_come_back_when_they_stop():
    hold = new_hold(HoldLimits(starts=3, window=1.0, max_age=60.0, max_events=100, release=100))
    starts = burst(0, 0, range(5), start=True)
    assert hold.admit(0, starts, 0.0) == starts  # starts never wait
    outcomes = burst(0, 5, range(5), start=False)
    more_starts = burst(0, 10, range(5, 10), start=True)
    assert hold.admit(0, outcomes + more_starts, 0.5) == more_starts
    assert hold.held == 5 and hold.held_from(0) == 5
    assert hold.release(0.9) == {}  # still streaming
    assert hold.release(1.6) == {0: outcomes}  # no start for a window: applied, in order
    assert hold.held == 0 and hold.held_from(0) is None


def test_a_start_behind_a_held_event_of_its_occurrence_waits_with_it():
    hold = new_hold(HoldLimits(starts=1, window=1.0))
    hold.admit(0, burst(0, 0, range(3), start=True), 0.0)
    failed = Ev(0, 3, 0, 1, False)
    retried = Ev(0, 4, 0, 1, True)  # the same occurrence started again after its failure
    other = Ev(0, 5, 0, 7, True)
    assert hold.admit(0, [failed, retried, other], 0.1) == [other]
    assert hold.release(5.0) == {0: [failed, retried]}


def test_the_age_limit_ends_the_hold_even_while_starts_stream():
    hold = new_hold(HoldLimits(starts=1, window=1.0, max_age=2.0, max_events=100, release=2))
    hold.admit(0, burst(0, 0, range(3), start=False), 0.0)
    assert hold.held == 0  # no stream yet: nothing held
    hold.admit(0, burst(0, 3, range(3, 6), start=True) + burst(0, 6, range(3, 6), start=False), 0.0)
    assert hold.held == 3
    hold.admit(1, burst(1, 0, range(10, 11), start=True), 2.5)  # streaming, but the oldest waited 2.5 s
    assert hold.release(2.5) == {0: burst(0, 6, range(3, 5), start=False)}  # `release` per round, from the first
    assert hold.held_from(0) == 8


def test_the_count_limit_holds_no_more_while_what_is_held_waits():
    hold = new_hold(HoldLimits(starts=1, window=1.0, max_age=60.0, max_events=4))
    hold.admit(0, burst(0, 0, range(3), start=True) + burst(0, 3, range(3), start=False), 0.0)
    assert hold.held == 3
    out = hold.admit(1, burst(1, 0, range(10, 11), start=True) + burst(1, 1, range(10, 12), start=False), 0.5)
    assert [e.occurrence for e in out] == [10, 10, 11]  # five would be held: over the limit, these are not
    assert hold.held == 3 and not hold.holds(1)
    assert hold.release(0.5) == {}  # still streaming, and what is held stays within the limit


def test_after_the_stream_a_backlog_comes_back_in_bounded_rounds_and_its_occurrences_queue_behind_it():
    """A reader's unit must never carry a partition's whole backlog: starts read with it would wait behind it
    (measured: a hold that lapsed between two waves of a burst put tens of thousands of outcomes in front of
    the next wave's answers). Only an occurrence with events held waits; the others' events go on."""
    hold = new_hold(HoldLimits(starts=1, window=1.0, release=2))
    hold.admit(0, burst(0, 0, range(1), start=True) + burst(0, 1, range(1, 4), start=False), 0.0)
    assert hold.held == 3
    behind, other = Ev(0, 4, 0, 2, False), Ev(0, 4, 1, 9, False)  # occurrence 2 has a held event
    assert hold.admit(0, [behind, other], 5.0) == [other]  # the stream lapsed: the rest is not held
    assert [e.offset for e in hold.release(5.0)[0]] == [1, 2]
    new_start = Ev(0, 5, 0, 10, True)
    assert hold.admit(0, [new_start], 5.1) == [new_start]  # a start never waits, and it streams again
    assert hold.release(5.2) == {}
    assert hold.release(6.2)[0] == [Ev(0, 3, 0, 3, False), behind]
    assert hold.held == 0 and hold.admit(0, [Ev(0, 6, 0, 2, False)], 6.3) == [Ev(0, 6, 0, 2, False)]


def test_a_release_round_shares_its_budget_among_the_holding_partitions():
    """They are applied side by side, a lane each: one partition's backlog must not take a whole round."""
    hold = new_hold(HoldLimits(starts=1, window=1.0, release=12))
    for p, (at, outcomes) in enumerate([(0.0, 10), (0.1, 2), (0.2, 10)]):
        hold.admit(p, burst(p, 0, range(100 * p, 100 * p + 1), start=True), at)
        hold.admit(p, burst(p, 1, range(100 * p + 1, 100 * p + 1 + outcomes), start=False), at)
    assert hold.held == 22
    released = hold.release(5.0)
    assert {p: len(events) for p, events in released.items()} == {0: 6, 1: 2, 2: 4}  # 4 each, 2 left to the oldest
    assert [e.offset for e in released[0]] == list(range(1, 7))
    assert sum(len(events) for events in hold.release(5.0, idle=True).values()) == 10  # the rest: under 4 × 12


def test_a_reread_drops_what_comes_again_and_forget_drops_a_partition():
    hold = new_hold(HoldLimits(starts=1, window=10.0))
    hold.admit(0, burst(0, 0, range(2), start=True) + burst(0, 2, range(2), start=False), 0.0)
    assert hold.held_from(0) == 2 and hold.held == 2
    again = burst(0, 3, range(1, 2), start=False)  # the consumer rewound to offset 3
    assert hold.admit(0, again, 0.1) == []
    assert hold.held == 2 and [e.offset for e in hold.release(20.0)[0]] == [2, 3]
    hold.admit(1, burst(1, 0, range(5, 6), start=True), 20.0)
    hold.admit(1, burst(1, 1, range(5, 6), start=False), 20.0)
    assert hold.forget([1]) == 1 and hold.held == 0 and hold.read_to(1) is None


def test_limits_are_checked():
    with pytest.raises(ValueError, match="outcome hold"):
        HoldLimits(release=0).validate()

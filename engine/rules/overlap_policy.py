"""Overlap policies: may a schedule's next occurrence run while another one is in flight?

* ``allow`` (default): every occurrence is dispatched on time; nothing here
  touches it.
* ``skip_if_running``: an occurrence that comes due while another occurrence
  of the same schedule is in flight becomes SKIPPED_OVERLAP.
* ``queue_one``: it waits (held) until the one in flight finishes, then runs;
  at most one waits — a further one that comes due meanwhile is skipped (the
  waiting one keeps its place, like Temporal's BufferOne).

Pure: :func:`decide_overlap` decides the due deliveries of one schedule; the
overlap gate (:mod:`engine.loops.overlap_gate`) reads what is in flight and
applies the decision under the schedule's row lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

POLICIES = ("allow", "skip_if_running", "queue_one")


@dataclass(frozen=True)
class OverlapDecision:
    dispatch: tuple[int, ...] = ()
    hold: tuple[int, ...] = ()
    skip: tuple[int, ...] = ()


def decide_overlap(policy: str, in_flight: bool, due: Sequence[int]) -> OverlapDecision:
    """Decide the held, due deliveries of one schedule (``due``: outbox ids, oldest occurrence first).

    Pure. At most one delivery is dispatched per decision, and only when
    nothing is in flight; ``queue_one`` keeps at most one waiting.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown overlap policy {policy!r}")
    due = tuple(due)
    if not due:
        return OverlapDecision()
    if policy == "allow":
        return OverlapDecision(dispatch=due)
    if policy == "skip_if_running":
        if in_flight:
            return OverlapDecision(skip=due)
        return OverlapDecision(dispatch=due[:1], skip=due[1:])
    # queue_one
    if in_flight:
        return OverlapDecision(hold=due[:1], skip=due[1:])
    return OverlapDecision(dispatch=due[:1], hold=due[1:2], skip=due[2:])

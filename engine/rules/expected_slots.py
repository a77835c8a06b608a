"""Expected slots: every instant a schedule's version history says it should have fired in a window.

Pure: the versions come in as values (their time specs already built), the
window as two instants. A version is in force from its ``changed_at`` until the
next version's; the slots of a window are the fire instants of the version in
force at each instant, strictly after the version began and up to (inclusive)
the next version's start, so no instant belongs to two versions. Slots of a
paused version are listed too, flagged ``paused``: the timeline explains what
the misfire policy did with them on resume. Canceled and completed versions
expect nothing.

A ``once`` schedule may be created up to its lateness bound after its instant
(it then fires at once), so its first version also owns an instant before it
began.

The reconciler (issue 13) will compute expected occurrences independently of
the materializer; :func:`expected_slots` is the one place the console asks, so
it can be pointed at the reconciler's computation without touching the
timeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.rules.timing import TimeSpec, fire_times

MICROSECOND = timedelta(microseconds=1)
#: States of a version that expect fires (paused ones are listed, flagged).
FIRING_STATES = frozenset({"active", "paused"})


@dataclass(frozen=True)
class VersionSpan:
    """One version of a schedule: when it began and what it said."""

    version: int
    change: str  # create | update | pause | resume | cancel
    state: str  # active | paused | canceled | completed
    spec: TimeSpec
    changed_at: datetime
    max_lateness: timedelta = timedelta(minutes=1)


@dataclass(frozen=True)
class ExpectedSlot:
    scheduled_for: datetime
    version: int  # the version in force at that instant
    paused: bool  # that version was a paused one


@dataclass(frozen=True)
class ExpectedSlots:
    slots: list[ExpectedSlot]
    truncated: bool  # more slots lie in the window than ``limit``


def expected_slots(
    versions: Sequence[VersionSpan], window_from: datetime, window_to: datetime, limit: int = 2000
) -> ExpectedSlots:
    """The slots in ``[window_from, window_to]`` (oldest first, at most ``limit``) of a version history.

    ``versions`` in ascending version order. Bounded work: at most ``limit + 1``
    fire instants are computed per version.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    ordered = sorted(versions, key=lambda v: v.version)
    slots: list[ExpectedSlot] = []
    truncated = False
    for index, span in enumerate(ordered):
        if span.state not in FIRING_STATES:
            continue
        begins = span.changed_at
        if index == 0 and span.spec.kind == "once":
            begins -= span.max_lateness
        ends = ordered[index + 1].changed_at if index + 1 < len(ordered) else None
        after = max(begins, window_from - MICROSECOND)
        until = window_to if ends is None else min(ends, window_to)
        if until <= after:
            continue
        room = limit - len(slots)
        fires = fire_times(span.spec, after, room + 1, until)
        if len(fires) > room:
            truncated = True
            fires = fires[:room]
        slots.extend(ExpectedSlot(instant, span.version, span.state == "paused") for instant in fires)
        if truncated:
            break
    return ExpectedSlots(slots, truncated)

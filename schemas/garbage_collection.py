"""Garbage-collector settings for chronoq's long-running processes (engine nodes, relays, consumers).

Why: CPython runs a young-generation collection every 700 net allocations of
container objects, and a dispatch page is thousands of asyncpg Records plus
the tuples and lists built from them. During an hour-top burst the collector
ran dozens of times per page, traversing every young Record each time:
measured with py-spy on ``load_tests.dispatch_burst`` (300,000 rows, one
relay), ``gc_collect_main`` was 16.6 % of the relay's busy time, and raising
the young threshold to 50,000 cut the relay's CPU per row from 36.8 to
29.1 µs (docs/benchmarks.md). The objects of a page die together when the
page is completed (reference counting frees them, not the collector), so a
larger threshold costs a few megabytes of garbage cycles waiting longer, not
leaked memory.

Applied by the process entry points (``run_services``, ``chronoq consume``),
never on import: a library must not change an embedding application's
collector behind its back.

The start-up heap is frozen once a process is running (``freeze_start_up_heap``):
a full collection walks every tracked object, and in an engine node at the top
of a burst that was ~600,000 of them (the start-up's ~110,000 modules,
classes and clients plus the pages in flight); one such collection held a
node's event loop for 0.43 s (docs/benchmarks.md, stop 34). Objects alive at
start-up live as long as the process, so the collector has nothing to find
among them.
"""

from __future__ import annotations

import gc

#: Young-generation threshold: container allocations (net) between young collections.
YOUNG_THRESHOLD = 50_000
#: Young collections between middle-generation collections, and middle between full ones.
MIDDLE_THRESHOLD = 20
OLD_THRESHOLD = 20


def tune_for_throughput() -> tuple[int, int, int]:
    """Set the collector's thresholds for allocation-heavy batch work; returns the previous ones.

    Never lowers a threshold someone set higher (an application that relaxed
    the collector further keeps its choice), and leaves a disabled collector
    disabled: ``gc.disable()`` is untouched, and a young threshold of 0 (which
    also turns automatic collection off) is kept.
    """
    previous = gc.get_threshold()
    young, middle, old = previous
    if young == 0:
        return previous
    gc.set_threshold(max(young, YOUNG_THRESHOLD), max(middle, MIDDLE_THRESHOLD), max(old, OLD_THRESHOLD))
    return previous


def freeze_start_up_heap() -> int:
    """Collect once, then move every object tracked now into the permanent generation; returns how many.

    Later collections skip them, so a full collection in a burst walks only what the burst allocated.
    Frozen objects are still freed by reference counting; only a reference cycle among them would wait
    for ``gc.unfreeze()``, which is why this runs once, after start-up, and never per page or per request.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

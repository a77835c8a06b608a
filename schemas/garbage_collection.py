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

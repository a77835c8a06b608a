"""The collector settings of long-running processes: raised for throughput, never lowered, never re-enabled."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from schemas.garbage_collection import (
    MIDDLE_THRESHOLD,
    OLD_THRESHOLD,
    YOUNG_THRESHOLD,
    freeze_start_up_heap,
    tune_for_throughput,
)


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_the_default_thresholds_are_raised_and_the_previous_ones_returned():
    gc.set_threshold(700, 10, 10)
    assert tune_for_throughput() == (700, 10, 10)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)


def test_a_threshold_set_higher_by_the_application_is_kept():
    gc.set_threshold(200_000, 5, 100)
    tune_for_throughput()
    assert gc.get_threshold() == (200_000, MIDDLE_THRESHOLD, 100)


def test_automatic_collection_turned_off_by_a_zero_threshold_stays_off():
    gc.set_threshold(0)
    tune_for_throughput()
    assert gc.get_threshold()[0] == 0


def test_the_start_up_heap_is_frozen_and_what_comes_later_is_collected_as_before():
    gc.unfreeze()
    try:
        start_up = [[i] for i in range(1000)]  # alive at start-up: skipped by every later collection
        frozen = freeze_start_up_heap()
        # Reference counting still frees frozen objects (another thread of the test worker may drop some
        # between the two calls), so the count can only have fallen since the freeze, never risen.
        assert len(start_up) <= gc.get_freeze_count() <= frozen
        assert not any(obj is start_up for obj in gc.get_objects())  # no generation holds it any more

        class Cycle:
            pass

        later = Cycle()
        later.me = later  # type: ignore[attr-defined]
        del later
        assert gc.collect() >= 1  # garbage made after start-up is still found
    finally:
        gc.unfreeze()

"""The hour-top tool's flexible-spread figure (load_tests.hour_top_figures.flexible_spread) tells spread work from
work published at one instant, and counts any occurrence published before its available_at."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from load_tests.hour_top_figures import flexible_spread

WINDOW = 60.0


def test_enqueue_instants_evenly_over_the_window_are_near_uniform():
    n = 1000
    jitters = [WINDOW * (i + 0.5) / n for i in range(n)]
    lags = [j + 0.001 for j in jitters]  # each published 1 ms after its available_at
    spread = flexible_spread(lags, jitters, WINDOW)
    assert spread["ks_from_uniform"] < 0.01
    assert spread["share_per_tenth"] == [0.1] * 10
    assert (spread["after_window"], spread["before_available_at"]) == (0, 0)


def test_all_published_at_the_top_is_far_from_uniform_and_counted_early():
    n = 500
    jitters = [WINDOW * i / n for i in range(n)]
    lags = [0.3] * n  # the jitter ignored: everything at the top
    spread = flexible_spread(lags, jitters, WINDOW)
    assert spread["ks_from_uniform"] > 0.98
    assert spread["share_per_tenth"][0] == 1.0
    assert spread["before_available_at"] == sum(1 for j in jitters if j > 0.3)


def test_work_behind_its_window_is_counted_after_it():
    spread = flexible_spread([10.0, 70.0, 125.0], [9.0, 50.0, 59.0], WINDOW)
    assert spread["after_window"] == 2
    assert sum(spread["share_per_tenth"]) == round(1 / 3, 4)


def test_no_flexible_work_reports_only_the_count():
    assert flexible_spread([], [], WINDOW) == {"count": 0, "window_s": WINDOW}


@given(st.lists(st.tuples(st.floats(0, WINDOW, exclude_max=True), st.floats(0, 5)), min_size=1, max_size=300))
def test_the_figures_stay_in_range_and_account_for_every_occurrence(pairs):
    jitters = [j for j, _ in pairs]
    lags = [j + delay for j, delay in pairs]  # never before available_at
    spread = flexible_spread(lags, jitters, WINDOW)
    assert 0.0 <= spread["ks_from_uniform"] <= 1.0
    in_window = round(sum(spread["share_per_tenth"]) * len(pairs))
    assert in_window + spread["after_window"] == len(pairs)
    assert spread["before_available_at"] == 0


def test_lateness_is_reported_per_second_of_the_window():
    # available_at in the first second is 2 s late (queued behind a burst); later ones 10 ms; none in second 2
    jitters = [0.2, 0.7, 1.5, 3.5]
    lags = [2.2, 2.7, 1.51, 3.51]
    by_second = flexible_spread(lags, jitters, 4.0)["past_available_at_p50_by_second"]
    assert by_second == [2.0, 0.01, None, 0.01]

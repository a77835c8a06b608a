"""Which rows of a page are handed over, and when (relay/page_release.py): never a row before its own
available_at, every row once, in page order, whatever order the page holds them in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from relay.page_release import MISSED_AT_DISPATCH, Releases, first_late_after, to_release


def _rows(instants: list[int], discarded: list[bool] | None = None) -> list[dict]:
    return [
        {"available_us": at, "occurrence_id": i, "discarded": bool(discarded and discarded[i]), "late_after_us": None}
        for i, at in enumerate(instants)
    ]


@given(st.lists(st.integers(0, 50), max_size=40), st.lists(st.integers(-5, 60), max_size=20))
def test_rows_are_released_once_in_page_order_never_before_their_instant(instants: list[int], ticks: list[int]) -> None:
    rows = _rows(instants)
    releases = Releases(rows, list(range(len(rows))))
    released: list[int] = []
    now = -10
    for tick in sorted(ticks) + [60]:  # the clock only moves forward; at 60 every row is due
        now = max(now, tick)
        due = releases.due(now)
        assert due == sorted(due), "a hand-over is in page order"
        assert all(instants[i] <= now for i in due), "a row was released before its available_at"
        assert not set(due) & set(released), "a row was released twice"
        released.extend(due)
        assert releases.left() == sorted(set(range(len(rows))) - set(released)), "what is left, in page order"
        assert releases.done == (len(released) == len(rows))
    assert sorted(released) == list(range(len(rows)))
    assert releases.due(60) == [] and releases.done and releases.left() == []


def test_a_clock_that_gives_no_instant_releases_nothing() -> None:
    releases = Releases(_rows([0, 0]), [0, 1])
    assert releases.due(None) == []
    assert releases.due(0) == [0, 1]


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=30))
def test_discarded_and_skipped_rows_stay_back_and_skipped_ones_are_missed(flags: list[tuple[bool, bool]]) -> None:
    rows = _rows([0] * len(flags), [d for d, _ in flags])
    skip = frozenset(i for i, (_, s) in enumerate(flags) if s)
    outcomes: list[BaseException | None] = [None] * len(rows)
    kept = to_release(rows, skip, outcomes)
    assert kept == [i for i, (d, s) in enumerate(flags) if not d and not s]
    assert [o is MISSED_AT_DISPATCH for o in outcomes] == [i in skip for i in range(len(rows))]


def test_the_earliest_late_after_of_a_page() -> None:
    rows = _rows([0, 0, 0])
    assert first_late_after(rows) is None
    rows[1]["late_after_us"], rows[2]["late_after_us"] = 9, 4
    assert first_late_after(rows) == 4

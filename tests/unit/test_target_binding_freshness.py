"""When a refused occurrence must be re-checked against the target-binding topic (pure rule)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumers.target_bindings import needs_catch_up

instants = st.integers(min_value=0, max_value=2**48)
maybe_instants = st.none() | instants
margins = st.integers(min_value=0, max_value=10_000)


@given(st.sampled_from([True, None]), maybe_instants, maybe_instants, margins)
def test_a_yes_is_never_rechecked(verdict, appended, fresh, margin):
    assert not needs_catch_up(verdict, appended, fresh, margin)


@given(maybe_instants, maybe_instants, margins)
def test_a_no_is_rechecked_unless_a_read_began_a_margin_after_the_record(appended, fresh, margin):
    recheck = needs_catch_up(False, appended, fresh, margin)
    if appended is None or fresh is None:
        assert recheck
    else:
        assert recheck == (fresh < appended + margin)


@given(instants, instants, margins, st.integers(min_value=0, max_value=10_000))
def test_a_later_read_never_makes_a_recheck_necessary_again(appended, fresh, margin, later):
    # Freshness only grows: once a read answers for a record, every later read does too.
    if not needs_catch_up(False, appended, fresh, margin):
        assert not needs_catch_up(False, appended, fresh + later, margin)

"""A payload's JSON is refused for a NUL in a string or key, or nesting past the limit; anything else passes."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from schemas.record_fields import json_problem

LIMIT = 2  # small, so generated values cross it often

texts = st.text(alphabet=st.sampled_from("ab\x00"), max_size=3)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=12,
)


def storable(value: Any, depth: int = 0) -> bool:
    """The rule, written plainly."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, list):
        return depth < LIMIT and all(storable(child, depth + 1) for child in value)
    if isinstance(value, dict):
        return depth < LIMIT and all("\x00" not in key and storable(child, depth + 1) for key, child in value.items())
    return True


@given(json_values)
def test_a_value_is_refused_exactly_when_the_rule_says_so_and_the_reason_says_where(value):
    problem = json_problem(value, max_depth=LIMIT)
    assert (problem is None) == storable(value)
    if problem is not None:
        assert "NUL character" in problem or f"deeper than {LIMIT} levels" in problem


def test_the_reason_names_the_place():
    assert json_problem({"a": [1, "x\x00"]}) == "contains a NUL character at ['a'][1]"
    assert json_problem({"a": {"b\x00": 1}}) == "contains a NUL character in the key ['a']['b\\x00']"
    assert json_problem([[[1]]], max_depth=LIMIT) == f"nests deeper than {LIMIT} levels at [0][0]"

"""schemas.exact_json: JSON read at chronoq's edges either keeps every number or is refused, naming where."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.errors import InvalidInput
from schemas.exact_json import LARGEST, SMALLEST, InexactNumber, check_exact, field_json, loads_exact

exact_ints = st.integers(min_value=SMALLEST, max_value=LARGEST)
wide_ints = st.one_of(st.integers(max_value=SMALLEST - 1), st.integers(min_value=LARGEST + 1))
scalars = st.one_of(
    st.none(), st.booleans(), exact_ints, st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30)
)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(documents)
def test_a_document_whose_integers_fit_64_bits_reads_as_orjson_reads_it(document):
    raw = json.dumps(document).encode()
    assert loads_exact(raw) == orjson.loads(raw) == document


@given(documents, wide_ints, st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=3))
def test_an_integer_beyond_64_bits_anywhere_is_refused_with_its_place(document, number, keys):
    nested: object = {"n": number}
    for key in keys:
        nested = {key: [document, nested]}
    raw = json.dumps(nested)
    with pytest.raises(InexactNumber) as caught:
        loads_exact(raw)
    error = caught.value
    assert error.top == keys[-1]
    assert error.path.startswith(f"[{keys[-1][:30]!r}][1]") and error.path.endswith("['n']")
    assert str(number)[:37] in str(error) and "64 bits" in str(error)
    # the case the check exists for: orjson reads such a literal as a float (a rounded one, mostly)
    assert isinstance(orjson.loads(json.dumps(number)), float)


def test_the_edges_of_64_bits_are_kept_and_one_past_them_refused():
    edges = {"min": SMALLEST, "max": LARGEST, "digits": "1234567890123456789012345", "float": 1.2345678901234568e29}
    assert loads_exact(json.dumps(edges)) == edges
    for number in (SMALLEST - 1, LARGEST + 1):
        with pytest.raises(InexactNumber):
            loads_exact(json.dumps([number]))


def test_text_that_is_not_json_is_orjsons_error_not_a_number_error():
    with pytest.raises(orjson.JSONDecodeError):
        loads_exact(b'{"n": 123456789012345678901234567890')
    check_exact(b"12345678901234567890123456789 not json")  # the caller's parse is the one that refuses it
    check_exact("[" * 5000 + "123456789012345678901234567890" + "]" * 5000)  # past the standard parser's depth


def test_a_field_given_as_text_names_the_field():
    assert field_json('{"order": 7}', "payload") == {"order": 7}
    with pytest.raises(InvalidInput) as caught:
        field_json('{"order": 123456789012345678901234567890}', "payload", '{"order": "1"}')
    assert caught.value.field == "payload" and "['order']" in str(caught.value)
    with pytest.raises(InvalidInput) as caught:
        field_json("{", "line")
    assert caught.value.field == "line" and "not valid JSON" in str(caught.value)

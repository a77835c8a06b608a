"""Wire instants are read the same with the reader's memo as without it (schemas/record_fields.py
``parse_instant``): the same value for the same text, the same refusal, and a refusal always names the field
being read, never the field a cached text was first refused for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.errors import MalformedMessage
from schemas.record_fields import INSTANT_MAX, INSTANT_MIN, parse_instant


def reference(raw: str) -> datetime | None:
    """The rule, without a memo: ISO-8601 with an offset (or Z), converted to UTC, within range; else None."""
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        return None
    try:
        value = parsed.astimezone(UTC)
    except OverflowError:
        return None
    return value if INSTANT_MIN <= value <= INSTANT_MAX else None


offsets = st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59))
instants_text = st.builds(
    lambda instant, offset, zulu: (
        instant.replace(tzinfo=UTC).astimezone(timezone(offset)).isoformat()
        if not zulu
        else instant.replace(tzinfo=None).isoformat() + "Z"
    ),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    offsets,
    st.booleans(),
)
texts = st.one_of(
    instants_text,
    st.datetimes().map(lambda d: d.isoformat()),  # naive: refused
    st.text(max_size=40),
    st.sampled_from(["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "1799-12-31T23:59:59Z", "Z", ""]),
)


@given(texts)
def test_the_reader_agrees_with_the_rule_on_any_text_read_twice(raw):
    expected = reference(raw)
    for _ in range(2):  # the second read comes from the memo
        if expected is None:
            with pytest.raises(MalformedMessage):
                parse_instant(raw, "scheduled_for")
        else:
            value = parse_instant(raw, "scheduled_for")
            assert value == expected and value.tzinfo is UTC


@pytest.mark.parametrize("raw", ["not a time", "2026-12-07T10:00:00", "0001-01-01T00:00:00+01:00", "1700-01-01Z"])
def test_a_remembered_refusal_names_the_field_now_read(raw):
    with pytest.raises(MalformedMessage) as first:
        parse_instant(raw, "scheduled_for")
    with pytest.raises(MalformedMessage) as second:
        parse_instant(raw, "available_at")
    assert first.value.field == "scheduled_for" and "'scheduled_for'" in str(first.value)
    assert second.value.field == "available_at" and "'available_at'" in str(second.value)
    assert "scheduled_for" not in str(second.value)
    assert repr(raw[:60]) in str(second.value)


def test_text_that_is_not_a_string_or_too_long_is_refused_before_the_memo():
    for raw in (12, None, ["2026-12-07T10:00:00Z"], "2026-12-07T10:00:00Z" + " " * 100):
        with pytest.raises(MalformedMessage) as refused:
            parse_instant(raw, "deadline")
        assert refused.value.field == "deadline"

"""Buckets, seals and the ahead/late decision agree: nothing can be written before a committed seal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.dispatch_lanes import (
    BUCKET,
    START_KEY,
    CursorKey,
    bucket_of,
    bucket_of_micros,
    goes_ahead,
    instant_of_micros,
    lane_of,
    micros_of,
    seal_boundary,
)

instants = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))
read_aheads = st.timedeltas(min_value=timedelta(0), max_value=timedelta(seconds=10))


@given(instants)
def test_a_bucket_starts_at_or_before_its_instant_and_within_one_second(instant):
    bucket = bucket_of(instant)
    assert bucket <= instant < bucket + BUCKET
    assert bucket.microsecond == 0 and bucket_of(bucket) == bucket


@given(st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)))
def test_a_bucket_in_microseconds_is_the_bucket_of_the_instant(instant):
    # the materializer stages buckets as epoch microseconds; before 1970 too, the floor, not the truncation
    assert bucket_of_micros(micros_of(instant)) == micros_of(bucket_of(instant))


@given(instants, read_aheads)
def test_a_seal_is_a_bucket_boundary_no_later_than_read_ahead(now, read_ahead):
    seal = seal_boundary(now, read_ahead)
    assert bucket_of(seal) == seal
    assert now + read_ahead - BUCKET < seal <= now + read_ahead


@given(instants, instants)
def test_rows_before_the_seal_never_go_ahead_and_rows_after_it_always_do(available_at, sealed):
    seal = bucket_of(sealed)
    assert goes_ahead(available_at, seal) == (available_at >= seal)


@given(instants, read_aheads, instants)
def test_a_row_that_goes_ahead_is_never_released_by_the_seal_that_judged_it(now, read_ahead, available_at):
    """The relay reads buckets before the seal; a row judged ahead of that seal is in a later read."""
    seal = seal_boundary(now, read_ahead)
    if goes_ahead(available_at, seal):
        assert not bucket_of(available_at) < seal


def test_lanes_and_keys():
    assert lane_of("strict") == "strict" and lane_of("flexible") == "flexible"
    with pytest.raises(ValueError):
        lane_of("urgent")
    with pytest.raises(ValueError):
        bucket_of(datetime(2027, 1, 1))
    later = CursorKey(datetime(2027, 1, 1, tzinfo=UTC), 0, START_KEY.occurrence_id)
    assert START_KEY < later


@given(instants, instants)
def test_epoch_microseconds_are_exact_and_keep_the_order_of_instants(a, b):
    """The relay compares rows' release instants as microseconds (the page read's ``*_us`` columns): the
    conversion must lose nothing and never reorder two instants, or a row could leave before its time."""
    assert instant_of_micros(micros_of(a)) == a
    assert (micros_of(a) <= micros_of(b)) == (a <= b)


def test_epoch_microseconds_of_a_zone_aware_instant_are_its_utc_ones():
    paris = datetime(2026, 3, 29, 3, 30, tzinfo=timezone(timedelta(hours=2)))
    assert micros_of(paris) == micros_of(paris.astimezone(UTC)) == 1_774_747_800_000_000

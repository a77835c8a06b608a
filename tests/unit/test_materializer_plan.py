"""The materializer's per-occurrence shortcuts equal the definitions they stand for, and the deployed
engine's horizon flag is validated.

The materializer builds occurrence ids from a precomputed uuid5 prefix with the version bits set by hand
(engine/loops/occurrence_rows.py ``OccurrenceIds``); ``schemas.identity.occurrence_id`` is the definition
every other component (API, reconciler, consumers' dedupe) uses. They must never differ.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.cli.stack_commands import DEFAULT_HORIZON, MAX_HORIZON, materializer_config
from engine.loops.materializer import MaterializerConfig
from engine.loops.occurrence_rows import OccurrenceIds
from schemas.errors import InvalidInput
from schemas.identity import micros_text, occurrence_id

instants = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))


@given(st.uuids(), st.integers(min_value=1, max_value=2**31 - 1), instants)
def test_the_materializers_occurrence_ids_are_the_identity_definition(schedule_id, version, instant):
    fast = OccurrenceIds(schedule_id, version).of(micros_text(instant))
    expected = occurrence_id(schedule_id, version, instant)
    assert fast == expected
    assert str(fast) == str(expected) and fast.bytes == expected.bytes and hash(fast) == hash(expected)
    assert isinstance(fast, uuid.UUID) and fast.version == 5 and fast.variant == uuid.RFC_4122


def test_the_deployed_default_horizon_is_the_librarys_and_a_burst_sized_one_is_accepted():
    assert materializer_config(DEFAULT_HORIZON).horizon == MaterializerConfig().horizon
    # what docs/operations.md advises for a 500,000 burst at the ~10,000 rows/s two nodes write here
    assert materializer_config("2m").horizon == timedelta(minutes=2)
    assert materializer_config("45s").horizon == timedelta(seconds=45)
    assert materializer_config("30m").horizon == MAX_HORIZON


@pytest.mark.parametrize("bad", ["0s", "31m", "2h", "-5s", "soon", "", "1.5m"])
def test_an_unusable_horizon_is_refused_naming_the_flag(bad):
    with pytest.raises(InvalidInput) as caught:
        materializer_config(bad)
    assert caught.value.field == "horizon"
    assert "horizon" in str(caught.value)


def test_up_and_engine_take_the_horizon_flag():
    import argparse

    from engine.cli.stack_commands import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    for command in ("up", "engine"):
        assert parser.parse_args([command]).horizon == DEFAULT_HORIZON
        assert parser.parse_args([command, "--horizon", "90s"]).horizon == "90s"

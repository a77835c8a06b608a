"""The typed rows of engine/records.py match what their queries return on the real database."""

from __future__ import annotations

from dataclasses import fields

import pytest

from engine.records import (
    COHORT_FIELDS,
    Attempt,
    DeadLetter,
    DueSchedule,
    LockedOccurrence,
    Occurrence,
    Schedule,
    ScheduleVersion,
)
from schemas.connections import connect
from schemas.queries import QUERIES


@pytest.mark.parametrize(
    "record, source",
    [
        (Schedule, "SELECT * FROM schedules"),  # whole rows: every column, no more
        (Occurrence, "SELECT * FROM occurrences"),
        (Attempt, "SELECT * FROM attempts"),
        (ScheduleVersion, "SELECT * FROM schedule_versions"),
        (DueSchedule, QUERIES.due_schedules_of_shards.sql),  # query rows: exactly the query's columns
        (LockedOccurrence, QUERIES.lock_occurrence.sql),
        (DeadLetter, QUERIES.list_dead_letters.sql),
    ],
    ids=lambda value: getattr(value, "__name__", "query"),
)
async def test_a_record_declares_exactly_the_columns_its_query_returns(engine_db, record, source):
    conn = await connect(engine_db)
    try:
        columns = [attribute.name for attribute in (await conn.prepare(source)).get_attributes()]
    finally:
        await conn.close()
    assert sorted(item.name for item in fields(record)) == sorted(columns)


async def test_a_cohort_member_is_its_row_and_its_cohorts_shared_fields(engine_db):
    conn = await connect(engine_db)
    try:
        member = [a.name for a in (await conn.prepare(QUERIES.cohort_members.sql)).get_attributes()]
        cohort = [a.name for a in (await conn.prepare(QUERIES.lock_due_cohorts.sql)).get_attributes()]
    finally:
        await conn.close()
    assert set(COHORT_FIELDS) <= set(cohort)
    # a member row names its cohort by position in the pass's cohort ids (cohort_n), not a record field
    assert "cohort_n" in member
    assert sorted({*member, *COHORT_FIELDS} - {"cohort_n"}) == sorted(item.name for item in fields(DueSchedule))

"""The typed rows of engine/records.py match what their queries return on the real database."""

from __future__ import annotations

from dataclasses import fields

import pytest

from engine.records import (
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

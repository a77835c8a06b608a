"""The materializer-statement experiment (load_tests/materialize_parts.py) at a tiny scale: every variant
writes exactly the rows it claims to, so its figures are the cost of that part and no other."""

from __future__ import annotations

import asyncpg

from load_tests.materialize_parts import VARIANTS, measure


async def test_each_variant_writes_only_its_part(engine_db):
    figures = await measure(engine_db, background=2_000, batch=200, rounds=1, quiet=True)
    assert set(figures) == set(VARIANTS)
    for variant, part in figures.items():
        assert part["rows"] == 200, variant
        assert part["statement_us_per_row"] > 0 and part["wal_bytes_per_row"] > 0, (variant, part)
    conn = await asyncpg.connect(engine_db)
    try:
        occurrences = await conn.fetchval("SELECT count(*) FROM occurrences")
        queued = await conn.fetchval("SELECT count(*) FROM dispatch_queue")
        advanced = await conn.fetchval("SELECT count(*) FROM schedules WHERE runs = 1")
        narrow = await conn.fetchval(
            "SELECT count(*) FROM schedule_cursors c JOIN schedules s USING (schedule_id)"
            " WHERE c.next_run_at <> s.next_run_at"
        )
    finally:
        await conn.close()
    # occurrences: the three as_built, narrow_cursor, no_cursor; ahead-lane rows: those and ahead_only
    assert (occurrences, queued) == (1000, 1200)
    # the wide row's cursor moved for the three as_built and cursor_only (800), the narrow copy's alone for
    # narrow_cursor (200): the two disagree on 1,000 schedules
    assert (advanced, narrow) == (800, 800 + 200)

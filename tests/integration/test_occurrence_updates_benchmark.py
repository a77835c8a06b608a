"""The occurrence-UPDATE experiment (load_tests/occurrence_updates.py) at a tiny scale: it updates every row
twice on each layout, and only the layout without the state-referencing indexes gets HOT updates."""

from __future__ import annotations

import asyncpg

from load_tests.occurrence_updates import measure


async def test_the_update_experiment_measures_both_layouts(engine_db, consumer_db):
    indexed = await measure(engine_db, "indexed", rows=1000, batch=250)
    hot = await measure(consumer_db, "hot50", rows=1000, batch=250)
    for figures in (indexed, hot):
        for step in ("started", "succeeded"):
            assert figures[step]["us_per_row"] > 0 and figures[step]["wal_bytes_per_row"] > 0
    assert indexed["hot_share"] == 0.0, "state is in partial-index predicates: no update can be HOT"
    # At fillfactor 50 the first update of a row finds room on its page; the second needs the first's dead
    # version pruned, which a snapshot held elsewhere in the cluster (a parallel test) can defer: at least
    # the first update is HOT (0.95 of both alone, 0.5 seen with the suite running beside it).
    assert hot["hot_share"] >= 0.4, hot
    conn = await asyncpg.connect(consumer_db)
    try:
        states = await conn.fetch("SELECT state, count(*) AS n FROM occurrences GROUP BY state")
        indexes = {r["indexname"] for r in await conn.fetch("SELECT indexname FROM pg_indexes")}
    finally:
        await conn.close()
    assert [(r["state"], r["n"]) for r in states] == [("SUCCEEDED", 1000)]
    assert "occurrences_open" not in indexes and "occurrences_slot" in indexes

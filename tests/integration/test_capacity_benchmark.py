"""The capacity benchmark (load_tests/capacity.py) at a tiny scale: its fill, measurements and retention run
hold together, and the hot queries use their indexes whatever the history behind them."""

from __future__ import annotations

import asyncpg

from load_tests.capacity import run_capacity

PER_DAY, DAYS, KEEP = 3000, 3, 2


async def test_the_capacity_benchmark_measures_fills_and_prunes(engine_db):
    figures = await run_capacity(
        engine_db,
        schedules=500,
        per_day=PER_DAY,
        days=DAYS,
        keep_days=KEEP,
        measure_at=(1,),
        lifecycle_sample=1000,
        log=lambda *_: None,
    )
    first, last = figures["measured"]["1x"], figures["measured"][f"{DAYS}x"]
    assert first["sizes"]["public.occurrences"]["rows"] == PER_DAY
    assert last["sizes"]["public.occurrences"]["rows"] == DAYS * PER_DAY
    for table in ("public.occurrences", "public.attempts", "public.outbox", "public.schedules"):
        per_row = last["sizes"][table]["bytes_per_row"]
        assert per_row is not None and 100 < per_row < 5000, (table, per_row)
    # The oldest day, less its DEAD occurrences (1 %, kept for replay), went; nothing else did.
    retention = figures["retention"]
    assert retention["archived_occurrences"] == retention["would_archive"] == PER_DAY - PER_DAY // 100
    after = retention["after"]["sizes"]
    assert after["archive.occurrences"]["rows"] == retention["archived_occurrences"]
    assert after["public.occurrences"]["rows"] == DAYS * PER_DAY - retention["archived_occurrences"]
    assert figures["lifecycle_wal"]["total_bytes_per_occurrence"] > 0
    # Point queries of the hot paths go through an index, never a scan of a day that holds rows (empty days,
    # the future ones, and the near-empty DEFAULT partition may be scanned: the planner's choice for an empty
    # table). (The reaper's is not among them here: at this tiny scale a day partition is ~40 pages and the
    # planner rightly scans the few that may hold leases; at scale it reads each day's partial index.)
    conn = await asyncpg.connect(engine_db)
    try:
        filled = {
            f"public.{r[0]}"
            for r in await conn.fetch(
                "SELECT relname FROM pg_class WHERE relname ~ '^occurrences_p' AND reltuples > 100"
            )
        }
    finally:
        await conn.close()
    # (At 1x the older days were still empty: their scans are the empty-table case; checked at 3x and after.)
    for measured in (last["hot_queries"], retention["after"]["hot_queries"]):
        for name in ("attempt_lock_occurrence", "get_occurrence", "listing_schedule_occurrences"):
            scans = [n for n in measured[name]["plan"] if n.startswith("Seq Scan") and n.split()[-1] in filled]
            assert not scans, (name, measured[name]["plan"])
        # With the events' scheduled_for the attempt lock reads one day's partition (migration 0016), whatever
        # the days behind it; by id alone it probes each day's key.
        for name in (
            "attempt_lock_occurrences_of_days",
            "attempt_answer_leases_of_days",
            "outcome_wait_for_retry",
            "outcome_finish_occurrence",
        ):
            days_read = {n.split()[-1] for n in measured[name]["plan"] if "occurrences_" in n}
            assert len(days_read) == 1, (name, measured[name]["plan"])
        attempt_days = {n.split()[-1] for n in measured["outcome_finish_attempt"]["plan"] if "attempts_" in n}
        assert len(attempt_days) == 1, measured["outcome_finish_attempt"]["plan"]
    # The oldest day left whole, as a partition (no per-row moves): the days are partitions from the start.
    assert [d["day"] for d in retention["days_moved_whole"]] != []
    assert sum(d["occurrences"] for d in retention["days_moved_whole"]) == retention["archived_occurrences"]

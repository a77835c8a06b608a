"""The capacity benchmark (load_tests/capacity.py) at a tiny scale: its fill, measurements and retention run
hold together, and the hot queries use their indexes whatever the history behind them."""

from __future__ import annotations

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
    # Point queries of the hot paths go through an index, never a scan of the hot occurrences heap (the archive,
    # empty at first, may be scanned: the planner's choice for an empty table).
    for measured in (first["hot_queries"], last["hot_queries"], retention["after"]["hot_queries"]):
        for name in (
            "reaper_expired_leases",
            "attempt_lock_occurrence",
            "get_occurrence",
            "listing_schedule_occurrences",
        ):
            assert "Seq Scan public.occurrences" not in measured[name]["plan"], (name, measured[name]["plan"])

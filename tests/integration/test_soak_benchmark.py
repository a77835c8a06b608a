"""The soak benchmark (load_tests/soak.py) in half a minute: engine nodes dispatch a steady rate while it
samples the hand-off tables, and its figures hold together (the 30-minute run is docs/benchmarks.md's)."""

from __future__ import annotations

import pytest

from load_tests.soak import HANDOFF_TABLES, run_soak


@pytest.mark.on_broker("tansu")  # the nodes' dispatch is the subject, not the broker
async def test_the_soak_dispatches_steadily_and_reports_every_table(engine_db, kafka_bootstrap, tmp_path):
    result = await run_soak(
        engine_db,
        kafka_bootstrap,
        minutes=0.5,
        schedules=300,
        every="5s",
        relays=1,
        sample_every=5.0,
        log_dir=tmp_path,
        flexible_fraction=0.5,
        flexible_window=4,
        log=lambda *_: None,
    )
    assert len(result["samples"]) >= 5
    # 300 schedules every 5 s is 60 occurrences/s; the steady part dispatched about that (a slow machine is
    # allowed half of it), and no due row waited long (unsettled: the settle pass defers while pages come).
    assert result["dispatched_per_s"] >= 30, result["dispatched_per_s"]
    assert result["oldest_unsettled_max_s"] < 35.0
    assert set(HANDOFF_TABLES) <= set(result["tables"])
    assert all("bounded" in result["tables"][name] for name in HANDOFF_TABLES)
    occurrences = result["tables"]["occurrences"]
    assert occurrences["live_end"] > 0  # pg_stat counts reach the partitions' sum
    assert result["schedule_lag_p99"] is not None and result["schedule_lag_p99"] < 5.0  # the strict half's
    # Every dispatched row is in some log entry, and the strict half's rows (due together) share entries.
    assert result["log_rows_per_entry"] is not None and result["log_rows_per_entry"] > 1.0

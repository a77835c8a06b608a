"""The hour-top load test's own code path at a small N: nothing missing, nothing doubled, and (with batch
consumer apps and the engine's attempt side) every occurrence applied once and SUCCEEDED (not a timing test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_a_small_hour_top_run_reaches_kafka_complete_and_without_duplicates(tmp_path):
    command = [
        sys.executable, "-m", "load_tests.hour_top", "--kind", "once", "--lead", "12", "--schedules", "2000",
        "--background", "3000", "--tenants", "20", "--relays", "2", "--no-floor", "--flexible-fraction", "0.2",
        "--flexible-window", "5", "--log-dir", str(tmp_path), "--json", str(tmp_path / "report.json"),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["count"] == 2000
    assert (summary["missing"], summary["duplicates"], summary["not_enqueued"]) == (0, 0, 0)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["materialized"]["ahead"] + report["materialized"]["late"] == 2000
    assert report["received_distinct"] == 2000
    # The 400 flexible ones are released at their own available_at over the 5 s window, none before it, and
    # their enqueued_at follows: each logged with its own acknowledgement (within 50 ms), their enqueue
    # instants are near uniform over the window (0.03-0.05 here; 0.43 when a page's rows were logged at its
    # last acknowledgement, a 1-2 s staircase; all at the top would be near 1).
    spread = report["flexible_spread"]
    assert spread["count"] == 400 and spread["before_available_at"] == 0, spread
    assert spread["ks_from_uniform"] < 0.2, spread


def test_a_small_hour_top_run_through_batch_consumer_apps_applies_every_occurrence_once(tmp_path):
    """--consumer batch: consumer apps and the engine's attempt side in the run. Its Kafka read-back is the test
    above's: once, with batch consumer apps beside them, the librdkafka read-back and no-op group on tansu saw
    1,967 of 2,000 occurrences that the consumer app had all applied (docs/benchmarks.md)."""
    command = [
        sys.executable, "-m", "load_tests.hour_top", "--kind", "once", "--lead", "12", "--schedules", "1000",
        "--background", "1000", "--tenants", "10", "--relays", "1", "--no-floor", "--no-consumer",
        "--log-dir", str(tmp_path), "--json", str(tmp_path / "report.json"),
        "--consumer", "batch", "--consumer-batch", "200",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    side = json.loads((tmp_path / "report.json").read_text())["consumer_side"]
    assert (side["applied"], side["handler_calls_recorded"], side["duplicates"]) == (1000, 1000, 0)
    assert (summary["not_enqueued"], summary["reaper_timeouts"], summary["consumer_duplicates"]) == (0, 0, 0)
    assert summary["settle_s"] is not None and summary["handler_start_p99"] is not None

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
        "--consumer", "batch", "--consumer-batch", "200",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["count"] == 2000
    assert (summary["missing"], summary["duplicates"], summary["not_enqueued"]) == (0, 0, 0)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["materialized"]["ahead"] + report["materialized"]["late"] == 2000
    assert report["received_distinct"] == 2000
    side = report["consumer_side"]
    assert (side["applied"], side["handler_calls_recorded"], side["duplicates"]) == (2000, 2000, 0)
    assert side["reaper_timeouts"] == 0
    assert summary["settle_s"] is not None and summary["handler_start_p99"] is not None

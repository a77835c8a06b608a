"""The dispatch benchmark (load_tests/dispatch_burst.py) at a small N, with its no-op consumer group: every
seeded row is published and received, and the per-role CPU figures it reports are there (not a timing test;
the figures of a real run are docs/benchmarks.md's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_a_small_dispatch_burst_publishes_every_row_and_reports_cpu_per_role():
    command = [
        sys.executable, "-m", "load_tests.dispatch_burst", "--rows", "3000", "--shards", "16", "--consumer",
        "--due-in", "8",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["published"] == 3000
    assert report["consumer_received"] == 3000
    cpu = report["cpu_us_per_row"]
    assert set(cpu) == {"relay", "consumer", "broker", "postgres", "load_test"}
    assert cpu["relay"] > 0 and cpu["postgres"] > 0
    assert sum(call["n"] for call in report["calls"].values()) > 0

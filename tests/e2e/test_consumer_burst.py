"""The consumer-burst benchmark's own code path at a small N (not a timing test): every occurrence applied
once and SUCCEEDED, no healthy attempt timed out, the stack's CPU split over every part, and PostgreSQL's
statement times read from pg_stat_statements on the embedded server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_a_small_burst_is_applied_once_and_says_where_its_cpu_went(tmp_path):
    command = [
        sys.executable, "-m", "load_tests.consumer_burst", "--occurrences", "2000", "--batch", "200",
        "--pg-statements", "5", "--json", str(tmp_path / "burst.json"),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures == json.loads((tmp_path / "burst.json").read_text())
    assert (figures["applied"], figures["handler_calls_recorded"]) == (2000, 2000)
    assert (figures["duplicates"], figures["reaper_timeouts"]) == (0, 0)
    assert figures["attempt_verdicts"] == {"accepted": 4000}  # started and succeeded, once each
    split = figures["burst_cpu_us_per_occurrence"]
    for part in ("consumer", "engine", "postgres", "broker"):
        assert split[part] > 0, split
    assert split["total"] == pytest.approx(sum(v for k, v in split.items() if k != "total"), abs=0.5)
    assert 0 < figures["cores_busy"] <= (os.cpu_count() or 2) + 0.5  # slack for the /proc readings' ticks
    statements = figures["pg_statements"]
    assert 1 <= len(statements) <= 5
    assert sum(s["share"] for s in statements) <= 1.001
    assert [s["total_ms"] for s in statements] == sorted((s["total_ms"] for s in statements), reverse=True)
    # The attempt processor's two writes of each occurrence are among the heaviest statements.
    assert any(s["statement"].startswith("UPDATE occurrences") and s["rows"] == 4000 for s in statements), statements

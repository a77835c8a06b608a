"""The operator features as an operator uses them: `chronoq up --demo` (console, /metrics), the CLI's
operator token, backfill and import, in subprocesses against real servers."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import requests

from engine.control.schedules import ControlPlane
from tests.e2e.test_cli import CHRONOQ, ROOT, cli_env, control_env, run


def _metric(text: str, name: str, labels: str = "") -> float | None:
    """The value of one sample of the Prometheus text ``text`` (the first matching ``labels``)."""
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_up_demo_serves_the_console_and_metrics_with_values_from_the_running_system(tmp_path):
    env = cli_env(CHRONOQ_HOME=str(tmp_path / "home"))
    up = subprocess.Popen(
        CHRONOQ + ["up", "--demo", "--api-port", "0"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        state_file = tmp_path / "home" / "stack.json"
        deadline = time.monotonic() + 60
        while not state_file.exists():
            assert up.poll() is None and time.monotonic() < deadline, "chronoq up did not start"
            time.sleep(0.1)
        api = orjson.loads(state_file.read_bytes())["api_url"]
        # The demo's every-10-seconds schedule fires, the demo consumer applies it and reports its attempt.
        text = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = requests.get(api + "/metrics", timeout=5).text
            if (
                (_metric(text, "chronoq_attempts_total", 'result="succeeded"') or 0) >= 1
                and (_metric(text, "chronoq_schedule_lag_seconds_count") or 0) >= 1
                and _metric(text, "chronoq_queue_age_seconds") is not None
            ):
                break
            time.sleep(0.5)
        assert (_metric(text, "chronoq_attempts_total", 'result="succeeded"') or 0) >= 1, text
        assert (_metric(text, "chronoq_schedule_lag_seconds_count") or 0) >= 1
        assert _metric(text, "chronoq_schedule_lag_seconds_bucket", 'le="+Inf"') is not None
        for gauge in ("chronoq_due_backlog", "chronoq_outbox_backlog", "chronoq_queue_age_seconds", "chronoq_dlq_size"):
            assert _metric(text, gauge) is not None, gauge
        assert (_metric(text, "chronoq_occurrences_materialized_total") or 0) >= 1
        # The console: an operator signs in and sees the demo tenant's schedules firing.
        token = orjson.loads(run(["operator", "token", "ops", "--json"], env).stdout)["operator_token"]
        assert token.startswith("cqop_")
        browser = requests.Session()
        assert browser.post(api + "/ui/login", data={"token": token}, timeout=5).status_code == 200
        listing = browser.get(api + "/ui/schedules?q=demo", timeout=5).text
        assert "demo.heartbeat" in listing and "demo.minutely" in listing
        found = re.search(
            r'data-schedule-id="([0-9a-f-]+)"><td><a[^>]*>[^<]*</a></td><td>demo</td><td>demo.heartbeat', listing
        )
        assert found is not None
        sid = found.group(1)
        deadline = time.monotonic() + 40
        page = ""
        while time.monotonic() < deadline and 'data-verdict="SUCCEEDED"' not in page:
            page = browser.get(f"{api}/ui/schedules/{sid}", timeout=5).text
            time.sleep(0.5)
        assert "succeeded after 1 attempt" in page, re.findall(r'data-verdict="(\w+)"', page)
        health = browser.get(api + "/ui/health", timeout=5).text
        assert 'id="lag-p99"' in health and "<svg" in health
    finally:
        up.send_signal(signal.SIGTERM)
        output, _ = up.communicate(timeout=60)
    assert up.returncode == 0, output
    assert "console:" in output and "/ui" in output


async def test_the_cli_backfills_an_hour_twice_and_imports_idempotently(engine_db, pool, acme, tmp_path):
    env = control_env(engine_db)
    control = ControlPlane(pool)
    schedule = await control.create_schedule(
        "acme", {"kind": "cron", "expression": "* * * * *", "target": "cli.backfill"}
    )
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    window = ["--from", (now - timedelta(hours=2)).isoformat(), "--to", (now - timedelta(hours=1)).isoformat()]
    first = run(["schedule", "backfill", schedule["schedule_id"], "--tenant", "acme", *window, "--json"], env)
    second = run(["schedule", "backfill", schedule["schedule_id"], "--tenant", "acme", *window, "--json"], env)
    assert first.returncode == 0, first.stderr
    one, two = orjson.loads(first.stdout), orjson.loads(second.stdout)
    assert (one["slots"], one["created"], two["created"], two["refired"]) == (61, 61, 0, 0)
    requested_by = await pool.fetchval(
        "SELECT DISTINCT requested_by FROM occurrences WHERE schedule_id = $1",
        __import__("uuid").UUID(schedule["schedule_id"]),
    )
    assert requested_by.startswith("cli:")
    timeline = run(["schedule", "timeline", schedule["schedule_id"], "--tenant", "acme", *window], env)
    assert timeline.returncode == 0 and timeline.stdout.count("backfill requested by cli:") == 61

    lines = [
        orjson.dumps(
            {
                "idempotency_key": f"imp-{i}",
                "schedule": {
                    "kind": "cron",
                    "expression": f"{i % 60} 9 * * *",
                    "target": "cli.import",
                    "payload": {"i": i},
                },
            }
        )
        for i in range(2500)
    ]
    lines.insert(7, b'{"kind": "cron", "expression": "0 0 30 2 *", "target": "cli.import"}')  # never fires
    lines.insert(9, b"{not json")
    lines.insert(
        11,
        b'{"kind": "cron", "expression": "0 9 * * *", "target": "cli.import", "payload": {"n": 1' + b"0" * 25 + b"}}",
    )
    path = tmp_path / "schedules.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    imported = run(["schedule", "import", str(path), "--tenant", "acme", "--json"], env, timeout=120)
    again = run(["schedule", "import", str(path), "--tenant", "acme", "--json"], env, timeout=120)
    assert imported.returncode == 2  # three bad lines, named by number; the rest imported
    assert "line 8:" in imported.stderr and "[field expression]" in imported.stderr and "line 10:" in imported.stderr
    assert "line 12:" in imported.stderr and "64 bits" in imported.stderr  # not imported with a rounded number
    summary, repeat = orjson.loads(imported.stdout), orjson.loads(again.stdout)
    assert (summary["lines"], summary["created"], summary["failed"]) == (2503, 2500, 3)
    assert (repeat["created"], repeat["replayed"]) == (0, 2500)
    assert await pool.fetchval("SELECT count(*) FROM schedules WHERE target = 'cli.import'") == 2500
    assert Path(path).exists()


def test_engine_serves_its_metrics_on_metrics_port(engine_db, kafka_bootstrap):
    env = cli_env(engine_db, kafka_bootstrap)
    engine = subprocess.Popen(
        [*CHRONOQ, "engine", "--metrics-port", "0"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert engine.stdout is not None
        line = engine.stdout.readline()
        assert line.startswith("metrics on http://"), line
        url = line.split(" ", 2)[2].strip()
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _metric(text, "chronoq_due_backlog") is None:
            text = requests.get(url, timeout=5).text
            time.sleep(0.2)
        # The backlog pass recorded the engine database's backlogs (empty here: zero, but recorded).
        assert _metric(text, "chronoq_due_backlog") == 0.0
        assert _metric(text, "chronoq_queue_age_seconds") == 0.0
        assert requests.post(url, timeout=5).status_code == 405
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.communicate(timeout=60)
    assert engine.returncode == 0

"""`chronoq reconcile` and `chronoq status` as an operator runs them: exit codes, JSON, bad input."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from engine.control.schedules import ControlPlane
from engine.loops.materializer import Materializer, MaterializerConfig
from tests.e2e.test_cli import cli_env, run

START = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
WINDOW = ["--from", "2026-11-29T10:00:00Z", "--to", "2026-11-29T10:30:00Z"]


@pytest.fixture
async def history(pool, acme, clock, target):
    """A minutely schedule materialized 10:01 .. 10:30 under the test clock."""
    control = ControlPlane(pool, clock)
    await control.create_schedule("acme", {"kind": "cron", "expression": "* * * * *", "target": target})
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    while clock.now() < START + timedelta(minutes=30):
        clock.advance(timedelta(seconds=20))
        await materializer.run_once()


async def test_reconcile_exits_0_when_clean_and_3_with_the_offender_listed(engine_db, pool, history):
    clean = await asyncio.to_thread(run, ["reconcile", *WINDOW, "--json"], cli_env(engine_db))
    assert clean.returncode == 0, clean.stderr
    report = orjson.loads(clean.stdout)
    assert report["clean"] and report["counts"]["expected"] == 29 and report["counts"]["missing"] == 0
    await pool.execute(
        "DELETE FROM outbox WHERE occurrence_id IN"
        " (SELECT occurrence_id FROM occurrences WHERE scheduled_for = '2026-11-29T10:07:00Z')"
    )
    await pool.execute("DELETE FROM occurrences WHERE scheduled_for = '2026-11-29T10:07:00Z'")
    broken = await asyncio.to_thread(run, ["reconcile", *WINDOW], cli_env(engine_db))
    assert broken.returncode == 3, broken.stderr
    assert "missing           lost" in broken.stdout and "2026-11-29T10:07:00Z" in broken.stdout
    assert broken.stdout.rstrip().splitlines()[-1].startswith("NOT CLEAN")
    runs = await pool.fetch("SELECT clean FROM reconcile_runs ORDER BY run_id")
    assert [r["clean"] for r in runs] == [True, False]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--from", "2026-11-29T10:00:00Z"], "to"),
        (["--from", "2026-11-29T10:30:00Z", "--to", "2026-11-29T10:00:00Z"], "to"),
        (["--from", "yesterday", "--to", "2026-11-29T10:00:00Z"], "from"),
        (["--last", "1h", "--from", "2026-11-29T10:00:00Z"], "last"),
        (["--last", "soon"], "last"),
    ],
)
async def test_reconcile_bad_input_exits_2_naming_the_flag(engine_db, args, field):
    result = await asyncio.to_thread(run, ["reconcile", *args], cli_env(engine_db))
    assert result.returncode == 2, result.stderr
    assert f": {field}: " in result.stderr.strip().splitlines()[-1]


async def test_status_prints_json_and_text(engine_db, history):
    result = await asyncio.to_thread(run, ["status", "--json"], cli_env(engine_db))
    assert result.returncode == 0, result.stderr
    status = orjson.loads(result.stdout)
    assert status["schedules"] == {"active": 1} and status["shards"]["unowned"] == 256
    assert status["consumers"] == {"note": "no broker configured"}
    text = await asyncio.to_thread(run, ["status"], cli_env(engine_db))
    assert text.returncode == 0 and "materialization lag" in text.stdout and "last reconcile: never run" in text.stdout

"""`chronoq history prune` as an operator runs it, killed mid-batch: nothing lost, nothing doubled.

The pruner is a real ``chronoq`` process; it is SIGKILLed, and later its backend terminated, while a
batch's transaction is open (its backend holds a transaction id), then run again to the end. After each
fault every occurrence and attempt is in exactly one of the hot table and the archive.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from datetime import UTC, datetime

import orjson

from engine.control.tenants import create_tenant
from tests.e2e.test_cli import CHRONOQ, ROOT, cli_env, run
from tests.support.rows import insert_schedule
from tests.support.waiting import wait_for

#: Long past the default 30-day retention on the machine's clock (the database's now() judges the CLI's run).
OLD = datetime(2025, 6, 1, tzinfo=UTC)
FINISHED, RUNNING = 3000, 40


async def seed(pool) -> set[uuid.UUID]:
    await create_tenant(pool, "acme")
    schedule_id = await insert_schedule(pool, "acme", "test.prune", OLD, kind="rate", expression="1m")
    # Test data in bulk: FINISHED succeeded occurrences a minute apart with one attempt each, RUNNING in flight.
    await pool.execute(
        "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,"
        " available_at, state, finished_at)"
        " SELECT gen_random_uuid(), $1, 1, 'acme', 'test.prune', $2::timestamptz + make_interval(mins => n),"
        "        $2::timestamptz + make_interval(mins => n),"
        "        CASE WHEN n <= $3::int THEN 'SUCCEEDED' ELSE 'RUNNING' END,"
        "        CASE WHEN n <= $3::int THEN $2::timestamptz + make_interval(mins => n, secs => 3)"
        "        END"
        " FROM generate_series(1, $3::int + $4::int) n",
        schedule_id,
        OLD,
        FINISHED,
        RUNNING,
    )
    await pool.execute(
        "INSERT INTO attempts (attempt_id, occurrence_id, attempt_number, lease_token, started_at, result,"
        "                      scheduled_for)"
        " SELECT gen_random_uuid(), occurrence_id, 1, gen_random_uuid(), scheduled_for,"
        "        CASE WHEN state = 'SUCCEEDED' THEN 'succeeded' END, scheduled_for FROM occurrences"
    )
    return {r[0] for r in await pool.fetch("SELECT occurrence_id FROM occurrences")}


async def assert_each_row_once(pool, occurrences: set[uuid.UUID]) -> int:
    """Every occurrence and attempt in exactly one of hot and archive; returns how many are archived."""
    hot = [r[0] for r in await pool.fetch("SELECT occurrence_id FROM occurrences")]
    archived = [r[0] for r in await pool.fetch("SELECT occurrence_id FROM archive.occurrences")]
    assert len(hot) + len(archived) == len(occurrences)
    assert set(hot) | set(archived) == occurrences and not set(hot) & set(archived)
    hot_attempts = [r[0] for r in await pool.fetch("SELECT occurrence_id FROM attempts")]
    archived_attempts = [r[0] for r in await pool.fetch("SELECT occurrence_id FROM archive.attempts")]
    assert sorted(hot_attempts) == sorted(hot) and sorted(archived_attempts) == sorted(archived)
    assert await pool.fetchval("SELECT count(*) FROM occurrences WHERE state = 'RUNNING'") == RUNNING
    return len(archived)


async def pruner_in_a_batch(pool) -> int:
    """The pid of the pruner's backend once it holds an open, writing transaction (mid-batch)."""

    async def writing() -> int | None:
        return await pool.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_xid IS NOT NULL LIMIT 1"
        )

    return await wait_for(writing, timeout=30, interval=0.001)


async def no_open_batch(pool) -> None:
    """Wait until no backend holds a writing transaction (a killed client's backend aborts and exits)."""

    async def gone() -> bool:
        return not await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_xid IS NOT NULL"
        )

    await wait_for(gone, timeout=30)


def start_pruner(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CHRONOQ, "history", "prune", "--batch", "10", "--progress"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_a_pruner_killed_or_cut_off_mid_batch_loses_and_doubles_nothing(engine_db, pool):
    occurrences = await seed(pool)
    env = cli_env(engine_db)
    refused = run(["history", "retention", "--keep", "5m"], env)
    assert refused.returncode == 2 and "keep" in refused.stderr, refused.stderr
    assert run(["history", "retention", "--tenant", "acme", "--keep", "90d"], env).returncode == 0
    shown = run(["history", "retention", "--json"], env)
    assert orjson.loads(shown.stdout)["tenants"] == [
        {
            "tenant_id": "acme",
            "retention_s": 90 * 86400,
            "override": True,
            "cutoff": orjson.loads(shown.stdout)["tenants"][0]["cutoff"],
        }
    ]
    assert run(["history", "retention", "--tenant", "acme", "--clear"], env).returncode == 0
    text = run(["history", "prune", "--dry-run"], env)
    assert f"would archive {FINISHED} occurrences and {FINISHED} attempts" in text.stdout, text.stdout
    assert "kept hot RUNNING 40" in text.stdout, text.stdout
    dry = run(["history", "prune", "--dry-run", "--json"], env)
    assert dry.returncode == 0, dry.stderr
    assert orjson.loads(dry.stdout)["occurrences"] == FINISHED
    assert await assert_each_row_once(pool, occurrences) == 0

    # 1. SIGKILL while a batch's transaction is open.
    pruner = start_pruner(env)
    assert pruner.stderr is not None
    first = await asyncio.to_thread(pruner.stderr.readline)
    assert first.startswith("batch committed: tenant=acme occurrences=10"), first
    await pruner_in_a_batch(pool)
    pruner.kill()
    await asyncio.to_thread(pruner.communicate, None, 30)  # reaps it and closes its pipes
    await no_open_batch(pool)
    after_kill = await assert_each_row_once(pool, occurrences)
    assert 10 <= after_kill < FINISHED and after_kill % 10 == 0  # whole batches only

    # 2. Its backend terminated while a batch's transaction is open: the process fails, the batch rolls back.
    # The batch is held at its last statement (the horizon's upsert waits for this row lock), after its moves:
    # terminated between two batches instead, the pruner would take a fresh connection and go on (as it should).
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM archive.horizons WHERE tenant_id = 'acme' FOR UPDATE")
        pruner = start_pruner(env)

        async def held_mid_batch() -> int | None:
            return await pool.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)) AND backend_xid IS NOT NULL",
                holder.get_server_pid(),
            )

        backend = await wait_for(held_mid_batch, timeout=30, interval=0.01)
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", backend)
        _, stderr = await asyncio.to_thread(pruner.communicate, None, 60)
    assert pruner.returncode != 0, stderr
    await no_open_batch(pool)
    after_cut = await assert_each_row_once(pool, occurrences)
    assert after_kill <= after_cut < FINISHED and after_cut % 10 == 0

    # 3. Run again: it finishes the rest, exactly.
    done = run(["history", "prune", "--json", "--batch", "500"], env, timeout=90)
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["occurrences"] == FINISHED - after_cut
    assert await assert_each_row_once(pool, occurrences) == FINISHED

"""Engine migration 0029: a tenant's occurrences by time are indexed only once they are finished.

``occurrences_finished_by_tenant (tenant_id, scheduled_for)`` holds SUCCEEDED, DEAD, MISSED, CANCELED and
SKIPPED_OVERLAP rows; open ones (SCHEDULED, ENQUEUED, RUNNING, RETRY_WAIT) are in ``occurrences_open``. So
the three writes of an occurrence's open life put no entry into it. These tests pin what that must not
cost: every reader of a tenant's window still sees an occurrence in every state, each part of it through
an index rather than a scan of the day's partition.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.control.health import read_health
from schemas.queries import QUERIES

T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
OPEN = ("SCHEDULED", "ENQUEUED", "RUNNING", "RETRY_WAIT")
FINISHED = ("SUCCEEDED", "DEAD", "MISSED", "CANCELED", "SKIPPED_OVERLAP")


async def _one_per_state(pool, tenant: str, at: datetime) -> None:
    """One occurrence of ``tenant`` in each state at ``at`` (enqueued once it has left SCHEDULED)."""
    await pool.execute(
        """INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
                                    available_at, state, enqueued_at)
           SELECT gen_random_uuid(), gen_random_uuid(), 1, $1, 'demo.t', $2, $2, s,
                  CASE WHEN s <> 'SCHEDULED' THEN $2::timestamptz + interval '1 second' END
           FROM unnest($3::text[]) AS s""",
        tenant, at, [*OPEN, *FINISHED],
    )  # fmt: skip


@pytest.fixture
async def window(pool, acme):
    await _one_per_state(pool, "acme", T0 - timedelta(minutes=10))
    await _one_per_state(pool, "other", T0 - timedelta(minutes=10))
    await _one_per_state(pool, "acme", T0 - timedelta(hours=3))  # outside the last hour


async def test_the_health_window_counts_a_tenants_occurrences_in_every_state(pool, window):
    health = await read_health(pool, "acme", T0, minutes=60)
    minute = T0 - timedelta(minutes=10)
    point = next(p for p in health.series if p["minute"] == minute)
    assert point["occurrences"] == len(OPEN) + len(FINISHED)
    assert point["enqueued"] == len(OPEN) + len(FINISHED) - 1  # all but the SCHEDULED one
    assert (point["succeeded"], point["dead"], point["missed"]) == (1, 1, 1)
    assert health.enqueued == len(OPEN) + len(FINISHED) - 1
    # every enqueued one a second after its instant: the window's and the minute's lag, none in an empty minute
    assert health.lag == {"p50": 1.0, "p95": 1.0, "p99": 1.0}
    assert (point["lag_p50"], point["lag_p99"]) == (1.0, 1.0)
    empty = next(p for p in health.series if p["minute"] == minute + timedelta(minutes=1))
    assert (empty["occurrences"], empty["lag_p50"], empty["lag_p99"]) == (0, None, None)
    everyone = await read_health(pool, None, T0, minutes=60)
    assert sum(p["occurrences"] for p in everyone.series) == 2 * (len(OPEN) + len(FINISHED))


async def test_the_reconcilers_copy_holds_a_tenants_occurrences_in_every_state(pool, window):
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(*QUERIES.create_run_occurrences())
        bounds = {"window_from": T0 - timedelta(hours=1), "window_to": T0}
        await conn.execute(*QUERIES.collect_occurrences(**bounds, tenant_id="acme"))
        copied = await conn.fetch("SELECT tenant_id, state FROM rc_occ")
    assert {r["tenant_id"] for r in copied} == {"acme"}
    assert sorted(r["state"] for r in copied) == sorted([*OPEN, *FINISHED])


async def test_what_the_prune_keeps_is_counted_in_every_open_state(pool, window):
    kept = await pool.fetch(*QUERIES.kept_summary(tenant_id="acme", cutoff=T0))
    # Open rows and DEAD ones stay hot; the other finished ones (no handoff left) would move.
    assert {r["state"]: r["occurrences"] for r in kept} == {state: 2 for state in (*OPEN, "DEAD")}


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda: QUERIES.health_window(tenant_id="acme", minutes=60, now=T0), id="health_window"),
        pytest.param(lambda: QUERIES.kept_summary(tenant_id="acme", cutoff=T0), id="kept_summary"),
        pytest.param(
            lambda: QUERIES.collect_occurrences(window_from=T0 - timedelta(hours=1), window_to=T0, tenant_id="acme"),
            id="collect_occurrences",
        ),
    ],
)
async def test_each_part_of_a_tenants_window_is_read_through_an_index(pool, window, read):
    """No plan may scan a day's partition for one tenant's window: finished rows through
    occurrences_finished_by_tenant, open ones through occurrences_open."""
    sql, *args = read()
    async with pool.acquire() as conn, conn.transaction():
        if "rc_occ" in sql:
            await conn.execute(*QUERIES.create_run_occurrences())
        await conn.execute("SET LOCAL enable_seqscan = off")  # tiny tables: ask which index the planner would take
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *args))
    assert "Seq Scan on occurrences" not in plan, plan
    assert "finished_by_tenant" in plan or "tenant_id_scheduled_for" in plan, plan
    assert "occurrences_open" in plan or "_schedule_id_idx" in plan, plan


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(
            lambda: QUERIES.prunable_summary(tenant_id="acme", cutoff=T0, everywhere=True, moving_days=[]),
            id="prunable_summary",
        ),
        pytest.param(
            lambda: QUERIES.lock_prunable_batch(tenant_id="acme", cutoff=T0, everywhere=True, limit=100),
            id="lock_prunable_batch",
        ),
    ],
)
async def test_the_prune_finds_a_tenants_finished_occurrences_through_the_index(pool, window, read):
    sql, *args = read()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *args))
    assert "Seq Scan on occurrences" not in plan, plan
    assert "finished_by_tenant" in plan or "tenant_id_scheduled_for" in plan, plan

"""The create-cost benchmark (load_tests/create_cost.py) at a tiny scale: it grows the tenant to each size
and times real creates and updates, so its figures are what a create costs at that size."""

from __future__ import annotations

from load_tests.create_cost import TENANT, measure


async def test_the_tenant_grows_to_each_size_and_every_call_is_timed(pool):
    rows = await measure(pool, [50, 300], creates=3)
    assert [row["live_schedules"] for row in rows] == [50, 300]
    for row in rows:
        for name in ("create", "update", "former_count"):
            assert 0 < row[name]["p50_ms"] <= row[name]["p95_ms"], (row, name)  # type: ignore[index]
    live = await pool.fetchval("SELECT count(*) FROM schedules WHERE tenant_id = $1 AND state = 'active'", TENANT)
    assert live == 300 + 3  # grown to each size counting what is there (the template, earlier creates), then 3
    updated = await pool.fetchval("SELECT count(*) FROM schedules WHERE tenant_id = $1 AND version = 2", TENANT)
    assert updated == 2 * 3

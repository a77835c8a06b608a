"""Steps the fault tests on a chaos Cluster share (tests/e2e: loop survival, database crash, clock skew): wait
for work to flow, settle and check, and require the run clean."""

from __future__ import annotations

import asyncio
from datetime import datetime

from load_tests.chaos import Cluster, Report

SUCCEEDED = "SELECT count(*) FROM occurrences WHERE state = 'SUCCEEDED'"


async def succeeded(cluster: Cluster) -> int:
    """Occurrences SUCCEEDED so far."""
    assert cluster.pool is not None
    count: int = await cluster.pool.fetchval(SUCCEEDED)
    return count


async def work_flows(cluster: Cluster, at_least: int, timeout: float = 45.0) -> None:
    """Wait until ``at_least`` occurrences have SUCCEEDED; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while await succeeded(cluster) < at_least:
        assert asyncio.get_running_loop().time() < deadline, "no work flowed before the faults"
        await asyncio.sleep(0.2)


async def settle_and_check(cluster: Cluster) -> datetime:
    """Let every occurrence due until now reach a final state, then check the run (reconcile, effects);
    returns that instant (the database's)."""
    assert cluster.pool is not None
    until: datetime = await cluster.pool.fetchval("SELECT now()")
    await cluster.settle(until)
    await cluster.check(until)
    return until


def assert_clean(report: Report) -> None:
    """No process exited on its own, every occurrence final, no effect doubled or missing, reconcile clean."""
    assert report.exits == [], [f"{e.process}: {e.log_tail[-400:]}" for e in report.exits]
    assert report.not_final == []
    assert (report.doubled_effects, report.missing_effects) == ([], [])
    assert report.reconcile_exit == 0, report.reconcile

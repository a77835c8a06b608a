"""The database crashes under working processes and comes back: nothing committed is lost, no process exits.

TESTING.md's "kill the postmaster right after a commit" at the scale of the whole stack: ``chronoq engine``,
``chronoq relay`` and a consumer app work against a PostgreSQL server of this test's own (the suite's shared
server must not go down under other tests); the test SIGKILLs the postmaster and every backend at once —
what a crashed machine leaves, minus the page cache — keeps the server down for a moment, and starts it again
on the same data directory (crash recovery replays the WAL). Every process must still be the one that
started, work must flow again, every occurrence must reach a final state, the reconciler must be clean, and
no effect may be doubled or missing.
"""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from engine.cli.embedded.postgres import EmbeddedPostgres
from engine.cli.embedded.processes import wait_for_exit
from load_tests.chaos import Cluster, Options
from tests.support.cluster_runs import assert_clean, settle_and_check, succeeded, work_flows

pytestmark = pytest.mark.slow


def crash(postgres: EmbeddedPostgres) -> None:
    """SIGKILL the postmaster and all its children at once (no shutdown checkpoint, no goodbye to clients)."""
    assert postgres.pid is not None
    postmaster = psutil.Process(postgres.pid)
    everyone = [postmaster, *postmaster.children(recursive=True)]
    for process in everyone:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for process in everyone:
        assert wait_for_exit(process.pid, 10.0), f"PostgreSQL process {process.pid} survived SIGKILL"
    postgres.pid = None


@pytest.mark.timeout(300)
@pytest.mark.on_broker("tansu")
async def test_a_crashed_database_loses_nothing_committed_and_ends_no_process(kafka_bootstrap, tmp_path):
    postgres = EmbeddedPostgres(tmp_path / "postgres", settings={"max_connections": "200"})
    postgres.start()
    try:
        options = Options(
            engines=1, relays=1, consumers=1, schedules=24, tenants=1, targets=2, stuck_after="5s", settle_s=90.0
        )
        cluster = Cluster(postgres.url("postgres"), kafka_bootstrap, tmp_path / "cluster", options)
        (tmp_path / "cluster").mkdir()
        try:
            await cluster.set_up()
            await work_flows(cluster, at_least=10)
            pids = {name: c.pid for name, c in cluster.components.items()}
            crash(postgres)
            await asyncio.sleep(3.0)  # the outage: every process meets refused connections meanwhile
            postgres.start()  # after a crash: the stale postmaster.pid names a dead process
            assert cluster.pool is not None and cluster.consumer_pool is not None
            await cluster.pool.expire_connections()  # the test's own pools held connections to the dead server
            await cluster.consumer_pool.expire_connections()
            await work_flows(cluster, at_least=await succeeded(cluster) + 10, timeout=90.0)  # work flows again
            await settle_and_check(cluster)
        finally:
            await cluster.stop()
            await cluster.drop_databases()
        assert_clean(cluster.report)
        assert {name: c.pid for name, c in cluster.components.items()} == pids
        assert all(c.starts == 1 for c in cluster.components.values())
    finally:
        postgres.stop()

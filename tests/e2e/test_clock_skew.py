"""Processes whose clocks are off by five minutes either way double nothing and starve nothing.

TESTING.md's clock-skew fault: an engine node five minutes ahead and one five minutes behind, a relay
ahead, one consumer app ahead and one behind, each under Debian's libfaketime (``time.time()`` and
``datetime.now()`` of the whole process offset, librdkafka's threads included; the monotonic clock,
meaningless across hosts, is left alone: ``load_tests.chaos.faketime_env``). Every expiry and release
instant is the database's — leases, claims, shard leases, the ahead lane's ``available_at`` (released by
the database instant plus local elapsed time) — so the run must look like an unskewed one: every
occurrence final, nothing DEAD or timed out, the reconciler clean, no effect doubled or missing, no
process exited.
"""

from __future__ import annotations

import glob
import subprocess
import sys
import time

import pytest

from load_tests.chaos import FAKETIME_LIBRARY, Cluster, Options
from tests.support.cluster_runs import assert_clean, settle_and_check, work_flows

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not glob.glob(FAKETIME_LIBRARY.replace("$LIB", "lib/*")),
        reason="needs Debian's libfaketime (apt-get install faketime)",
    ),
]

SKEW = (("engine-1", "+5m"), ("engine-2", "-5m"), ("relay-1", "+5m"), ("consumer-1", "+5m"), ("consumer-2", "-5m"))


@pytest.mark.timeout(300)
@pytest.mark.on_broker("tansu")
async def test_processes_five_minutes_ahead_and_behind_double_nothing_and_starve_nothing(
    servers, kafka_bootstrap, tmp_path
):
    options = Options(
        engines=2, relays=1, consumers=2, schedules=30, tenants=2, targets=2, stuck_after="5s", settle_s=90.0,
        clock_skew=SKEW,
    )  # fmt: skip
    cluster = Cluster(servers.admin_url, kafka_bootstrap, tmp_path, options)
    try:
        await cluster.set_up()
        for name, offset in SKEW:  # the environment really moves a process's clock (the library was found)
            env = cluster.components[name].env
            out = subprocess.run(
                [sys.executable, "-c", "import time; print(time.time())"], env=env, capture_output=True
            )
            assert abs(float(out.stdout) - time.time() - (300 if offset == "+5m" else -300)) < 30, out
        await work_flows(cluster, at_least=60, timeout=90.0)
        until = await settle_and_check(cluster)
        assert cluster.pool is not None
        states = dict(
            await cluster.pool.fetch(
                "SELECT state, count(*) FROM occurrences WHERE scheduled_for < $1 GROUP BY state", until
            )
        )
        timed_out = await cluster.pool.fetchval("SELECT count(*) FROM attempts WHERE result = 'timed_out'")
    finally:
        await cluster.stop()
        await cluster.drop_databases()
    assert_clean(cluster.report)
    assert set(states) == {"SUCCEEDED"}, states
    assert timed_out == 0

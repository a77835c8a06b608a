"""The chaos run in short (load_tests/chaos.py runs it for minutes): two engines, two relays, two consumer apps,
SIGKILL, SIGSTOP past leases and terminated backends for 25 s; then nothing lost, nothing doubled, every
occurrence final, no process exited on its own, and the reconciler clean."""

from __future__ import annotations

import pytest

from load_tests.chaos import Options, run

pytestmark = pytest.mark.slow


# Settling may wait out a relay claim stranded by a terminated connection (60 s): more than the default timeout.
@pytest.mark.timeout(240)
@pytest.mark.on_broker("apache")
async def test_a_short_chaos_run_ends_clean(servers, kafka_bootstrap, tmp_path):
    options = Options(
        minutes=25 / 60,
        engines=2,
        relays=2,
        consumers=2,
        schedules=40,
        tenants=2,
        targets=2,
        stuck_after="5s",
        settle_s=90.0,
        seed=13,
        fault_every=(0.5, 2.5),
    )
    report = await run(servers.admin_url, kafka_bootstrap, options, tmp_path)
    summary = "\n".join(report.lines())
    assert len(report.faults) >= 6, summary  # the run really injected faults
    assert report.exits == [], summary
    assert report.not_final == [], summary
    assert report.doubled_effects == [] and report.missing_effects == [], summary
    assert report.reconcile_exit == 0, summary
    assert report.reconcile["counts"]["expected"] > 0 and report.reconcile["counts"]["missing"] == 0
    assert report.figures["effects"] > 0

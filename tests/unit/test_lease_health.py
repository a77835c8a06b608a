"""hour_top reads the nodes' lease warnings from their logs, in the format the engine writes them."""

from __future__ import annotations

import logging

from engine.cli.log_format import KeyValueFormatter
from load_tests.hour_top_figures import lease_health, loop_stalls


def line(message: str, **extra: object) -> str:
    record = logging.LogRecord("chronoq.shard_leases", logging.WARNING, __file__, 1, message, (), None)
    record.__dict__.update(extra)
    return KeyValueFormatter("%(asctime)s %(levelname)s %(name)s %(message)s").format(record)


def test_losses_late_renewals_and_the_worst_gap_are_read_from_the_engine_log_format():
    late = {"action": "shard.renewal_late", "node_id": "node-0", "lease_ttl_s": 6.0}
    lines = [
        line("shard lease renewal late", **late, gap_s=3.2, connection_wait_s=0.1, statements_s=2.9),
        line("shard lease renewal late", **late, gap_s=7.5, connection_wait_s=6.8, statements_s=0.2),
        line("shards lost to another node", action="shard.lost", node_id="node-1", shards=[1, 2]),
        line("ahead page failed; retrying", action="dispatch.page_error", node_id="node-1"),
    ]
    assert lease_health(lines) == {
        "losses": 1,
        "late_renewals": 2,
        "worst_gap": {"gap_s": 7.5, "connection_wait_s": 6.8, "statements_s": 0.2},
    }
    assert lease_health([]) == {"losses": 0, "late_renewals": 0, "worst_gap": None}


def test_loop_stalls_and_the_worst_are_read_from_the_engine_log_format():
    lines = [
        line("event loop stalled", action="loop.stalled", node_id="node-0", lag_s=0.8, gc_s=0.1, gc_generation=0),
        line("event loop stalled", action="loop.stalled", node_id="node-1", lag_s=1.4, gc_s=0.9, gc_generation=1),
        line("shards lost to another node", action="shard.lost", node_id="node-1", shards=[1]),
    ]
    assert loop_stalls(lines) == {"stalls": 2, "worst": {"lag_s": 1.4, "gc_s": 0.9, "gc_generation": 1}}
    held_by_code = [line("event loop stalled", action="loop.stalled", lag_s=0.6, gc_s=0.0, gc_generation=None)]
    assert loop_stalls(held_by_code)["worst"] == {"lag_s": 0.6, "gc_s": 0.0, "gc_generation": None}
    assert loop_stalls([]) == {"stalls": 0, "worst": None}

"""An engine started before its broker accepts connections waits for it and then works (as it waits for a
database that is not accepting connections yet): compose, systemd and Kubernetes start things in any order."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from engine.control.schedules import ControlPlane
from engine.loops.dispatch_settler import SettlerConfig
from engine.loops.materializer import MaterializerConfig
from engine.loops.service import ENGINE_ROLES, DataPlaneConfig, Role, ServiceConfig, run_services
from engine.loops.shard_leases import ShardLeaseConfig
from relay.ahead_relay import AheadRelayConfig
from schemas.clock import DatabaseClock
from tests.support.tcp_gate import Gate
from tests.support.waiting import wait_for


async def test_an_engine_started_before_its_broker_accepts_connections_waits_and_then_dispatches(
    engine_db, pool, kafka_bootstrap, target, acme, caplog
):
    host, port = kafka_bootstrap.rsplit(":", 1)
    gate = Gate(f"postgresql://x@{host}:{port}/x")  # a TCP gate: only its upstream address is used
    bootstrap = urlsplit(await gate.start()).netloc.split("@")[-1]
    config = ServiceConfig(
        roles=ENGINE_ROLES | {Role.RELAY},
        materializer=MaterializerConfig(idle_interval=0.1),
        data_plane=DataPlaneConfig(
            leases=ShardLeaseConfig(interval=0.2, lease_ttl=1.0, max_moves=256),
            dispatch=AheadRelayConfig(read_ahead=timedelta(seconds=1)),
            settler=SettlerConfig(interval=0.1),
        ),
        summary_every=0,
    )
    caplog.set_level(logging.WARNING, logger="chronoq.service")
    stop = asyncio.Event()
    engine = asyncio.create_task(run_services(engine_db, bootstrap, stop, config))
    try:
        await wait_for(lambda: gate.refused >= 3 or engine.done(), timeout=20)
        assert not engine.done(), engine.exception()  # it keeps trying; it has not given up
        assert any(getattr(r, "action", None) == "kafka.connect_retry" for r in caplog.records)
        gate.open = True
        due = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
        created = await ControlPlane(pool, DatabaseClock()).create_schedule(
            "acme", {"kind": "once", "target": target, "expression": due}
        )
        published = "SELECT enqueued_at IS NOT NULL FROM occurrences WHERE schedule_id = $1"
        await wait_for(lambda: pool.fetchval(published, created["schedule_id"]), timeout=30)
        assert not engine.done()
    finally:
        stop.set()
        await asyncio.wait_for(engine, 30)
        await gate.stop()

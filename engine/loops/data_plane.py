"""One engine node's data plane: shard leases, the materializer, both relay lanes and the settle pass.

Several nodes (processes, hosts) share the shards of one database: each runs
this, leases its share of the shards (``engine.loops.shard_leases``),
materializes only those shards ahead of time into the ahead lane, and
publishes them with its own relay; the late lane (the outbox) is drained by
every node's late relay (per-row claims keep them apart). The settle pass
records ENQUEUED for published ahead-lane rows while this node's relay is
quiet.

Every connection of the data plane carries server-side limits
(``DATA_PLANE_SERVER_SETTINGS``): a paused node cannot keep a transaction or
its locks open past a few seconds.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from engine.loops.dispatch_settler import DispatchSettler, SettlerConfig
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.shard_leases import (DATA_PLANE_SERVER_SETTINGS, ShardLeaseConfig, ShardLeases,
                                       default_node_id)
from relay.ahead_lane import AheadLaneStore
from relay.ahead_relay import AheadRelay, AheadRelayConfig, AheadRelayHooks
from relay.dispatcher import Relay, RelayConfig
from relay.librdkafka_publisher import LibrdkafkaConfig, LibrdkafkaPublisher
from schemas.clock import Clock, DatabaseClock, pause
from schemas.connections import create_pool
from schemas.shard_ownership import ShardOwnership

log = logging.getLogger("chronoq.data_plane")


@dataclass(frozen=True)
class DataPlaneConfig:
    """node_id: this node's name in engine_nodes (default host:pid:random).
    leases, materializer, ahead_relay, late_relay, settler: each loop's own configuration.
    publisher: librdkafka settings other than the bootstrap (idempotent on Apache Kafka).
    run_materializer / run_ahead_relay / run_late_relay / run_settler: which loops run (leases always do).
    pool_size: connections of the node's pool (default 8).
    metrics_interval: seconds between backlog gauge readings (default 5).
    """

    node_id: str | None = None
    leases: ShardLeaseConfig = field(default_factory=ShardLeaseConfig)
    materializer: MaterializerConfig = field(default_factory=MaterializerConfig)
    ahead_relay: AheadRelayConfig = field(default_factory=AheadRelayConfig)
    late_relay: RelayConfig = field(default_factory=RelayConfig)
    settler: SettlerConfig = field(default_factory=SettlerConfig)
    idempotent_producer: bool = False
    partitions: int | None = None
    run_materializer: bool = True
    run_ahead_relay: bool = True
    run_late_relay: bool = True
    run_settler: bool = True
    pool_size: int = 8
    metrics_interval: float = 5.0
    ahead_hooks: AheadRelayHooks | None = None


async def run_data_plane(database_url: str, kafka_bootstrap: str, stop: asyncio.Event,
                         config: DataPlaneConfig | None = None, clock: Clock | None = None,
                         started: asyncio.Event | None = None) -> None:
    """Run this node's data-plane loops until ``stop``; release its shards and close everything after."""
    config = config or DataPlaneConfig()
    clock = clock or DatabaseClock()
    ownership = ShardOwnership(config.node_id or default_node_id())
    async with AsyncExitStack() as resources:
        pool = await create_pool(database_url, min_size=2, max_size=config.pool_size,
                                 server_settings={**DATA_PLANE_SERVER_SETTINGS,
                                                  "application_name": f"chronoq-node {ownership.node_id}"[:63]})
        resources.push_async_callback(pool.close)
        publisher_kwargs: dict[str, Any] = {"idempotent": config.idempotent_producer}
        if config.partitions:
            publisher_kwargs["partitions"] = config.partitions
        publisher = LibrdkafkaPublisher(LibrdkafkaConfig(kafka_bootstrap, **publisher_kwargs))
        await publisher.start()
        resources.push_async_callback(publisher.stop)
        leases = ShardLeases(pool, ownership, config.leases, clock)
        tasks: list[asyncio.Task[None]] = [asyncio.create_task(leases.run(stop), name="shard-leases")]
        relay: AheadRelay | None = None
        if config.run_materializer:
            materializer = Materializer(pool, config.materializer, clock, ownership=ownership)
            tasks.append(asyncio.create_task(materializer.run(stop), name="materializer"))
        if config.run_ahead_relay:
            relay = AheadRelay(AheadLaneStore(pool, clock, ownership.node_id), publisher, ownership,
                               config.ahead_relay, clock, hooks=config.ahead_hooks)
            tasks.append(asyncio.create_task(relay.run(stop), name="ahead-relay"))
        if config.run_late_relay:
            late = Relay.create(pool, publisher, config.late_relay, clock)  # type: ignore[arg-type]
            tasks.append(asyncio.create_task(late.run(stop), name="late-relay"))
        if config.run_settler:
            quiet = (lambda: relay.quiet) if relay is not None else None
            settler = DispatchSettler(pool, config.settler, clock, quiet=quiet)
            tasks.append(asyncio.create_task(settler.run(stop), name="settler"))
        if relay is not None:
            tasks.append(asyncio.create_task(_gauges(relay, stop, config.metrics_interval), name="gauges"))
        if started is not None:
            started.set()
        try:
            await asyncio.gather(*tasks)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _gauges(relay: AheadRelay, stop: asyncio.Event, interval: float) -> None:
    while not stop.is_set():
        try:
            await relay.record_backlog()
        except Exception as err:  # noqa: BLE001 - a gauge must never stop the node
            log.debug("backlog gauge failed", extra={"action": "gauge.error", "error": repr(err)})
        await pause(stop, interval)

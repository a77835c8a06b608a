"""An engine node in its own process (materializer on its leased shards, ahead-lane dispatch, settling, the
late-lane relay), for tests that kill (SIGKILL) or pause (SIGSTOP) it.

    python -m tests.e2e.engine_node_process --database-url URL --bootstrap HOST:PORT --node-id N \
        [--pause-at after_lock|after_read|after_publish] [--lease-ttl S]

At every handoff it prints ``AT <point>`` on stdout; at the ``--pause-at`` point (the first time only) it
then waits for a line on stdin before going on, so a test can kill or stop it exactly there. It runs on the
database's clock, like production.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta

from engine.loops.dispatch_settler import SettlerConfig
from engine.loops.materializer import MaterializerConfig, MaterializerHooks
from engine.loops.service import DataPlaneConfig, Role, ServiceConfig, run_services
from engine.loops.shard_leases import ShardLeaseConfig
from relay.ahead_relay import AheadRelayConfig, AheadRelayHooks
from relay.dispatcher import RelayConfig

POINTS = ("after_lock", "after_read", "after_publish")


def say(*words: object) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def hook(point: str, pause_at: str | None, paused: list[str]) -> Callable[[], Awaitable[None]]:
    async def at() -> None:
        say("AT", point)
        if point == pause_at and not paused:
            paused.append(point)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            say("RESUMED", point)

    return at


async def main(args: argparse.Namespace) -> int:
    paused: list[str] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    config = ServiceConfig(
        roles=frozenset({Role.MATERIALIZER, Role.DISPATCH, Role.RELAY}),
        materializer=MaterializerConfig(horizon=timedelta(seconds=30), idle_interval=0.1),
        relay=RelayConfig(idle_interval=0.05),
        data_plane=DataPlaneConfig(
            node_id=args.node_id,
            leases=ShardLeaseConfig(interval=args.lease_ttl / 5, lease_ttl=args.lease_ttl, max_moves=256),
            dispatch=AheadRelayConfig(read_ahead=timedelta(seconds=1)),
            settler=SettlerConfig(interval=0.1),
            hooks=AheadRelayHooks(
                after_read=hook("after_read", args.pause_at, paused),
                after_publish=hook("after_publish", args.pause_at, paused),
            ),
            materializer_hooks=MaterializerHooks(after_lock=hook("after_lock", args.pause_at, paused)),
            metrics_interval=1.0,
        ),
        summary_every=0,
    )
    say("READY")
    await run_services(args.database_url, args.bootstrap, stop, config)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--pause-at", choices=POINTS)
    parser.add_argument("--lease-ttl", type=float, default=2.5)
    sys.exit(asyncio.run(main(parser.parse_args())))

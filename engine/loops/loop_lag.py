"""How late this process's event loop runs: the stall every task of an engine node suffers at once.

A node's materializer, relay and settle pass share one asyncio loop (its leases renew on a thread of their
own, ``engine.loops.lease_thread``, since such stalls made renewals late). When something holds the loop (a
page decoded and handed to librdkafka in one go, a garbage collection over a heap of page records), every
one of them waits and dispatch slows.
The probe asks for a wake-up every ``interval`` and records how late it came (``chronoq.event_loop_lag``);
a stall past ``warn_after`` is logged (``loop.stalled``) with the time the garbage collector ran inside it
and the oldest generation it collected there (2: a full collection, which walks every tracked object), so
the log says whether the collector or the node's own code held the loop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

from opentelemetry import metrics

from schemas import observability as obs

log = logging.getLogger("chronoq.loop_lag")


class LoopLagProbe:
    def __init__(
        self, interval: float = 0.1, warn_after: float = 0.5, node_id: str = "", meter: metrics.Meter | None = None
    ) -> None:
        self.interval = interval
        self.warn_after = warn_after
        self.node_id = node_id
        self._lag = (meter or obs.get_meter("engine")).create_histogram(obs.EVENT_LOOP_LAG, unit="s")
        self._gc_seconds = 0.0
        self._gc_began: float | None = None
        self._oldest_generation = -1  # since the current probe began; -1: no collection

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        elif self._gc_began is not None:
            self._gc_seconds += time.perf_counter() - self._gc_began
            self._gc_began = None
            self._oldest_generation = max(self._oldest_generation, info.get("generation", -1))

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until ``stop``; the garbage collector's callback is removed on the way out."""
        gc.callbacks.append(self._on_gc)
        try:
            while not stop.is_set():
                await self.probe_once()
        finally:
            gc.callbacks.remove(self._on_gc)

    async def probe_once(self) -> float:
        """One wake-up request: returns how late it came (seconds), recorded, and logged past ``warn_after``."""
        asked, collected = time.perf_counter(), self._gc_seconds
        self._oldest_generation = -1
        await asyncio.sleep(self.interval)
        lag = max(0.0, time.perf_counter() - asked - self.interval)
        self._lag.record(lag, {"node_id": self.node_id})
        if lag > self.warn_after:
            log.warning(
                "event loop stalled",
                extra={
                    "action": "loop.stalled",
                    "node_id": self.node_id,
                    "lag_s": round(lag, 3),
                    "gc_s": round(self._gc_seconds - collected, 3),
                    "gc_generation": self._oldest_generation if self._oldest_generation >= 0 else None,
                },
            )
        return lag

"""The skeleton of every periodic pass: materializer, relay, lease reaper, overlap gate.

A component supplies one pass (``run_pass``: a bounded batch of work in its
own transaction, saying what it did); :class:`PeriodicLoop` supplies the rest,
written once:

* **stop**: the loop ends when the stop event is set, also in the middle of a
  wait (never mid-pass: a pass is one transaction and runs to its end);
* **pacing**: a full batch (``PassOutcome.more``) runs the next pass at once,
  anything less waits ``idle_interval``; a pass that left part of its work for
  later (``PassOutcome.retry_later``, e.g. the relay's unpublished rows) waits
  ``error_backoff``;
* **errors**: a pass that raises never ends the loop. Its transaction rolled
  back, so nothing is half-done; the failure is logged
  (:func:`engine.loops.reporting.log_failure`: a warning when transient, an
  error with its traceback otherwise) and the loop waits ``error_backoff``;
* **a one-line summary** every ``summary_every`` seconds
  (:class:`engine.loops.reporting.LoopSummary`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from engine.loops.reporting import SUMMARY_EVERY, Gauges, LoopSummary, log_failure
from schemas.clock import pause


@dataclass(frozen=True)
class PassOutcome:
    """What one pass did: counts for the summary line, and when the next pass should run."""

    counts: Mapping[str, int] = field(default_factory=dict)
    more: bool = False  # a full batch: more work may be waiting, run the next pass at once
    retry_later: bool = False  # part of the work failed and stays for a later pass: wait error_backoff


@dataclass(frozen=True)
class LoopTiming:
    """idle_interval: seconds to wait after a pass that found less than a full batch.
    error_backoff: seconds to wait after a failed pass (or one that left work for later).
    summary_every: seconds between summary lines (0 turns them off).
    """

    idle_interval: float
    error_backoff: float = 1.0
    summary_every: float = SUMMARY_EVERY


class PeriodicLoop:
    """Runs ``run_pass`` until stopped (see the module docstring for stop, pacing, errors, summaries)."""

    def __init__(
        self,
        name: str,
        run_pass: Callable[[], Awaitable[PassOutcome]],
        timing: LoopTiming,
        log: logging.Logger,
        gauges: Gauges | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.run_pass = run_pass
        self.timing = timing
        self.log = log
        self.summary = LoopSummary(name, log, timing.summary_every, gauges, monotonic)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            wait = await self.step()
            await self.summary.maybe_log()
            if wait:
                await pause(stop, wait)

    async def step(self) -> float:
        """Run one pass; return how many seconds to wait before the next."""
        self.summary.add({"passes": 1})
        try:
            outcome = await self.run_pass()
        except Exception as err:  # noqa: BLE001 - a failed pass must not end the loop (module docstring)
            self.summary.add({"errors": 1})
            log_failure(self.log, self.name, err, self.timing.error_backoff)
            return self.timing.error_backoff
        self.summary.add(outcome.counts)
        if outcome.retry_later:
            return self.timing.error_backoff
        return 0.0 if outcome.more else self.timing.idle_interval

"""The settle pass: ENQUEUED and enqueued_at for ahead-lane occurrences, written off the hot path.

The relay records each acknowledged page once (``dispatch_log``: shard, key
range, acknowledgement instant) instead of updating every occurrence. This
loop turns log entries into per-occurrence state with set-based statements
(SCHEDULED → ENQUEUED, ``enqueued_at`` = the acknowledgement instant), deletes
the published queue rows and marks the entries settled. It runs while the
relay is quiet (nothing due), has not handed a burst over within ``busy_window``,
no live node says its relay is handing one over (``engine_nodes.handing_over_until``,
which this loop writes on each node while its relay does) and no relay logged a page
within ``busy_window`` (all bounded by ``max_defer``; the settle statement judges
that rule itself, in its own snapshot), so a burst is dispatched
first and recorded after — on a shared machine its occurrence UPDATEs would
otherwise take the database's CPU from the burst. For the same reason it waits
while an attempt processor says consumers are working through a backlog
(``consumers_behind``, bounded by ``max_defer_behind``). Until then the API derives
ENQUEUED from the log. It records
``schedule_lag`` per occurrence here, not in the relay: the metric costs
microseconds per row in the SDK, which the burst cannot spare.

Idempotent: a log entry whose rows were already settled (a republished page)
finds nothing left to change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
from opentelemetry import metrics

from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock, pause
from schemas.error_classification import DATABASE_ERRORS
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.settler")

#: The newest log entries the burst test sums (an entry holds up to a page's rows of one shard, 64 by
#: default): enough for busy_rows, a bounded read of the primary key's end.
_BUSY_ENTRIES = 2_000


@dataclass(frozen=True)
class SettlerConfig:
    """entries_per_pass: log entries settled per statement (default 400; an entry is one shard's share
        of a page, up to the relay's rows_per_shard rows).
    interval: seconds between passes when there is nothing to settle or the relay is busy (default 0.2).
    keep_log: seconds settled log entries are kept for inspection (default 600). Once settled an entry
        serves nothing else (the occurrences hold ENQUEUED and enqueued_at, the cursors the progress), and
        with flexible traffic the log takes about one entry per three occurrences: at 1,000 occurrences/s
        an hour's keep was 1.1 million entries.
    prune_every: seconds between prunes of settled entries (default 5): the log holds about
        (keep_log + prune_every) x its entry rate.
    prune_batch: entries one prune statement deletes at most (default 5000; a prune runs at most
        ``prune_statements`` of them, 20 by default, before the settle pass goes on).
    busy_window: the settle pass waits while this node's relay handed busy_rows rows or more to the broker within
        this many seconds or has that many handed over and not logged, a live node announced the same of its
        own relay within three of them (migration 0020), any node's relay had a page acknowledged within them,
        or relays logged busy_rows rows or more within them (default 1.0; 0 disables the check). The
        last test catches a burst: a relay handing one over logs its pages a second or more after their
        acknowledgements (migration 0018), and judged by those alone the settle ran inside it.
    busy_rows: rows logged within busy_window that mark a burst (default 10,000; steady traffic of 1,000
        occurrences/s logs a tenth of it and settles as it goes).
    max_defer: ... but not once the oldest unsettled entry is this old (default 30): a steady stream of
        pages never keeps the log unsettled for longer.
    max_defer_behind: the settle pass also waits while an attempt processor says consumers are working through a
        backlog (``consumers_behind``, migration 0031; engine.rules.consumers_behind), but not once the oldest
        unsettled entry is this old (default 300; 0: never waits for consumers). Its updates of the wide
        occurrence rows otherwise compete with the attempt processor's for the database (docs/benchmarks.md,
        stop 55); the API reads ENQUEUED from the log meanwhile.
    """

    entries_per_pass: int = 400
    interval: float = 0.2
    keep_log: float = 600.0
    prune_every: float = 5.0
    prune_batch: int = 5000
    prune_statements: int = 20
    busy_window: float = 1.0
    busy_rows: int = 10_000
    max_defer: float = 30.0
    max_defer_behind: float = 300.0


@dataclass
class SettleReport:
    entries: int = 0
    rows: int = 0
    occurrences: int = 0
    deferred: bool = False  # a gated pass found a burst being dispatched and settled nothing


class DispatchSettler:
    def __init__(
        self,
        pool: asyncpg.Pool,
        config: SettlerConfig | None = None,
        clock: Clock | None = None,
        quiet: Callable[[], bool] | None = None,
        meter: metrics.Meter | None = None,
        handed_over: Callable[[float], int] | None = None,
        node_id: str | None = None,
        unlogged: Callable[[], int] | None = None,
    ) -> None:
        """``quiet``: whether this node's relay is reading nothing now; ``handed_over(s)``: the rows it handed to
        the broker in the last s seconds (a burst read ahead is handed over by a relay that reads nothing);
        ``unlogged()``: the rows it handed over whose pages it has not logged yet (a burst's acknowledgements and
        log entries trail its hand-overs by seconds); ``node_id``: this node's row in engine_nodes, where it
        announces its hand-overs (None: it does not)."""
        self.pool = pool
        self.config = config or SettlerConfig()
        self.clock = clock or DatabaseClock()
        self.quiet = quiet or (lambda: True)
        self.handed_over = handed_over or (lambda _seconds: 0)
        self.unlogged = unlogged or (lambda: 0)
        self.node_id = node_id
        self._announced_at: float | None = None  # event-loop time of the last announcement
        meter = meter or obs.get_meter("engine")
        self._lag = meter.create_histogram(obs.SCHEDULE_LAG, unit="s", description="enqueued_at - scheduled_for")
        self._settled = meter.create_counter(obs.SETTLED_DELIVERIES, unit="1")
        self._pruned = meter.create_counter(obs.DISPATCH_LOG_PRUNED, unit="1")
        self._deferrals = meter.create_counter(obs.SETTLE_DEFERRALS, unit="1")
        self._announcements = meter.create_counter(obs.HANDOVER_ANNOUNCEMENTS, unit="1")

    async def run_once(self, gated: bool = False) -> SettleReport:
        """Settle up to ``entries_per_pass`` log entries in one statement. ``gated``: unless a burst is being
        dispatched (``deferred``), judged in that statement's own snapshot, with this node's hand-over counts
        read once it holds its connection: then nothing is settled and the report says ``deferred``. A separate
        check ran seconds before its settle statement in a burst (the node's loop and pool lag there)."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                *QUERIES.settle_logged_pages(
                    limit=self.config.entries_per_pass,
                    gated=gated and self.config.busy_window > 0,
                    **self._deferral_arguments(),
                )
            )
        report = SettleReport(row["entries"], row["rows"], len(row["lags"]), deferred=row["deferred"])
        if report.occurrences:
            self._settled.add(report.occurrences)
        record = self._lag.record
        for lag in row["lags"]:
            record(max(lag, 0.0), {"lane": "ahead"})
        return report

    def _handing_over(self) -> bool:
        """This node's relay is dispatching a burst: it handed busy_rows over within busy_window, or that many
        rows it handed over are not logged yet."""
        busy = self.config.busy_rows
        return self.handed_over(self.config.busy_window) >= busy or self.unlogged() >= busy

    def _deferral_arguments(self) -> dict[str, object]:
        """The deferral rule's arguments (chronoq_settle_waits), this node's counts read now."""
        return {
            "busy_here": self._handing_over(),
            "busy_s": self.config.busy_window,
            "busy_rows": self.config.busy_rows,
            "busy_entries": _BUSY_ENTRIES,
            "max_defer_s": self.config.max_defer,
            "max_defer_behind_s": self.config.max_defer_behind,
            "now": self.clock.now(),
        }

    async def deferred(self) -> bool:
        """True while this node's relay or another's is still dispatching a burst (see ``SettlerConfig``), for at
        most ``max_defer``, or consumers are working through one, for at most ``max_defer_behind``. Read-only;
        the loop's settle statement asks the same rules itself."""
        if self.config.busy_window <= 0:
            return False
        return bool(await self.pool.fetchval(*QUERIES.settle_deferred(**self._deferral_arguments())))

    async def announce(self) -> bool:
        """While this node's relay dispatches a burst (``_handing_over``), tell every node's settle pass to wait:
        ``handing_over_until`` = now + three ``busy_window``s, rewritten every half window while it lasts. Three,
        not one: a node's loop lags by up to half a second in a burst and its pool's connections are the
        relay's, so a rewrite can come late (that the margin matters is not shown: docs/benchmarks.md, stop
        36). It ends at most three windows after the burst, which only delays a settle pass. Another node
        sees it before this node's log shows the burst, which takes seconds. True when it wrote."""
        if self.node_id is None or self.config.busy_window <= 0 or not self._handing_over():
            return False
        now = asyncio.get_running_loop().time()
        if self._announced_at is not None and now - self._announced_at < self.config.busy_window / 2:
            return False
        await self.pool.execute(
            *QUERIES.announce_handover(node=self.node_id, until_s=3 * self.config.busy_window, now=self.clock.now())
        )
        self._announced_at = now
        self._announcements.add(1)
        return True

    async def prune(self) -> int:
        """Forget log entries settled more than ``keep_log`` ago, oldest first, in statements of at most
        ``prune_batch`` (at most ``prune_statements`` of them); never an unsettled entry. Returns how many."""
        pruned = 0
        for _ in range(self.config.prune_statements):
            gone = await self.pool.fetchval(
                *QUERIES.prune_settled_log(
                    keep_s=self.config.keep_log, limit=self.config.prune_batch, now=self.clock.now()
                )
            )
            pruned += gone
            if gone < self.config.prune_batch:
                break
        if pruned:
            self._pruned.add(pruned)
        return pruned

    async def run(self, stop: asyncio.Event) -> None:
        """Settle whenever the relay is quiet, and prune every ``prune_every`` seconds, until ``stop``; errors
        are logged and retried."""
        # The prune's cadence is housekeeping, on the event loop's monotonic time; its cutoff is the injected
        # clock's (a settled entry's age is business time, like settled_at itself).
        loop = asyncio.get_running_loop()
        next_prune = loop.time() + self.config.prune_every
        while not stop.is_set():
            try:
                # First, also while this node's relay reads: another node's settle pass must wait for it.
                await self.announce()
                if not self.quiet():
                    await pause(stop, self.config.interval)
                    continue
                report = await self.run_once(gated=True)
                if report.deferred:
                    self._deferrals.add(1)
                    await pause(stop, self.config.interval)
                    continue
                if loop.time() >= next_prune:
                    await self.prune()
                    next_prune = loop.time() + self.config.prune_every
            except DATABASE_ERRORS as err:
                log.error("settle pass failed; retrying", extra={"action": "settler.error", "error": repr(err)})
                await pause(stop, 1.0)
                continue
            if report.entries < self.config.entries_per_pass:
                await pause(stop, self.config.interval)

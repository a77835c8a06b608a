"""The ahead-lane relay: sealed, pre-encoded rows → Kafka, progress recorded once per page.

For the shards its node owns (``schemas.shard_ownership``) it repeatedly:

1. seals each lane up to the bucket boundary ``read_ahead`` past now (the
   seal waits for open materializer transactions, so nothing can still appear
   before it);
2. reads a page: for every shard, its next rows after its cursor and before
   its seal, in key order (time bucket, weighted round-robin round,
   occurrence_id) — strict before flexible, always;
3. releases each row when the clock reaches its ``available_at`` (never
   before) and hands it to the publisher, while the next page is read;
4. once the broker acknowledged a page, moves each shard's cursor past the
   acknowledged prefix and logs the move with the acknowledgement instant, in
   one statement conditional on the lease epoch.

Guarantees: a cursor moves only past rows the broker acknowledged (or that
were discarded, or quarantined as poison after ``poison_tries`` permanent
refusals); a crash anywhere republishes from the cursor (duplicates with the
same occurrence_id, never a loss); a relay whose node lost a shard moves
nothing for it (epoch). No per-row UPDATE on this path: the occurrences'
ENQUEUED state and enqueued_at are written later from the log by the settle
pass (engine/loops/dispatch_settler.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from opentelemetry import metrics, trace

from relay.ahead_lane import AheadLaneStore, AheadRow, LateJudgement, key_of
from relay.clock_estimate import ClockEstimate
from relay.handover_gate import HandoverGate
from relay.page_outcomes import PoisonTries, acknowledged_prefix
from relay.page_release import MISSED_AT_DISPATCH, NOT_HANDED_OVER, Releases, first_late_after, to_release
from relay.recent_handovers import RecentHandovers
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock, pause
from schemas.dispatch_lanes import LANES, CursorKey, micros_of, seal_boundary
from schemas.messages import HEADER_OCCURRENCE_ID, HEADER_TENANT
from schemas.shard_ownership import ShardOwnership

log = logging.getLogger("chronoq.relay.ahead")

#: The shard whose owner counts the cluster's ahead-lane backlog for the gauge (see record_backlog).
BACKLOG_REPORTING_SHARD = 0

#: One row as the publisher takes it: (topic, key, value, headers).
_Item = tuple[str, bytes, bytes, list[tuple[str, bytes]]]


@dataclass(frozen=True)
class AheadRelayConfig:
    """rows_per_shard: rows read per shard per page (default 64; a page is at most this times the shards).
    read_ahead: how far past now the relay seals and reads (default 5 s); rows are still released only
        at their available_at. A bucket can be read once the seal is past its end, so read_ahead must be
        more than one bucket (1 s) for the top of an hour to be read before it: at 1 s the first page
        was read, and its topics' metadata fetched, only at the top; at 2 s a 250,000-row burst of a node
        was still being read at the top, at 5 s it is read before it. The price: a delivery materialized
        less than read_ahead before its instant takes the late lane (per-row claims), and a cancel in the
        last read_ahead before an instant finds the row read (the consumer runtime skips it, as always).
    pages_in_flight: hand-overs unanswered by the broker at once (default 3): a hand-over takes a slot once its
        rows are due, strict before flexible, and holds it until answered; a lane's pages hand over in the order
        they were read (relay/handover_gate.py).
    read_ahead_rows: rows read and waiting in pages in flight before a page (the first of its lane) must be
        completed (default 262,144, about 256 MB at most plus ~0.3 kB per row of publisher items built at the read,
        held only while that many rows are due within read_ahead; 0:
        only pages_in_flight pages, as before stop 31). A burst sealed before its instant is read before it,
        each page waiting in its task for its turn, so at the instant the relay only hands rows over: in the
        500,000 hour-top the p99 fell from 4.7 to 3.3 s (docs/dispatch.md, "Reading ahead of the hand-over").
    release_tick: seconds between clock checks while rows wait for their available_at (default 0.002).
    idle_interval: seconds to wait when nothing is due (default 0.02).
    poison_tries: permanent refusals of one row before it is quarantined (default 3).
    error_backoff: seconds to wait after a failed page (default 0.5).
    ack_timeout: seconds to wait for a page's acknowledgements before treating them as unknown (30).
    log_resolution: how far apart the acknowledgements of the rows logged as one range may be (default
        50 ms): a row's enqueued_at is at most this after its own acknowledgement. Smaller: more log rows
        for work released over seconds (flexible); a burst's page is one range per shard whatever it is.
    """

    rows_per_shard: int = 64
    read_ahead: timedelta = timedelta(seconds=5)
    pages_in_flight: int = 3
    read_ahead_rows: int = 262_144
    release_tick: float = 0.002
    idle_interval: float = 0.02
    poison_tries: int = 3
    error_backoff: float = 0.5
    ack_timeout: float = 30.0
    log_resolution: timedelta = timedelta(milliseconds=50)

    def validate(self) -> None:
        if self.rows_per_shard < 1:
            raise ValueError("rows_per_shard must be at least 1")
        if self.pages_in_flight < 1:
            raise ValueError("pages_in_flight must be at least 1")
        if self.read_ahead_rows < 0:
            raise ValueError("read_ahead_rows must not be negative")
        if self.read_ahead < timedelta(0):
            raise ValueError("read_ahead must not be negative")
        if self.log_resolution < timedelta(0):
            raise ValueError("log_resolution must not be negative")


@dataclass(frozen=True)
class AheadRelayHooks:
    """Awaited at the relay's handoffs; tests kill the process exactly there.

    after_read: a page is read, nothing of it published.
    after_publish: the broker acknowledged a page, its cursors have not moved.
    """

    after_read: Callable[[], Awaitable[None]] | None = None
    after_publish: Callable[[], Awaitable[None]] | None = None


@dataclass
class AheadReport:
    pages: int = 0
    read: int = 0
    published: int = 0
    discarded: int = 0
    failed: int = 0
    quarantined: int = 0
    fenced: int = 0
    missed: int = 0  # late at dispatch: recorded MISSED instead of published
    per_lane: dict[str, int] = field(default_factory=dict)


@dataclass
class _Page:
    lane: str
    epochs: dict[int, int]
    starts: dict[int, CursorKey]
    rows: list[AheadRow]
    task: asyncio.Task[list[BaseException | None]]
    #: The (estimated database) instant the page's last acknowledgement arrived, set by its task.
    acked: list[datetime | None]
    #: Per row, the instant the acknowledgements of the hand-over holding it arrived (None: not handed over).
    acked_each: list[datetime | None]
    #: Rows its task handed over so far, counted before each hand-over call: while 0, nothing of the page is at
    #: the broker.
    handed: list[int]


class AheadRelay:
    def __init__(
        self,
        store: AheadLaneStore,
        publisher: object,
        ownership: ShardOwnership,
        config: AheadRelayConfig | None = None,
        clock: Clock | None = None,
        meter: metrics.Meter | None = None,
        tracer: trace.Tracer | None = None,
        hooks: AheadRelayHooks | None = None,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.ownership = ownership
        self.config = config or AheadRelayConfig()
        self.config.validate()
        self.clock = ClockEstimate(clock or DatabaseClock())
        self.hooks = hooks or AheadRelayHooks()
        meter = meter or obs.get_meter("relay")
        self.tracer = tracer or obs.get_tracer("relay")
        self._published = meter.create_counter(obs.OUTBOX_PUBLISHED, unit="1")
        self._dispatched = meter.create_counter(obs.TENANT_DISPATCHES, unit="1")
        self._failures = meter.create_counter(obs.OUTBOX_PUBLISH_FAILURES, unit="1")
        self._fenced = meter.create_counter(obs.OUTBOX_FENCED_MARKS, unit="1")
        self._quarantined = meter.create_counter(obs.QUARANTINED_DELIVERIES, unit="1")
        self._backlog = meter.create_gauge(obs.AHEAD_BACKLOG, unit="1")
        self._dispatch_missed = meter.create_counter(obs.DISPATCH_MISSED, unit="1")
        self._late_published = meter.create_counter(obs.DISPATCH_LATE_PUBLISHED, unit="1")
        self._judged_missed = 0  # rows recorded MISSED at dispatch since the last page was completed
        self._positions: dict[tuple[int, str], CursorKey] = {}  # acknowledged, as in the database
        self._tentative: dict[tuple[int, str], CursorKey] = {}  # past the pages in flight
        self._seals: dict[str, dict[int, datetime]] = {lane: {} for lane in LANES}
        self._sealed_for: dict[str, datetime | None] = {lane: None for lane in LANES}
        # The seal at which a lane was last read empty: nothing can appear before a committed seal, so
        # the lane need not be read again until its seal moves (an idle relay reads once per bucket).
        self._drained_at: dict[str, datetime | None] = {lane: None for lane in LANES}
        self._tries = PoisonTries(self.config.poison_tries)
        self._inflight: deque[_Page] = deque()
        self._rows_in_flight = 0
        #: Rows handed to the broker whose page is not completed (cursor moved, dispatch log written) yet: a
        #: burst still being dispatched, as no other node can see it before the log shows it.
        self._unlogged = 0
        #: Set when a row of a hand-over was refused or unanswered: hand-overs whose slot comes later hand
        #: nothing over (the pass abandons them, as it abandons every page after a failure); cleared once they
        #: are abandoned and at each pass. A row refused for the last time is quarantined, not a failure of the
        #: pass: the pages stopped after it then fail the pass and are read again after error_backoff.
        self._halted = False
        self._gate = HandoverGate(self.config.pages_in_flight, len(LANES))  # strict (rank 0) first
        #: Per lane, done once the lane's last page read has handed its last row over (or ended).
        self._lane_tail: dict[str, asyncio.Future[None] | None] = {lane: None for lane in LANES}
        #: True while the last pass found nothing to publish: the settle pass runs only then.
        self.quiet = True
        #: Rows handed to the broker lately, by the event loop's monotonic time: the settle pass waits while a
        #: burst is handed over, which ``quiet`` (not reading) does not show (relay/recent_handovers.py).
        self.handovers = RecentHandovers()

    # ------------------------------------------------------------------ the loop

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set; a failure backs off and re-reads from the cursor, never skips a row."""
        while not stop.is_set():
            try:
                report = await self.run_once(stop)
            except Exception as err:  # noqa: BLE001 - any failure: keep what was acknowledged, retry the rest
                log.error(
                    "ahead-lane pass failed; retrying from the cursor",
                    extra={"action": "relay.ahead.error", "error": repr(err)},
                )
                await self._drain_inflight()
                await pause(stop, self.config.error_backoff)
                continue
            self.quiet = not report.read
            if report.failed:
                await pause(stop, self.config.error_backoff)
            elif not report.read:
                await pause(stop, self.config.idle_interval)

    async def run_once(self, stop: asyncio.Event | None = None) -> AheadReport:
        """Publish everything due that is sealed now, page by page (strict first), reading each newly sealed
        second while the pages before it are released, until nothing is left in flight (or ``stop`` is set:
        then what is in flight is finished)."""
        report = AheadReport()
        self._halted = False  # nothing is in flight between passes
        epochs = self.ownership.snapshot()
        if not epochs:
            return report
        await self._sync_positions(epochs)
        while True:
            page = await self._next_page(epochs)
            if page:
                # Busy from the first page on, not only once the pass returns: a burst is one pass, and the
                # settle pass (which runs only while this relay is quiet) must not compete with it meanwhile.
                self.quiet = False
                report.read += len(page.rows)
                if self._full() and (head := await self._lane_head_done(None)) is not None:
                    await self._complete(head, report)
            elif not self._inflight:
                break
            else:
                # Nothing more is readable, pages are still in flight (rows waiting for their available_at):
                # seal and read the next second as soon as the seal boundary moves, while these are released
                # — not once they are drained, which read steady work only as its first row fell due.
                self.quiet = True  # waiting, not reading: the settle pass may run meanwhile
                done = await self._lane_head_done(stop, until_boundary_moves=True)
                if done is not None:
                    await self._complete(done, report)
                if stop is not None and stop.is_set():
                    break
            if report.failed:
                break
            if self.ownership.version and self.ownership.snapshot() != epochs:
                break  # ownership changed: finish what is in flight, start over
        await self._finish_handed_over(report)
        if report.failed:
            self._tentative = dict(self._positions)
            self._drained_at = {lane: None for lane in LANES}
        return report

    # ------------------------------------------------------------------ steps

    def _full(self) -> bool:
        """No more pages are read before a page completes (the first of its lane): at least pages_in_flight pages
        are in flight and they hold read_ahead_rows rows or more.

        Strict and flexible pages alike (docs/dispatch.md, "Reading ahead of the hand-over"): stopping the
        reading at a flexible page in flight made the relay wait for that page's later rows (seconds ahead)
        before it read the next second's strict rows, which the soak's strict lag showed. Priority is kept at
        the hand-over instead: strict hand-overs get the gate's free slots first."""
        return (
            len(self._inflight) >= self.config.pages_in_flight and self._rows_in_flight >= self.config.read_ahead_rows
        )

    async def _next_page(self, epochs: dict[int, int]) -> _Page | None:
        """Seal if the boundary moved, then read the next page, strict lane first."""
        await self._seal_if_due(epochs)
        for lane in LANES:
            page = await self._read(lane, epochs)
            if page:
                return page
        return None

    async def _lane_head_done(
        self, stop: asyncio.Event | None, until_boundary_moves: bool = False
    ) -> _Page | None:  # fmt: skip
        """Wait until the first page in flight of some lane is done and return it (the earliest read of those
        done), checking every ``idle_interval`` (no database round trip); None once ``stop`` is set or, with
        ``until_boundary_moves``, once the seal boundary moved on the injected clock.

        Each lane's cursor moves over its own pages in read order, so a lane's page is completed as soon as it
        and the lane's pages before it are: a flexible page handed over is recorded while strict pages read
        before it still wait for their instant (seconds, with read_ahead), not after them."""
        heads: dict[asyncio.Task[list[BaseException | None]], _Page] = {}
        for page in self._inflight:
            if all(p.lane != page.lane for p in heads.values()):
                heads[page.task] = page
        while stop is None or not stop.is_set():
            now = self.clock.now()
            if until_boundary_moves and now is not None:
                boundary = seal_boundary(now, self.config.read_ahead)
                if any(boundary != self._sealed_for[lane] for lane in LANES):
                    return None
            done, _ = await asyncio.wait(heads, timeout=self.config.idle_interval, return_when=asyncio.FIRST_COMPLETED)
            if done:
                return next(page for task, page in heads.items() if task in done)  # heads are in read order
        return None

    async def _sync_positions(self, epochs: dict[int, int]) -> None:
        """Load cursors of newly owned shards; forget lost ones."""
        for lost in [k for k in self._positions if k[0] not in epochs]:
            self._positions.pop(lost)
            self._tentative.pop(lost, None)
        for lane in LANES:
            new = [s for s in epochs if (s, lane) not in self._positions]
            if new:
                for shard, key in (await self.store.positions(lane, new)).items():
                    self._positions[(shard, lane)] = key
                    self._tentative[(shard, lane)] = key
            self._seals[lane] = {s: v for s, v in self._seals[lane].items() if s in epochs}
            if new:
                self._sealed_for[lane] = None
                self._drained_at[lane] = None

    async def _seal_if_due(self, epochs: dict[int, int]) -> None:
        """Seal each lane up to the boundary read_ahead past now, unless it is sealed there already."""
        if self.clock.now() is None:  # first pass on the database clock: learn it
            self.clock.observe(await self.store.now())
        for lane in LANES:
            boundary = seal_boundary(self.clock.now(), self.config.read_ahead)  # type: ignore[arg-type]
            if boundary == self._sealed_for[lane]:
                continue
            sealed = await self.store.seal(lane, epochs, boundary)
            if self.clock.clock.now() is None:
                self.clock.observe(sealed.now)
            self._seals[lane] = sealed.sealed_until
            self._sealed_for[lane] = boundary

    async def _read(self, lane: str, epochs: dict[int, int]) -> _Page | None:
        if self._drained_at[lane] is not None and self._drained_at[lane] == self._sealed_for[lane]:
            return None
        positions = {s: self._tentative[(s, lane)] for s in epochs if (s, lane) in self._tentative}
        rows = await self.store.read_page(lane, positions, self._seals[lane], self.config.rows_per_shard)
        if not rows:
            # Nothing new can become readable before the seal moves (every rewind of the positions resets
            # this), also while pages are in flight: the pass waiting for the next second reads nothing.
            self._drained_at[lane] = self._sealed_for[lane]
            return None
        if self.hooks.after_read:
            await self.hooks.after_read()
        await self.publisher.ensure_topics({r["topic"] for r in rows})  # type: ignore[attr-defined]
        last: dict[int, AheadRow] = {}
        for row in rows:
            last[row["shard"]] = row  # rows come ordered by shard then key
        starts = {s: positions[s] for s in last}
        for shard, row in last.items():
            self._tentative[(shard, lane)] = key_of(row)
        page_epochs = {s: epochs[s] for s in starts}
        # Late rows are judged here, in page order (pages are read one after another, in key order), so a
        # schedule's late rows are judged once, oldest page first; the release only re-checks rows that
        # became late between their read and their release (a stalled relay).
        skip, judged = await self._judge_at_read(lane, page_epochs, rows)
        acked: list[datetime | None] = [None]
        acked_each: list[datetime | None] = [None] * len(rows)
        handed = [0]
        # Read order within the lane: this page hands rows over once the lane's previous page handed its last.
        prior, released = self._lane_tail[lane], asyncio.get_running_loop().create_future()
        self._lane_tail[lane] = released
        task = asyncio.create_task(
            self._send_page(rows, lane, page_epochs, skip, judged, acked, acked_each, handed, (prior, released))
        )
        page = _Page(lane, page_epochs, starts, rows, task, acked, acked_each, handed)
        self._inflight.append(page)
        self._rows_in_flight += len(rows)
        return page

    async def _judge_at_read(
        self, lane: str, epochs: dict[int, int], rows: list[AheadRow]
    ) -> tuple[frozenset[object], frozenset[object]]:
        """Judge the page's rows already past their late_after: (ids not to publish, ids judged)."""
        now = self.clock.now()
        first_late = first_late_after(rows)
        if now is None or first_late is None or first_late >= (now_us := micros_of(now)):
            return frozenset(), frozenset()
        late = [
            r for r in rows if not r["discarded"] and r["late_after_us"] is not None and r["late_after_us"] < now_us
        ]
        if not late:
            return frozenset(), frozenset()
        judgement = await self._record_judgement(lane, epochs, late, now)
        return frozenset(judgement.skip), frozenset(r["occurrence_id"] for r in late)

    async def _release_and_send(
        self,
        rows: list[AheadRow],
        items: list[_Item],
        lane: str,
        epochs: dict[int, int],
        skip: frozenset[object] = frozenset(),
        judged: frozenset[object] = frozenset(),
        acked_each: list[datetime | None] | None = None,
        handed: list[int] | None = None,
        released: asyncio.Future[None] | None = None,
    ) -> list[BaseException | None]:
        """Hand each row (its publisher item in ``items``, prepared when the page was read) to the publisher
        once the clock reaches its available_at; one outcome per row, and in ``acked_each`` the clock's instant
        when the answers for its hand-over arrived; ``handed[0]`` counts the rows handed over (before each
        hand-over call), ``released`` is set once the last row was (the lane's next page may start handing over).

        Each hand-over takes a slot of the hand-over gate once its rows are due (strict before flexible) and
        holds it until the broker answered; after a failed hand-over, this page's or another's, nothing more is
        handed over (the rows left are :data:`NOT_HANDED_OVER`: the pass abandons them and reads them again).
        A row released after its late_after (the relay or the broker was down) is judged first: its
        schedule's policy decides whether it is still published or recorded MISSED
        (:data:`MISSED_AT_DISPATCH`: the cursor passes it).
        """
        outcomes: list[BaseException | None] = [None] * len(rows)
        first_late = first_late_after(rows)  # the page's earliest: one check per release, not per row
        releases = Releases(rows, to_release(rows, skip, outcomes))
        rank = LANES.index(lane)
        while not releases.done:
            now = self.clock.now()
            due = releases.due(micros_of(now) if now is not None else None)
            if due and now is not None and first_late is not None and first_late < micros_of(now):
                due = await self._judge(lane, epochs, rows, due, judged, now, outcomes)
            if due:
                await self._gate.acquire(rank)
                try:
                    if self._halted:
                        for i in (*due, *releases.left()):
                            outcomes[i] = NOT_HANDED_OVER
                        return outcomes
                    if handed is not None:
                        handed[0] += len(due)
                    self._unlogged += len(due)
                    # A burst's page is due at once: its items as prepared, no per-row copy at the instant.
                    batch = items if len(due) == len(items) else [items[i] for i in due]
                    future = await self.publisher.send(batch)  # type: ignore[attr-defined]
                    self.handovers.add(len(due), asyncio.get_running_loop().time())
                    if acked_each is not None:
                        future.add_done_callback(self._stamper(due, acked_each))
                    if releases.done and released is not None and not released.done():
                        released.set_result(None)
                    errors = await self._answers(future, len(due))
                    for i, error in zip(due, errors, strict=True):
                        outcomes[i] = error
                    if any(error is not None for error in errors):
                        # Before the slot goes to another hand-over: the pass will abandon every later page, so
                        # none hands rows over meanwhile (they would reach the broker and be read and sent again).
                        self._halted = True
                finally:
                    self._gate.release()
            if not releases.done:
                await asyncio.sleep(self.config.release_tick)
        return outcomes

    def _items(self, rows: list[AheadRow]) -> list[_Item]:
        """The publisher's (topic, key, value, headers) of every row of a page, with the trace context of the
        page's publish span. Built when the page is read, not when it is due: a burst read ahead of its instant
        then spends its first seconds handing items over, not building them (a tenth of a node's CPU in the
        500,000 hour-top, docs/benchmarks.md, stop 36)."""
        trace_headers: list[tuple[str, bytes]] = []
        with self.tracer.start_as_current_span(obs.SPAN_PUBLISH) as span:
            span.set_attribute("chronoq.ahead_rows", len(rows))
            obs.inject_trace_headers(trace_headers)
        return [
            (
                r["topic"],
                r["message_key"],
                r["message"],
                [(HEADER_OCCURRENCE_ID, r["occurrence_header"]), (HEADER_TENANT, r["tenant_header"]), *trace_headers],
            )
            for r in rows
        ]

    async def _answers(
        self, future: asyncio.Future[list[BaseException | None]], count: int
    ) -> list[BaseException | None]:
        """The broker's answers to one hand-over of ``count`` rows; unknown (an error) after ack_timeout."""
        try:
            async with asyncio.timeout(self.config.ack_timeout):  # not wait_for: it can swallow a cancellation (3.11)
                return await future
        except TimeoutError:
            return [TimeoutError("no acknowledgement within ack_timeout: outcome unknown")] * count

    async def _send_page(
        self,
        rows: list[AheadRow],
        lane: str,
        epochs: dict[int, int],
        skip: frozenset[object],
        judged: frozenset[object],
        acked: list[datetime | None],
        acked_each: list[datetime | None],
        handed: list[int],
        turn: tuple[asyncio.Future[None] | None, asyncio.Future[None]],
    ) -> list[BaseException | None]:
        """:meth:`_release_and_send` once the page read before it in its lane handed its last row over
        (``turn``: that page's future, and this page's, set once its own last row is handed over or it ends),
        then ``acked[0]`` = the clock's instant once the last acknowledgement arrived: the broker's
        acknowledgement instant on the database's clock (never ahead of it), not the later moment the cursor
        moves — pages are pipelined, and a page's cursor moves only after the next page is read, which added a
        page read and more to every enqueued_at of the page."""
        prior, released = turn
        try:
            items = self._items(rows)  # while the page waits for its turn and its instant
            if prior is not None:
                await asyncio.shield(prior)  # cancelled while waiting, this page must not cancel its prior's
            if self._halted:
                return [NOT_HANDED_OVER] * len(rows)
            outcomes = await self._release_and_send(
                rows, items, lane, epochs, skip, judged, acked_each, handed, released
            )
        finally:
            if not released.done():
                released.set_result(None)
        acked[0] = self.clock.now()
        return outcomes

    def _stamper(
        self, indexes: list[int], acked_each: list[datetime | None]
    ) -> Callable[[asyncio.Future[list[BaseException | None]]], None]:
        """A done callback that writes the clock's instant, when a hand-over's answers arrive, for its rows."""

        def stamp(_future: asyncio.Future[list[BaseException | None]]) -> None:
            at = self.clock.now()
            for i in indexes:
                acked_each[i] = at

        return stamp

    async def _judge(
        self,
        lane: str,
        epochs: dict[int, int],
        rows: list[AheadRow],
        due: list[int],
        judged: frozenset[object],
        now: datetime,
        outcomes: list[BaseException | None],
    ) -> list[int]:
        """Lateness at dispatch for rows of ``due`` that became late after their read (not judged then);
        returns the rows still to publish."""
        now_us = micros_of(now)
        late = [
            rows[i]
            for i in due
            if rows[i]["late_after_us"] is not None
            and rows[i]["late_after_us"] < now_us
            and rows[i]["occurrence_id"] not in judged
        ]
        if not late:
            return due
        judgement = await self._record_judgement(lane, epochs, late, now)
        if not judgement.skip:
            return due
        keep = []
        for i in due:
            if rows[i]["occurrence_id"] in judgement.skip:
                outcomes[i] = MISSED_AT_DISPATCH
            else:
                keep.append(i)
        return keep

    async def _record_judgement(
        self, lane: str, epochs: dict[int, int], late: list[AheadRow], now: datetime
    ) -> LateJudgement:
        """Judge ``late`` in the database and count what was decided."""
        judgement = await self.store.judge_late(lane, epochs, late, now)
        if judgement.missed:
            self._judged_missed += judgement.missed
            self._dispatch_missed.add(judgement.missed, {"lane": lane})
            log.warning(
                "occurrences too late at dispatch for their misfire policy; recorded MISSED",
                extra={"action": "relay.ahead.missed_at_dispatch", "lane": lane, "count": judgement.missed},
            )
        if judgement.published_late:
            self._late_published.add(judgement.published_late, {"lane": lane})
        return judgement

    async def _complete(self, page: _Page, report: AheadReport) -> None:
        """Wait for ``page`` (in flight) and move its cursors past what the broker acknowledged."""
        self._inflight.remove(page)
        self._rows_in_flight -= len(page.rows)
        outcomes = await page.task
        if self.hooks.after_publish:
            await self.hooks.after_publish()
        outcome = acknowledged_prefix(
            page.rows, outcomes, page.acked_each, page.starts, page.epochs, page.lane, self._tries,
            self.config.log_resolution,
        )  # fmt: skip
        moves, poison, failed = outcome.moves, outcome.poison, outcome.failed
        if poison:
            await self.store.quarantine(poison)
            report.quarantined += len(poison)
            self._quarantined.add(len(poison))
            for q in poison:
                log.error(
                    "delivery refused for good; quarantined",
                    extra={
                        "action": "relay.ahead.quarantined",
                        "occurrence_id": str(q.occurrence_id),
                        "tenant_id": q.tenant_id,
                        "topic": q.topic,
                        "error": q.error,
                    },
                )
        if moves:
            moved, _acked_at = await self.store.advance(page.lane, moves, page.acked[0])
            for move in moves:
                self._positions[(move.shard, page.lane)] = move.end
            if moved < len(moves):
                report.fenced += len(moves) - moved
                self._fenced.add(len(moves) - moved)
                log.warning(
                    "shards moved to another owner before their cursor moved",
                    extra={"action": "relay.ahead.fenced", "count": len(moves) - moved},
                )
        # Logged (or nothing to log): other nodes see this page now. At least 0: a failed pass resets the count.
        self._unlogged = max(0, self._unlogged - page.handed[0])
        published = 0
        per_tenant: dict[str, int] = {}
        for row, error in zip(page.rows, outcomes, strict=True):
            if error is None and not row["discarded"]:
                published += 1
                tenant = row["tenant_id"]
                per_tenant[tenant] = per_tenant.get(tenant, 0) + 1
        report.pages += 1
        report.published += published
        report.missed += self._judged_missed
        self._judged_missed = 0
        report.discarded += sum(1 for r in page.rows if r["discarded"])
        report.per_lane[page.lane] = report.per_lane.get(page.lane, 0) + published
        self._published.add(published, {"lane": page.lane})
        for tenant, count in per_tenant.items():
            self._dispatched.add(count, {"tenant_id": tenant, "lane": page.lane})
        if failed:
            report.failed += failed
            self._failures.add(failed)
            # Later pages in flight hold rows past the failure: wait for them, move nothing of theirs for the
            # shards that failed, and re-read those shards from their cursors.
            await self._abandon_inflight()  # which also rewinds the tentative positions to the cursors

    async def _finish_handed_over(self, report: AheadReport) -> None:
        """Complete the pages in flight that handed rows over (their cursors move past what the broker
        acknowledged), in read order; drop those read ahead that handed nothing over yet, to be read again from
        the cursor — a stopping relay or one whose shards changed does not wait for their instant.

        Per lane: a lane's pages hand over in read order, so those that did are the first of their lane, and
        only those are completed (a cursor moves over a contiguous prefix). A flexible page handed over while
        strict pages read before it wait for their instant is completed too, not published again."""
        blocked: set[str] = set()
        finishing: list[_Page] = []
        for page in self._inflight:
            if page.lane not in blocked and (page.handed[0] or page.task.done()):
                finishing.append(page)
            else:
                blocked.add(page.lane)
        for page in finishing:
            if report.failed:  # the failure abandoned every page still in flight
                break
            await self._complete(page, report)
        if self._inflight:
            await self._abandon_inflight()

    async def _drain_inflight(self) -> None:
        """After a failed pass: move the cursors past what the broker acknowledged in the pages still in
        flight (republishing them would only duplicate), then re-read everything else from the cursor."""
        try:
            await self._finish_handed_over(AheadReport())
        except Exception as err:  # noqa: BLE001 - the database is unreachable too: the rows are re-read
            log.warning(
                "could not record acknowledged pages", extra={"action": "relay.ahead.drain", "error": repr(err)}
            )
        await self._abandon_inflight()

    async def _abandon_inflight(self) -> None:
        """Forget the pages still in flight (their rows are re-read from the cursor): a page that has handed
        nothing to the broker is cancelled (it may be waiting seconds for its turn or its rows' instant); one
        that has is waited for."""
        for page in self._inflight:
            if not page.handed[0]:
                page.task.cancel()
        while self._inflight:
            # Failed or cancelled, the rows are re-read anyway; gather takes the outcome, not our cancellation.
            await asyncio.gather(self._inflight.popleft().task, return_exceptions=True)
        self._rows_in_flight = 0
        self._unlogged = 0
        self._halted = False
        self._lane_tail = {lane: None for lane in LANES}
        self._tentative = dict(self._positions)
        self._drained_at = {lane: None for lane in LANES}

    def handed_over_within(self, seconds: float) -> int:
        """Rows this relay handed to the broker in the last ``seconds`` (at most ten)."""
        return self.handovers.since(seconds, asyncio.get_running_loop().time())

    def unlogged_rows(self) -> int:
        """Rows this relay handed to the broker whose pages are not logged yet: the end of a burst, whose
        acknowledgements and log entries trail its hand-overs by seconds (a 500,000 top: last hand-over ~1.5 s,
        last acknowledgement 2.75 s, last log entry 3.96 s after it)."""
        return self._unlogged

    async def record_backlog(self) -> dict[str, int]:
        """Set the ``ahead_backlog`` gauge: due ahead-lane rows not yet passed by their cursor, per lane.

        The count covers every shard, owned or not (an unowned shard's due rows are the backlog an outage
        leaves), so one node counts for the cluster: the owner of shard ``BACKLOG_REPORTING_SHARD``. Every
        other node records 0 without a query, so the gauge's sum (and its max) over nodes is the backlog,
        and a node that lost that shard stops reporting its last count. Counting on every node cost ~0.7 s
        of PostgreSQL time per node at the top of a 500,000 burst (docs/benchmarks.md, stop 32)."""
        if BACKLOG_REPORTING_SHARD not in self.ownership:
            backlog = dict.fromkeys(LANES, 0)
        else:
            backlog = await self.store.backlog()
        for lane in LANES:
            self._backlog.set(backlog.get(lane, 0), {"lane": lane})
        return backlog

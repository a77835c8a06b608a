"""The materializer: turns due schedules into occurrences and their deliveries, set-based, ahead of time.

Guarantee: for each schedule it processes, ONE statement advances
``next_run_at`` (its own, or its cohort's) — only if the schedule's version
and cursor (the cohort's membership and cursor) are still the ones it read —
and, for exactly the schedules it advanced, inserts the
occurrences (SCHEDULED, or MISSED per the misfire policy) and a delivery for
every SCHEDULED occurrence it actually inserted. Occurrence ids are
deterministic and unique per (schedule, version, scheduled_for), so two
materializers that overlap (a lease handover) can never produce a second
occurrence or delivery, and a control-plane change that commits first wins:
the compare-and-set fails and nothing is written for that schedule.

Deliveries go to one of two lanes:

- the **ahead lane** (``dispatch_queue``) when this node holds the shard's
  lease at the epoch it knows and the delivery is due at or after the lane's
  seal, which the transaction holds FOR SHARE (a relay's seal waits for it, so
  no relay reads past a row that is still being written): the relay reads it
  in order without a per-row claim;
- the **late lane** (the outbox, per-row claims) otherwise: due before the
  seal (the relay has already read past that instant), held by the overlap
  gate, or written by a node without shard leases (tests, tools).

Schedules that fire alike share a **cohort** (migration 0026,
engine/rules/cohorts.py): its one cursor advances instead of each member's
row. A pass locks its due cohorts (skipping any another transaction holds)
and reads their members after the lock, so a member's change either commits
before (the member is not in the pass) or waits for the pass to commit (and
then sees, and cancels, what it wrote). A cohort whose fire is not plain
on-time work dissolves in the pass: each member advances alone, with its own
cursor from then on, and joins a cohort again at a later plain advance.

Work is set-based: due schedules are read per shard with an index range scan,
fire instants are computed once per (time spec, cursor, misfire policy), the
batch is COPYed into a staging table and written with one statement. A cohort
whose fire is plain on-time work has its members' rows staged straight from
what ``cohort_members`` reads (engine/loops/occurrence_rows.py): no schedule
record and no per-schedule bookkeeping per member.
Recovery after an outage resumes from the durable cursor with the misfire
decision (``timing.decide_misfire``) doing bounded work however long the
outage was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any, NamedTuple

import asyncpg
from opentelemetry import metrics, trace

from engine.control.cohort_membership import claim_cohorts
from engine.control.targets import binding_versions
from engine.loops.occurrence_rows import (
    MICROSECOND,
    STAGING_COLUMNS,
    TENANT_HOLD_COLUMNS,
    InstantParts,
    OccurrenceIds,
    PlainCohort,
    cohort_member_rows,
    encode_occurrence,
    instant_parts,
)
from engine.loops.overlap_gate import OVERLAP_GATE_TOKEN
from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import SUMMARY_EVERY
from engine.loops.tenant_gate import TENANT_GATE_TOKEN, hold_beyond_max_running
from engine.records import COHORT_FIELDS, DueSchedule
from engine.rules import timing
from engine.rules.cohorts import CohortSpec, cohort_spec, plain_on_time
from engine.rules.exclusion_calendars import ExclusionCalendar, entries_from_stored
from engine.rules.fair_rounds import RoundCounter
from engine.rules.token_bucket import TokenBucket, full_bucket, reserve, take
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.connections import unchecked_first
from schemas.dispatch_lanes import aware, bucket_of_micros, lane_of, micros_of
from schemas.queries import QUERIES
from schemas.shard_ownership import ShardOwnership
from schemas.topics import occurrence_topic, schedule_key

log = logging.getLogger("chronoq.materializer")


@dataclass(frozen=True)
class MaterializerConfig:
    """Materializer tuning.

    horizon: how far ahead of now fires are materialized (default 30 s). It
        must cover a failover plus the time to write a burst, so the relay finds
        hour-top occurrences already in the ahead lane.
    batch_size: schedules per transaction (default 20,000). Larger passes cost less per occurrence
        (500,000 hour-top on Apache Kafka: 17,025 rows/s at 20,000 against 13,007-13,532 at 5,000, stop 35;
        200,000: 19,153-22,269 against 14,203-14,295, stop 33) but hold their shards' seals longer (a relay's
        seal advance, read_ahead ahead of now, waits ~0.3 s on average while materializing). An Apache Kafka
        run at 20,000 once lost both nodes' leases at the top (stop 33); the leases now renew on a thread and
        a connection of their own, committing asynchronously, and runs since lost none (docs/benchmarks.md).
    idle_interval: seconds to wait when nothing was due (default 0.25).
    missed_record_limit: MISSED occurrences written per schedule per pass;
        further missed instants are counted and recorded as one missed_ranges row, never enumerated.
    on_time_limit: the most lateness that still counts as on time, whatever a schedule's max_lateness
        (default 5 minutes; None = max_lateness alone): bounds the on-time work one pass does after an
        outage, and the relays' lateness check at dispatch. Pass the same to `chronoq reconcile
        --on-time-limit`.
    shards: logical shards this node materializes when it runs without shard
        leases (None = all); with an ownership, the owned shards.
    passes_in_flight: passes a node with shard leases runs at once, each on its own share of the owned
        shards (``shard % passes_in_flight``), so one pass's Python plans while another's statement runs in
        the database (default 2; without leases always 1: passes over the same shards would only fail each
        other's compare-and-set). Their seal locks and catch-up buckets are taken in shard and tenant order,
        as two nodes' passes already are.
    """

    horizon: timedelta = timedelta(seconds=30)
    batch_size: int = 20_000
    idle_interval: float = 0.25
    missed_record_limit: int = 1000
    on_time_limit: timedelta | None = timedelta(minutes=5)
    shards: tuple[int, ...] | None = None
    passes_in_flight: int = 2

    def validate(self) -> None:
        if self.horizon < timedelta(0):
            raise ValueError("horizon must not be negative")
        if self.on_time_limit is not None and self.on_time_limit < timedelta(0):
            raise ValueError("on_time_limit must not be negative")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.passes_in_flight < 1:
            raise ValueError("passes_in_flight must be at least 1")


@dataclass(frozen=True)
class MaterializerHooks:
    """Awaited at the materializer's handoffs; tests stop or kill the process exactly there.

    after_read: inside the transaction, the due schedules and cohorts read, nothing locked or written yet.
    after_lock: inside the transaction, the shards' seals are held FOR SHARE, nothing written yet.
    after_write: inside the transaction, the batch written (cursors, cohorts and rows), not committed.
    """

    after_read: Callable[[], Awaitable[None]] | None = None
    after_lock: Callable[[], Awaitable[None]] | None = None
    after_write: Callable[[], Awaitable[None]] | None = None


@dataclass
class MaterializeReport:
    schedules: int = 0
    occurrences: int = 0
    ahead: int = 0
    late: int = 0
    missed: int = 0
    missed_unlisted: int = 0
    excluded: int = 0  # fires exclusion calendars removed
    completed_by_runs: int = 0  # of `completed`: schedules whose last run (max_runs) was materialized
    conflicts: int = 0
    completed: int = 0
    skipped: int = 0  # schedules changed concurrently (compare-and-set failed): nothing written
    ranges: int = 0  # missed_ranges rows written (schedules whose missed slots exceeded missed_record_limit)
    catch_up: int = 0  # catch-up occurrences staged (late instants the policy enqueues)
    throttled: int = 0  # of those, released after now by the tenant's token bucket
    catch_up_refused: int = 0  # catch-ups recorded MISSED: the tenant's catch_up_per_minute is 0
    tenant_held: Counter[str] = field(default_factory=Counter)  # first deliveries held for max_running, by tenant
    cohorts: int = 0  # cohorts advanced (their members are in `schedules`)
    dissolved: int = 0  # cohorts dissolved: their members advanced alone, on their own cursors from then on
    joined: int = 0  # schedules with their own cursor that joined a cohort at their advance
    notes: list[str] = field(default_factory=list)


class _Decided(NamedTuple):
    """One due schedule with its calendar, its misfire decision and its lateness threshold in microseconds (a
    tuple: one per due schedule of a burst, built in about a third of a frozen dataclass's time)."""

    schedule: DueSchedule
    calendar: ExclusionCalendar | None
    decision: timing.MisfireDecision
    threshold_us: int


class _CohortRead(NamedTuple):
    """A due cohort as locked: its shard, members_version and cursor (the compare-and-set)."""

    shard: int
    version: int
    cursor: datetime


@dataclass
class _Cohorts:
    """The batch's due cohorts as locked, those to dissolve, each advancing one's new cursor and fires, and the
    dissolving ones' members with their own new cursor and runs."""

    read: dict[uuid.UUID, _CohortRead] = field(default_factory=dict)
    dissolve: set[uuid.UUID] = field(default_factory=set)
    advance: dict[uuid.UUID, tuple[datetime | None, int]] = field(default_factory=dict)
    released: list[tuple[uuid.UUID, datetime | None, int]] = field(default_factory=list)
    # each locked cohort's member rows (cohort_members) and its values of COHORT_FIELDS
    members: dict[uuid.UUID, list[asyncpg.Record]] = field(default_factory=dict)
    shared: dict[uuid.UUID, tuple[Any, ...]] = field(default_factory=dict)

    def keep_held(self, seals: Mapping[tuple[int, str], datetime]) -> None:
        """Forget the cohorts whose shard's seals are not among ``seals`` (no longer this node's)."""
        self.read = {c: v for c, v in self.read.items() if (v.shard, "strict") in seals}
        self.dissolve &= self.read.keys()
        self.members = {c: rows for c, rows in self.members.items() if c in self.read}

    def representatives(self) -> list[DueSchedule]:
        """One member of each cohort with members, as a due schedule: a cohort's fires and misfire verdict are
        its first member's (they depend only on the fields the members share: engine/rules/cohorts.py)."""
        return [DueSchedule.of_member(rows[0], self.shared[c]) for c, rows in self.members.items() if rows]

    def arrays(self) -> dict[str, list[Any]]:
        """materialize_staged's cohort parameters."""
        advancing = [c for c in self.advance if c not in self.dissolve]
        gone = sorted(self.dissolve)
        return {
            "cohort_ids": advancing,
            "cohort_versions": [self.read[c].version for c in advancing],
            "cohort_cursors": [self.read[c].cursor for c in advancing],
            "cohort_next_run_ats": [self.advance[c][0] for c in advancing],
            "cohort_fires": [self.advance[c][1] for c in advancing],
            "dissolve_ids": gone,
            "dissolve_versions": [self.read[c].version for c in gone],
            "dissolve_cursors": [self.read[c].cursor for c in gone],
            "released_ids": [r[0] for r in self.released],
            "released_next_run_ats": [r[1] for r in self.released],
            "released_runs": [r[2] for r in self.released],
        }


@dataclass
class _Pacing:
    """The batch's catch-up releases: (schedule_id, scheduled_for) -> available_at, and those refused."""

    releases: dict[tuple[uuid.UUID, datetime], datetime] = field(default_factory=dict)
    refused: set[tuple[uuid.UUID, datetime]] = field(default_factory=set)


#: tenants.catch_up_per_minute's default, for a schedule whose tenant has no row.
DEFAULT_CATCH_UP_PER_MINUTE = 1000


_cohort_spec = functools.lru_cache(maxsize=4096)(cohort_spec)  # a burst's schedules share a few specs


def join_spec(schedule: DueSchedule, decision: timing.MisfireDecision) -> CohortSpec | None:
    """The cohort spec a schedule with its own cursor joins under at this advance, or None: only plain
    on-time work of a schedule that may share a cursor joins (engine/rules/cohorts.py)."""
    if not plain_on_time(decision):
        return None
    return _cohort_spec(
        kind=schedule.kind, expression=schedule.expression, time_zone=schedule.time_zone,
        dst_repeat=schedule.dst_repeat, dst_gap=schedule.dst_gap, anchor=schedule.anchor,
        misfire_policy=schedule.misfire_policy, max_lateness_s=schedule.max_lateness_s, end_at=schedule.end_at,
        calendar_id=schedule.calendar_id, max_runs=schedule.max_runs, overlap_policy=schedule.overlap_policy,
    )  # fmt: skip


class CalendarVersions:
    """The calendars a batch references, at their current versions, read in the batch's transaction.

    The calendars' rows are share-locked, so a calendar update is ordered
    entirely before this transaction (and used) or after it: a change applies
    to every slot not yet materialized. A version's entries never change, so
    they are kept across passes (bounded).
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._values: dict[tuple[uuid.UUID, int], ExclusionCalendar] = {}

    async def for_batch(
        self, conn: asyncpg.Connection, schedules: list[DueSchedule]
    ) -> dict[uuid.UUID, ExclusionCalendar]:
        ids = sorted({s.calendar_id for s in schedules if s.calendar_id is not None})
        if not ids:
            return {}
        current = await conn.fetch(*QUERIES.share_calendars_for_materialization(calendar_ids=ids))
        wanted = [(r["calendar_id"], r["version"]) for r in current]
        # Taken from the cache before any await: another pass in flight may clear it meanwhile.
        batch = {key: self._values[key] for key in wanted if key in self._values}
        missing = [key for key in wanted if key not in batch]
        if missing:
            found = await conn.fetch(
                *QUERIES.calendar_version_entries(
                    calendar_ids=[key[0] for key in missing], versions=[key[1] for key in missing]
                )
            )
            if len(self._values) + len(missing) > self.capacity:
                self._values.clear()
            for r in found:
                key = (r["calendar_id"], r["version"])
                batch[key] = self._values[key] = ExclusionCalendar(
                    str(r["calendar_id"]), r["version"], r["time_zone"], entries_from_stored(r["entries"])
                )
        return {key[0]: batch[key] for key in wanted if key in batch}


class Materializer:
    def __init__(
        self,
        pool: asyncpg.Pool,
        config: MaterializerConfig | None = None,
        clock: Clock | None = None,
        meter: metrics.Meter | None = None,
        tracer: trace.Tracer | None = None,
        ownership: ShardOwnership | None = None,
        hooks: MaterializerHooks | None = None,
    ) -> None:
        self.pool = pool
        self.hooks = hooks or MaterializerHooks()
        self.config = config or MaterializerConfig()
        self.config.validate()
        self.clock = clock or DatabaseClock()
        self.ownership = ownership
        self._calendars = CalendarVersions()
        meter = meter or obs.get_meter("engine")
        self.tracer = tracer or obs.get_tracer("engine")
        self._materialized = meter.create_counter(obs.OCCURRENCES_MATERIALIZED, unit="1")
        self._conflicts = meter.create_counter(obs.UNIQUENESS_CONFLICTS, unit="1")
        self._tenant_throttled = meter.create_counter(obs.TENANT_THROTTLED, unit="1")
        self._missed = meter.create_counter(obs.MISSED_OCCURRENCES, unit="1")
        self._lag = meter.create_histogram(obs.MATERIALIZATION_LAG, unit="s")
        self._backlog = meter.create_gauge(obs.DUE_BACKLOG, unit="1")
        self._excluded = meter.create_counter(obs.EXCLUDED_SLOTS, unit="1")
        self._completed = meter.create_counter(obs.SCHEDULES_COMPLETED, unit="1")
        self._catch_up = meter.create_counter(obs.CATCH_UP_ENQUEUED, unit="1")
        self._throttled = meter.create_counter(obs.CATCH_UP_THROTTLED, unit="1")
        self._cohorts = meter.create_counter(obs.COHORTS, unit="1")
        self._rounds = RoundCounter()

    async def run_once(self, share: tuple[int, int] = (0, 1)) -> MaterializeReport:
        """Materialize one batch of due schedules (up to batch_size) in one transaction. ``share`` = (k, n):
        with shard leases, only the owned shards with ``shard % n == k`` (the passes in flight never share a
        shard); without, ignored."""
        report = MaterializeReport()
        with self.tracer.start_as_current_span(obs.SPAN_MATERIALIZE) as span:
            async with self.pool.acquire() as conn, conn.transaction():
                now: datetime = await conn.fetchval(*QUERIES.current_instant(now=self.clock.now()))
                epochs = self.ownership.snapshot() if self.ownership is not None else None
                if epochs is not None:
                    k, n = share
                    epochs = {s: e for s, e in epochs.items() if s % n == k} if n > 1 else epochs
                    if not epochs:
                        return report
                # Read what is due first, without locks (an idle pass writes nothing); then lock only the
                # shards that have work, and keep only rows of shards still held at the known epoch.
                rows, due_cohorts = await self._due(conn, now, epochs)
                if not rows and not due_cohorts:
                    return report
                if self.hooks.after_read:
                    await self.hooks.after_read()
                cohorts = await self._lock_cohorts(conn, now, due_cohorts)
                if not rows and not cohorts.read:
                    return report
                shards = {r.shard for r in rows} | {c.shard for c in cohorts.read.values()}
                seals = await self._lock_shards(conn, shards, epochs)
                if self.hooks.after_lock and seals:
                    await self.hooks.after_lock()
                if seals is not None:
                    rows = [r for r in rows if (r.shard, "strict") in seals]
                    cohorts.keep_held(seals)
                    if not rows and not cohorts.read:
                        return report
                calendars = await self._calendars.for_batch(conn, rows)  # a cohort's members have no calendar
                decided, plain = self._judge_cohorts(
                    self._decide([*rows, *cohorts.representatives()], now, calendars), cohorts
                )
                pacing = await self._pace_catch_up(conn, decided, now, report)
                targets = {r.target for r in rows}.union(
                    *({m["target"] for m in ms} for ms in cohorts.members.values())
                )
                versions = await binding_versions(conn, targets)
                staged, cursors, ranges = self._plan_batch(
                    decided, now, seals, report, pacing, versions, cohorts, plain
                )
                # Schedules with their own cursor whose advance is plain on-time work join a cohort in it.
                joins = await claim_cohorts(conn, cursors[5], self.clock.now())
                # A tenant at its max_running gets its further first deliveries held in the outbox.
                staged, tenant_held = await hold_beyond_max_running(conn, staged, TENANT_HOLD_COLUMNS)
                await conn.execute(*QUERIES.create_staging())
                if staged:
                    await conn.copy_records_to_table("materialize_staging", records=staged, columns=STAGING_COLUMNS)
                written = await self._write_staged(
                    conn,
                    span,
                    dict(
                        schedule_ids=cursors[0],
                        versions=cursors[1],
                        cursors=cursors[2],
                        next_run_ats=cursors[3],
                        runs=cursors[4],
                        join_cohort_ids=[c for c, _ in joins],
                        join_cohort_bases=[b for _, b in joins],
                        range_schedule_ids=ranges[0],
                        range_versions=ranges[1],
                        range_firsts=ranges[2],
                        range_lasts=ranges[3],
                        range_counts=ranges[4],
                        gate_token=OVERLAP_GATE_TOKEN,
                        tenant_token=TENANT_GATE_TOKEN,
                        now=self.clock.now(),
                        **cohorts.arrays(),
                    ),
                )
                if self.hooks.after_write:
                    await self.hooks.after_write()
            read = len(rows) + sum(map(len, cohorts.members.values()))  # with the cohorts' members
            self._note_written(report, written, read, len(staged), cohorts)
            report.tenant_held = tenant_held
            span.set_attribute("chronoq.schedules", report.schedules)
            span.set_attribute("chronoq.occurrences", report.occurrences)
        self._count(report)
        return report

    async def _write_staged(self, conn: asyncpg.Connection, span: trace.Span, params: dict[str, Any]) -> asyncpg.Record:
        """The batch's one statement (materialize_staged), its occurrences inserted unchecked first
        (schemas.connections.unchecked_first): what the pass writes is exactly what the checked statement alone
        would have written."""

        async def run(checked: bool) -> asyncpg.Record:
            return await conn.fetchrow(*QUERIES.materialize_staged(checked=checked, **params))

        written, checked = await unchecked_first(conn, run)
        span.set_attribute("chronoq.checked_insert", checked)
        if checked:
            log.info(
                "a staged occurrence existed already; the batch written again, leaving existing ones alone",
                extra={"action": "materializer.checked_insert"},
            )
        return written

    @staticmethod
    def _note_written(
        report: MaterializeReport, written: asyncpg.Record, rows: int, staged: int, cohorts: _Cohorts
    ) -> None:
        """The pass's counts from what its statement wrote (``rows`` due schedules read, ``staged`` rows)."""
        advanced_members = sum(len(cohorts.members[c]) for c in written["cohorts"])
        report.cohorts, report.dissolved = len(written["cohorts"]), len(cohorts.dissolve)
        report.joined = written["joined"]
        if written["unplanned"]:  # members are read with their cohorts locked: none should exist
            log.error(
                "members of a dissolved cohort the pass had not read; judged by a later pass",
                extra={"action": "materializer.unplanned_members", "count": written["unplanned"]},
            )
        report.schedules = written["schedules"] + advanced_members
        report.skipped = rows - report.schedules
        report.ahead, report.late = written["ahead"], written["late"]
        report.ranges = written["ranges"]
        report.occurrences = report.ahead + report.late
        if not report.skipped:  # every staged row belonged to an advanced schedule
            report.conflicts = staged - written["occurrences"]

    def _count(self, report: MaterializeReport) -> None:
        """Metrics and logs of one pass."""
        self._materialized.add(report.occurrences)
        for result, count in (("advanced", report.cohorts), ("dissolved", report.dissolved), ("joined", report.joined)):
            if count:
                self._cohorts.add(count, {"result": result})
        for tenant_id, count in report.tenant_held.items():
            self._tenant_throttled.add(count, {"tenant_id": tenant_id})
            log.info(
                "first deliveries held: the tenant is at max_running",
                extra={"action": "tenant.throttled", "tenant_id": tenant_id, "count": count},
            )
        if report.conflicts:
            self._conflicts.add(report.conflicts)
            log.warning(
                "occurrences already existed", extra={"action": "materializer.conflicts", "count": report.conflicts}
            )
        if report.skipped:
            log.info(
                "schedules changed while materializing; left for the next pass",
                extra={"action": "materializer.skipped", "count": report.skipped},
            )
        if report.missed or report.missed_unlisted:
            self._missed.add(report.missed + report.missed_unlisted)
        if report.excluded:
            self._excluded.add(report.excluded)
        if report.completed:
            self._completed.add(report.completed_by_runs, {"reason": "max_runs"})
            self._completed.add(report.completed - report.completed_by_runs, {"reason": "exhausted"})

    async def _lock_shards(
        self, conn: asyncpg.Connection, shards: set[int], epochs: dict[int, int] | None
    ) -> dict[tuple[int, str], datetime] | None:
        """With shard leases: lock the given shards' seals (FOR SHARE) and return the seals of
        those still held at the epochs this node knows; without: None (every delivery goes late)."""
        if epochs is None or self.ownership is None:
            return None
        wanted = sorted(s for s in shards if s in epochs)
        rows = await conn.fetch(
            *QUERIES.lock_shards_for_materializing(
                shards=wanted, epochs=[epochs[s] for s in wanted], node=self.ownership.node_id, now=self.clock.now()
            )
        )
        return {(r["shard"], r["lane"]): aware(r["sealed_until"]) for r in rows}

    async def _due(
        self, conn: asyncpg.Connection, now: datetime, epochs: dict[int, int] | None
    ) -> tuple[list[DueSchedule], list[uuid.UUID]]:
        """Due schedules with their own cursor: an equal share of batch_size per shard (one statement), or any
        shard without leases; and the due cohorts, whole, about the same share of members (a pass may exceed
        batch_size by less than one cohort per shard: COHORT_CAP members at most). Nothing is locked."""
        cfg = self.config
        horizon = cfg.horizon.total_seconds()
        if epochs is None and cfg.shards is None:
            rows = await conn.fetch(*QUERIES.due_schedules_any_shard(now=now, horizon_s=horizon, limit=cfg.batch_size))
            due_cohorts = await conn.fetch(
                *QUERIES.due_cohorts_any_shard(now=now, horizon_s=horizon, limit=cfg.batch_size)
            )
        else:
            shards = sorted(epochs) if epochs is not None else sorted(cfg.shards or ())
            per_shard = max(-(-cfg.batch_size // max(len(shards), 1)), 16)
            rows = await conn.fetch(
                *QUERIES.due_schedules_of_shards(now=now, horizon_s=horizon, per_shard=per_shard, shards=shards)
            )
            due_cohorts = await conn.fetch(
                *QUERIES.due_cohorts_of_shards(now=now, horizon_s=horizon, per_shard=per_shard, shards=shards)
            )
        return [DueSchedule.from_row(row) for row in rows], [row["cohort_id"] for row in due_cohorts]

    async def _lock_cohorts(self, conn: asyncpg.Connection, now: datetime, cohort_ids: list[uuid.UUID]) -> _Cohorts:
        """Lock the due cohorts no other transaction holds, then read their members (a statement of its own,
        so its snapshot is taken after the locks: every member that left before is gone, and none can leave
        until this pass commits). Returns the cohorts as locked with their members' rows (a member's cursor
        is its cohort's); empty ones are marked to dissolve (delete)."""
        cohorts = _Cohorts()
        if not cohort_ids:
            return cohorts
        locked = await conn.fetch(
            *QUERIES.lock_due_cohorts(cohort_ids=cohort_ids, now=now, horizon_s=self.config.horizon.total_seconds())
        )
        if not locked:
            return cohorts
        members = await conn.fetch(*QUERIES.cohort_members(cohort_ids=[r["cohort_id"] for r in locked]))
        # a member names its cohort by position in `locked`, from 1 (cohort_n); slot 0 is unused
        of_cohort: list[list[asyncpg.Record]] = [[] for _ in range(len(locked) + 1)]
        for row in members:
            if row["schedule_id"] is not None:  # an empty cohort comes back once, without a member
                of_cohort[row["cohort_n"]].append(row)
        for n, r in enumerate(locked, start=1):
            cohort_id = r["cohort_id"]
            cohorts.read[cohort_id] = _CohortRead(r["shard"], r["cohort_version"], r["next_run_at"])
            cohorts.members[cohort_id] = of_cohort[n]
            cohorts.shared[cohort_id] = tuple(r[name] for name in COHORT_FIELDS)
            if not of_cohort[n]:
                cohorts.dissolve.add(cohort_id)
        return cohorts

    @staticmethod
    def _judge_cohorts(
        decided: list[_Decided], cohorts: _Cohorts
    ) -> tuple[list[_Decided], list[tuple[PlainCohort, list[asyncpg.Record]]]]:
        """Split the decided schedules: each cohort's representative (``_Cohorts.representatives``) decides for
        all its members. A cohort whose decision is plain on-time work advances once, its members planned
        from their rows (``cohort_member_rows``); any other dissolves: in this same pass each member is
        advanced as a schedule alone (missed slots, catch-up pacing and completion are per schedule), and
        keeps its own cursor from then on. Returns the schedules the general plan takes (those with their own
        cursor and the dissolving cohorts' members) and the plain cohorts with their members."""
        general: list[_Decided] = []
        plain: list[tuple[PlainCohort, list[asyncpg.Record]]] = []
        for item in decided:
            cohort_id, decision = item.schedule.cohort_id, item.decision
            if cohort_id is None:
                general.append(item)
                continue
            rows, shared = cohorts.members[cohort_id], cohorts.shared[cohort_id]
            if plain_on_time(decision):
                cohorts.advance[cohort_id] = (decision.next_run_at, len(decision.enqueue))
                read = cohorts.read[cohort_id]
                plan = PlainCohort(
                    cohort_id, read.shard, tuple(decision.enqueue), item.threshold_us, item.schedule.misfire_policy
                )
                plain.append((plan, rows))
                continue
            cohorts.dissolve.add(cohort_id)
            general.extend(
                _Decided(DueSchedule.of_member(row, shared), None, decision, item.threshold_us) for row in rows
            )
        return general, plain

    def _decide(
        self, rows: list[DueSchedule], now: datetime, calendars: dict[uuid.UUID, ExclusionCalendar] | None = None
    ) -> list[_Decided]:
        """The misfire decision of every schedule, computed once per (spec with its calendar version, cursor,
        misfire policy, runs left), with the lateness threshold its deliveries carry to the relay (microseconds)."""
        cfg = self.config
        decisions: dict[tuple[Any, ...], tuple[timing.MisfireDecision, int]] = {}
        out: list[_Decided] = []
        for schedule in rows:
            calendar = (calendars or {}).get(schedule.calendar_id) if schedule.calendar_id is not None else None
            runs_left = schedule.runs_left
            # The spec's own fields, not a TimeSpec: the record is built only once per group (a burst's
            # schedules share a few groups, and building one per schedule was a third of this loop).
            key = (schedule.kind, schedule.expression, schedule.time_zone, schedule.dst_repeat, schedule.dst_gap,
                   schedule.anchor, schedule.start_at, schedule.end_at, calendar, schedule.next_run_at,
                   schedule.misfire_policy, schedule.max_lateness_s, runs_left)  # fmt: skip
            found = decisions.get(key)
            if found is None:
                spec = dataclasses.replace(schedule.spec, calendar=calendar) if calendar is not None else schedule.spec
                policy = schedule.misfire
                found = decisions[key] = (
                    timing.decide_misfire(
                        spec,
                        schedule.next_run_at,
                        now,
                        policy,
                        cfg.horizon,
                        cfg.missed_record_limit,
                        remaining_runs=runs_left,
                        on_time_limit=cfg.on_time_limit,
                    ),
                    timing.late_threshold(policy, cfg.on_time_limit) // MICROSECOND,
                )
            out.append(_Decided(schedule, calendar, found[0], found[1]))
        for decision, _ in decisions.values():
            if decision.enqueue:
                self._lag.record(max((now - (decision.enqueue[0] - cfg.horizon)).total_seconds(), 0.0))
        return out

    async def _pace_catch_up(
        self, conn: asyncpg.Connection, decided: list[_Decided], now: datetime, report: MaterializeReport
    ) -> _Pacing:
        """Release instants of the batch's catch-up occurrences from their tenants' token buckets.

        Each tenant's bucket row is locked FOR UPDATE (tenant order: no deadlock between nodes) and written
        back in this transaction, so every node spends one shared budget. Catch-ups beyond the tokens are
        stored with a later available_at (the instant the bucket refills for them), not held back behind
        the cursor: the cursor must pass them so that on-time work after them is never delayed, and the
        decision (which late instants are the K most recent) is made once, from the durable cursor.
        A tenant whose catch_up_per_minute is 0 gets no catch-up: those instants are recorded MISSED.
        Tokens taken for a schedule whose compare-and-set then fails are not given back: the budget can
        only be underspent, never exceeded.
        """
        needs: dict[str, list[tuple[datetime, uuid.UUID]]] = {}
        for item in decided:
            for instant in item.decision.catch_up:
                needs.setdefault(item.schedule.tenant_id, []).append((instant, item.schedule.schedule_id))
        pacing = _Pacing()
        if not needs:
            return pacing
        tenants = sorted(needs)
        await conn.execute(*QUERIES.create_catch_up_buckets(tenant_ids=tenants, now=self.clock.now()))
        found = {r["tenant_id"]: r for r in await conn.fetch(*QUERIES.lock_catch_up_buckets(tenant_ids=tenants))}
        stored: tuple[list[Any], ...] = ([], [], [])
        for tenant in tenants:
            row = found.get(tenant)
            if row is None:  # no tenant row (nothing to lock or store): the default quota, this pass only
                bucket = full_bucket(DEFAULT_CATCH_UP_PER_MINUTE, now)
            else:
                rate = row["catch_up_per_minute"]
                bucket = TokenBucket(rate, rate, min(Fraction(row["tokens"]), Fraction(rate)), row["updated_at"])
            bucket = self._pace_tenant(tenant, sorted(needs[tenant]), bucket, now, pacing, report)
            if row is not None:
                stored[0].append(tenant)
                stored[1].append(float(bucket.tokens))
                stored[2].append(bucket.updated_at)
        if stored[0]:
            await conn.execute(
                *QUERIES.store_catch_up_buckets(tenant_ids=stored[0], tokens=stored[1], updated_ats=stored[2])
            )
        return pacing

    def _pace_tenant(
        self,
        tenant: str,
        wanted: list[tuple[datetime, uuid.UUID]],
        bucket: TokenBucket,
        now: datetime,
        pacing: _Pacing,
        report: MaterializeReport,
    ) -> TokenBucket:
        """One tenant's catch-ups (oldest instant first) from its bucket; returns the bucket afterwards."""
        if bucket.rate_per_minute == 0:
            granted, bucket = take(bucket, now, len(wanted))
            times = [now] * granted
        else:
            times, bucket = reserve(bucket, now, len(wanted))
        for (instant, schedule_id), release in zip(wanted, times, strict=False):
            pacing.releases[(schedule_id, instant)] = release
        for instant, schedule_id in wanted[len(times) :]:
            pacing.refused.add((schedule_id, instant))
        throttled = sum(1 for t in times if t > now)
        report.catch_up += len(times)
        report.throttled += throttled
        report.catch_up_refused += len(wanted) - len(times)
        self._catch_up.add(len(times), {"tenant_id": tenant})
        if throttled:
            self._throttled.add(throttled, {"tenant_id": tenant})
            log.info(
                "catch-up paced by the tenant's catch_up_per_minute",
                extra={
                    "action": "occurrence.catch_up_throttled",
                    "tenant_id": tenant,
                    "count": throttled,
                    "last_release": times[-1].isoformat(),
                },
            )
        if len(times) < len(wanted):
            log.warning(
                "catch-up refused: the tenant's catch_up_per_minute is 0; recorded MISSED",
                extra={"action": "occurrence.catch_up_refused", "tenant_id": tenant, "count": len(wanted) - len(times)},
            )
        return bucket

    def _plan_batch(
        self,
        decided: list[_Decided],
        now: datetime,
        seals: dict[tuple[int, str], datetime] | None,
        report: MaterializeReport,
        pacing: _Pacing | None = None,
        versions: dict[str, int] | None = None,
        cohorts: _Cohorts | None = None,
        plain: list[tuple[PlainCohort, list[asyncpg.Record]]] | None = None,
    ) -> tuple[list[tuple[Any, ...]], tuple[list[Any], ...], tuple[list[Any], ...]]:
        """Staged occurrence rows, the cursor arrays (ids, versions, cursors read, new cursors, new runs, and
        for claim_cohorts (tenant, shard, cohort spec or None, new cursor)) and
        the missed ranges (ids, versions, first, last, count). ``versions``: each target's binding version,
        which its occurrence messages carry. ``decided`` are schedules with their own cursor and the members
        of dissolving cohorts; ``plain`` the cohorts that advance (their new cursor and fires already in
        ``cohorts.advance``), whose members' rows follow the others' (``cohort_member_rows``).

        The per-occurrence work is what a burst multiplies: ids, message bytes, bucket and round. Whatever
        depends only on the schedule or only on the instant is computed once.
        """
        staged: list[tuple[Any, ...]] = []
        cursors: tuple[list[Any], ...] = ([], [], [], [], [], [])
        ranges: tuple[list[Any], ...] = ([], [], [], [], [])
        instants: dict[datetime, InstantParts] = {}
        # the seals in the staged rows' terms (epoch microseconds), once per pass
        seals_us = {key: micros_of(seal) for key, seal in seals.items()} if seals is not None else None
        pacing = pacing or _Pacing()
        take_round = self._rounds.take
        for item in decided:
            schedule, decision = item.schedule, item.decision
            binding_version = versions.get(schedule.target) if versions else None
            rows, refused = self._occurrences(item, seals_us, instants, take_round, pacing, binding_version)
            staged.extend(rows)
            report.missed += len(decision.missed) + refused
            if decision.missed or decision.missed_unlisted:
                report.missed_unlisted += decision.missed_unlisted or 0
                log.warning(
                    "missed occurrences recorded",
                    extra={
                        "action": "occurrence.missed",
                        "schedule_id": str(schedule.schedule_id),
                        "tenant_id": schedule.tenant_id,
                        "listed": len(decision.missed),
                        "unlisted": decision.missed_unlisted,
                    },
                )
            runs = len(decision.enqueue) - refused  # its new runs (an existing occurrence cannot be here: the
            # compare-and-set advance lets one materializer per cursor position write)
            summary = decision.missed_range
            if summary is not None:
                ranges[0].append(schedule.schedule_id)
                ranges[1].append(schedule.version)
                ranges[2].append(summary.first)
                ranges[3].append(summary.last)
                ranges[4].append(summary.count)
            if schedule.cohort_id is not None and cohorts is not None:  # its cohort dissolves: it leaves alone
                cohorts.released.append((schedule.schedule_id, decision.next_run_at, runs))
            else:
                cursors[0].append(schedule.schedule_id)
                cursors[1].append(schedule.version)
                cursors[2].append(schedule.next_run_at)
                cursors[3].append(decision.next_run_at)
                cursors[4].append(runs)
                cursors[5].append(
                    (schedule.tenant_id, schedule.shard, join_spec(schedule, decision), decision.next_run_at)
                )  # where it may join a cohort (claim_cohorts)
            self._note_outcome(schedule, decision, item.calendar, report)
            report.completed += decision.next_run_at is None
        for cohort, members in plain or ():
            staged.extend(cohort_member_rows(cohort, members, seals_us, instants, take_round, versions))
        return staged, cursors, ranges

    @staticmethod
    def _note_outcome(
        schedule: DueSchedule,
        decision: timing.MisfireDecision,
        calendar: ExclusionCalendar | None,
        report: MaterializeReport,
    ) -> None:
        """Count and log what a calendar excluded and a schedule that completes."""
        if decision.excluded:
            report.excluded += decision.excluded
            log.info(
                "slots excluded by the schedule's calendar",
                extra={
                    "action": "occurrence.excluded",
                    "schedule_id": str(schedule.schedule_id),
                    "tenant_id": schedule.tenant_id,
                    "count": decision.excluded,
                    "calendar_version": calendar.version if calendar is not None else None,
                },
            )
        if decision.next_run_at is None:
            report.completed_by_runs += decision.runs_exhausted
            log.info(
                "schedule completed",
                extra={
                    "action": "schedule.completed",
                    "schedule_id": str(schedule.schedule_id),
                    "tenant_id": schedule.tenant_id,
                    "reason": "max_runs" if decision.runs_exhausted else "exhausted",
                },
            )

    @staticmethod
    def _occurrences(
        item: _Decided,
        seals_us: dict[tuple[int, str], int] | None,
        instants: dict[datetime, InstantParts],
        take_round: Any,
        pacing: _Pacing,
        binding_version: int | None = None,
    ) -> tuple[list[tuple[Any, ...]], int]:
        """The staging rows of one schedule's decision (column order: STAGING_COLUMNS), and how many of its
        catch-ups were refused (recorded MISSED: the tenant's catch_up_per_minute is 0).

        On-time deliveries carry ``late_after`` (available_at + the lateness threshold) and the policy, for
        the relays' check at dispatch (not those the overlap gate holds: it decides when they go).
        Catch-up deliveries carry neither (late by design, the token bucket paces them), wait in the late
        lane until their release and never take the ahead lane: recovery runs in the late relay's
        capacity, apart from on-time strict work.
        """
        schedule, decision = item.schedule, item.decision
        schedule_id, version, tenant, target, shard, cohort_id = (
            schedule.schedule_id,
            schedule.version,
            schedule.tenant_id,
            schedule.target,
            schedule.shard,
            schedule.cohort_id,
        )
        topic = occurrence_topic(target)
        ids = OccurrenceIds(schedule_id, version)
        message_key = schedule_key(ids.schedule_text)
        held = schedule.gated
        lane = lane_of(schedule.priority)
        window = schedule.flexible_window if lane == "flexible" else None
        deadline = schedule.deadline
        seal_us = seals_us.get((shard, lane)) if seals_us is not None else None
        threshold_us, policy_text = item.threshold_us, schedule.misfire_policy
        catch_up = set(decision.catch_up) if decision.catch_up else ()
        refused: list[datetime] = []
        out: list[tuple[Any, ...]] = []
        for scheduled_for in decision.enqueue:
            cached = instants.get(scheduled_for)
            if cached is None:
                cached = instants[scheduled_for] = instant_parts(scheduled_for)
            occ_id = ids.of(cached[0])
            scheduled_us = cached[1]
            if window is not None:
                jitter = timing.jitter_offset(occ_id, window)
                available_at, available_us = scheduled_for + jitter, scheduled_us + jitter // MICROSECOND
                bucket_us = bucket_of_micros(available_us)
            else:
                available_at, available_us, bucket_us = scheduled_for, scheduled_us, cached[2]
            # held rows wait for the overlap gate by design: the gate, not lateness, decides when they go
            late_after_us: int | None = None if held else available_us + threshold_us
            recovering = scheduled_for in catch_up
            if recovering:
                release = pacing.releases.get((schedule_id, scheduled_for))
                if release is None:
                    refused.append(scheduled_for)
                    continue
                if release > available_at:
                    available_at, available_us = release, micros_of(release)
                bucket_us, late_after_us = bucket_of_micros(available_us), None
            message = encode_occurrence(
                occ_id, ids.schedule_text, schedule, scheduled_for, available_at,
                scheduled_for + deadline if deadline else None, binding_version,
            )  # fmt: skip
            # Ahead only if this node holds the shard and the relay has not sealed past the instant;
            # held rows wait for the overlap gate, which works on the outbox; catch-ups go late.
            ahead = seal_us is not None and not held and not recovering and bucket_us >= seal_us
            wrr_round = take_round((shard, lane, bucket_us), tenant, schedule.weight) if ahead else 0
            out.append(
                (occ_id, schedule_id, version, tenant, target, scheduled_us, available_us, "SCHEDULED", topic,
                 message_key, message, held, ahead, shard, lane, bucket_us, wrr_round, late_after_us,
                 policy_text if late_after_us is not None else None, False, cohort_id)
            )  # fmt: skip
        for scheduled_for in [*decision.missed, *refused] if decision.missed or refused else ():
            missed_text, missed_us, missed_bucket_us = instant_parts(scheduled_for)
            out.append(
                (ids.of(missed_text), schedule_id, version, tenant, target, missed_us, missed_us, "MISSED", topic,
                 message_key, b"", held, False, shard, lane, missed_bucket_us, 0, None, None, False, cohort_id)
            )  # fmt: skip
        return out, len(refused)

    async def record_backlog(self) -> int:
        """Record (and return) how many active schedules are already due: work not caught up with."""
        count = await self.pool.fetchval(*QUERIES.due_backlog(now=self.clock.now()))
        self._backlog.set(count)
        return count

    async def run_pass(self, share: tuple[int, int] = (0, 1)) -> PassOutcome:
        report = await self.run_once(share)
        return PassOutcome(
            {
                "schedules": report.schedules,
                "occurrences": report.occurrences,
                "ahead": report.ahead,
                "missed": report.missed + report.missed_unlisted,
                "conflicts": report.conflicts,
                "skipped": report.skipped,
            },
            more=report.schedules + report.skipped >= self.config.batch_size,
        )

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Materialize until ``stop`` is set (the periodic skeleton: errors are logged and retried), with
        ``passes_in_flight`` passes at once on disjoint shares of the leased shards."""
        timing_ = LoopTiming(self.config.idle_interval, summary_every=summary_every)
        n = self.config.passes_in_flight if self.ownership is not None else 1
        loops = [
            PeriodicLoop(
                "materializer",  # every pass in flight: its log actions (materializer.error...) stay one name
                functools.partial(self.run_pass, (k, n)),
                timing_,
                log,
                gauges=self._gauges if k == 0 else None,  # one backlog count per node
            )
            for k in range(n)
        ]
        await asyncio.gather(*(loop.run(stop) for loop in loops))

    async def _gauges(self) -> dict[str, int]:
        return {"backlog": await self.record_backlog()}

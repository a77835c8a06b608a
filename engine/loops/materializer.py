"""The materializer: turns due schedules into occurrences and outbox rows.

Guarantee: for each schedule it processes, ONE transaction inserts the
occurrences (SCHEDULED, or MISSED per the misfire policy), writes an outbox
row for every SCHEDULED occurrence it actually inserted, and advances
``next_run_at`` only if the schedule's version is still the one it read.
Occurrence ids are deterministic and unique per (schedule, version,
scheduled_for), so two materializers that overlap (SKIP LOCKED keeps them apart
in the common case) can never produce a second occurrence or outbox row.

Work is bounded: it materializes only a horizon ahead of now, and recovery
after an outage resumes from the durable cursor with the misfire decision
(``timing.decide_misfire``) doing bounded work however long the outage was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from opentelemetry import metrics, trace

from engine.loops.overlap_gate import OVERLAP_GATE_TOKEN
from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import SUMMARY_EVERY
from engine.records import DueSchedule
from engine.rules import timing
from engine.rules.exclusion_calendars import ExclusionCalendar, entries_from_stored
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.identity import occurrence_id
from schemas.messages import OccurrenceMessage
from schemas.queries import QUERIES
from schemas.topics import occurrence_topic, partition_key

log = logging.getLogger("chronoq.materializer")


@dataclass(frozen=True)
class MaterializerConfig:
    """Materializer tuning.

    horizon: how far ahead of now fires are materialized (default 30 s). It
        must cover a materializer failover plus the time to write a burst, so
        the relay finds hour-top occurrences already in the outbox.
    batch_size: schedules claimed per transaction (default 500).
    idle_interval: seconds to wait when nothing was due (default 0.25).
    missed_record_limit: MISSED occurrences written per schedule per pass;
        further missed instants are counted and logged, never enumerated.
    shards: logical shards this node materializes (None = all).
    """

    horizon: timedelta = timedelta(seconds=30)
    batch_size: int = 500
    idle_interval: float = 0.25
    missed_record_limit: int = 1000
    shards: tuple[int, ...] | None = None

    def validate(self) -> None:
        if self.horizon < timedelta(0):
            raise ValueError("horizon must not be negative")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")


@dataclass
class MaterializeReport:
    schedules: int = 0
    occurrences: int = 0
    missed: int = 0
    missed_unlisted: int = 0
    excluded: int = 0  # fires exclusion calendars removed
    completed_by_runs: int = 0  # of `completed`: schedules whose last run (max_runs) was materialized
    conflicts: int = 0
    completed: int = 0
    notes: list[str] = field(default_factory=list)


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
        missing = [key for key in wanted if key not in self._values]
        if missing:
            if len(self._values) + len(missing) > self.capacity:
                self._values.clear()
            found = await conn.fetch(
                *QUERIES.calendar_version_entries(
                    calendar_ids=[key[0] for key in missing], versions=[key[1] for key in missing]
                )
            )
            for r in found:
                self._values[(r["calendar_id"], r["version"])] = ExclusionCalendar(
                    str(r["calendar_id"]), r["version"], r["time_zone"], entries_from_stored(r["entries"])
                )
        return {key[0]: self._values[key] for key in wanted if key in self._values}


class _Batch:
    """The column arrays of one insert_occurrences call, by parameter name."""

    COLUMNS = (
        "occurrence_ids",
        "schedule_ids",
        "schedule_versions",
        "tenant_ids",
        "targets",
        "scheduled_fors",
        "available_ats",
        "states",
        "topics",
        "message_keys",
        "messages",
        "held",
    )

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in self.COLUMNS}

    def add(
        self,
        schedule: DueSchedule,
        scheduled_for: datetime,
        available_at: datetime,
        state: str,
        message: OccurrenceMessage | None,
    ) -> None:
        values = {
            "occurrence_ids": message.occurrence_id
            if message
            else occurrence_id(schedule.schedule_id, schedule.version, scheduled_for),
            "schedule_ids": schedule.schedule_id,
            "schedule_versions": schedule.version,
            "tenant_ids": schedule.tenant_id,
            "targets": schedule.target,
            "scheduled_fors": scheduled_for,
            "available_ats": available_at,
            "states": state,
            "topics": occurrence_topic(schedule.target),
            "message_keys": partition_key(schedule.tenant_id),
            "messages": message.encode() if message else b"",
            "held": schedule.gated,
        }
        for name, value in values.items():
            self.columns[name].append(value)

    def __len__(self) -> int:
        return len(self.columns["occurrence_ids"])


class Materializer:
    def __init__(
        self,
        pool: asyncpg.Pool,
        config: MaterializerConfig | None = None,
        clock: Clock | None = None,
        meter: metrics.Meter | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.pool = pool
        self.config = config or MaterializerConfig()
        self._calendars = CalendarVersions()
        self.config.validate()
        self.clock = clock or DatabaseClock()
        meter = meter or obs.get_meter("engine")
        self.tracer = tracer or obs.get_tracer("engine")
        self._materialized = meter.create_counter(obs.OCCURRENCES_MATERIALIZED, unit="1")
        self._conflicts = meter.create_counter(obs.UNIQUENESS_CONFLICTS, unit="1")
        self._missed = meter.create_counter(obs.MISSED_OCCURRENCES, unit="1")
        self._lag = meter.create_histogram(obs.MATERIALIZATION_LAG, unit="s")
        self._backlog = meter.create_gauge(obs.DUE_BACKLOG, unit="1")
        self._excluded = meter.create_counter(obs.EXCLUDED_SLOTS, unit="1")
        self._completed = meter.create_counter(obs.SCHEDULES_COMPLETED, unit="1")

    async def run_once(self) -> MaterializeReport:
        """Materialize one batch of due schedules in one transaction."""
        report = MaterializeReport()
        cfg = self.config
        with self.tracer.start_as_current_span(obs.SPAN_MATERIALIZE) as span:
            async with self.pool.acquire() as conn, conn.transaction():
                now: datetime = await conn.fetchval(*QUERIES.current_instant(now=self.clock.now()))
                rows = [
                    DueSchedule.from_row(row)
                    for row in await conn.fetch(
                        *QUERIES.claim_due_schedules(
                            now=now,
                            horizon_s=cfg.horizon.total_seconds(),
                            limit=cfg.batch_size,
                            shards=list(cfg.shards) if cfg.shards is not None else None,
                        )
                    )
                ]
                if not rows:
                    return report
                calendars = await self._calendars.for_batch(conn, rows)
                batch = _Batch()
                cursors: list[datetime | None] = []
                for schedule in rows:
                    calendar = calendars.get(schedule.calendar_id) if schedule.calendar_id is not None else None
                    cursors.append(self._plan(schedule, now, batch, report, calendar))
                    report.completed += cursors[-1] is None
                written = await conn.fetchrow(
                    *QUERIES.insert_occurrences(**batch.columns, gate_token=OVERLAP_GATE_TOKEN, now=self.clock.now())
                )
                # Runs are counted from what was really inserted (an existing occurrence is no new run).
                runs = dict(zip(written["run_schedule_ids"] or (), written["run_counts"] or (), strict=True))
                await conn.execute(
                    *QUERIES.advance_schedules(
                        schedule_ids=[s.schedule_id for s in rows],
                        versions=[s.version for s in rows],
                        next_run_ats=cursors,
                        runs=[runs.get(s.schedule_id, 0) for s in rows],
                        now=self.clock.now(),
                    )
                )
            report.schedules = len(rows)
            report.occurrences = written["outbox_rows"]
            report.conflicts = len(batch) - written["occurrences"]
            span.set_attribute("chronoq.schedules", report.schedules)
            span.set_attribute("chronoq.occurrences", report.occurrences)
        self._materialized.add(report.occurrences)
        if report.conflicts:
            self._conflicts.add(report.conflicts)
            log.warning(
                "occurrences already existed", extra={"action": "materializer.conflicts", "count": report.conflicts}
            )
        if report.missed or report.missed_unlisted:
            self._missed.add(report.missed + report.missed_unlisted)
        if report.excluded:
            self._excluded.add(report.excluded)
        if report.completed:
            self._completed.add(report.completed_by_runs, {"reason": "max_runs"})
            self._completed.add(report.completed - report.completed_by_runs, {"reason": "exhausted"})
        return report

    def _plan(
        self,
        schedule: DueSchedule,
        now: datetime,
        batch: _Batch,
        report: MaterializeReport,
        calendar: ExclusionCalendar | None = None,
    ) -> datetime | None:
        """Add this schedule's occurrences to the batch; return its new cursor (None: it completes)."""
        decision = timing.decide_misfire(
            dataclasses.replace(schedule.spec, calendar=calendar),
            schedule.next_run_at,
            now,
            schedule.misfire,
            self.config.horizon,
            self.config.missed_record_limit,
            remaining_runs=schedule.runs_left,
        )
        window, deadline = schedule.flexible_window, schedule.deadline
        for scheduled_for in decision.enqueue:
            occ_id = occurrence_id(schedule.schedule_id, schedule.version, scheduled_for)
            available_at = scheduled_for
            if schedule.priority == "flexible":
                available_at += timing.jitter_offset(occ_id, window)
            message = OccurrenceMessage(
                occurrence_id=occ_id,
                schedule_id=schedule.schedule_id,
                schedule_version=schedule.version,
                tenant_id=schedule.tenant_id,
                target=schedule.target,
                scheduled_for=scheduled_for,
                available_at=available_at,
                attempt=1,
                priority=schedule.priority,
                deadline=scheduled_for + deadline if deadline else None,
                payload=schedule.payload,
            )
            batch.add(schedule, scheduled_for, available_at, "SCHEDULED", message)
            lag = (now - (scheduled_for - self.config.horizon)).total_seconds()
            self._lag.record(max(lag, 0.0))
        for scheduled_for in decision.missed:
            batch.add(schedule, scheduled_for, scheduled_for, "MISSED", None)
        report.missed += len(decision.missed)
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
        if decision.missed or decision.missed_unlisted:
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
            report.missed_unlisted += decision.missed_unlisted or 0
        return decision.next_run_at

    async def record_backlog(self) -> int:
        """Record (and return) how many active schedules are already due: work not caught up with."""
        count = await self.pool.fetchval(*QUERIES.due_backlog(now=self.clock.now()))
        self._backlog.set(count)
        return count

    async def run_pass(self) -> PassOutcome:
        report = await self.run_once()
        return PassOutcome(
            {
                "schedules": report.schedules,
                "occurrences": report.occurrences,
                "missed": report.missed + report.missed_unlisted,
                "conflicts": report.conflicts,
                "excluded": report.excluded,
            },
            more=report.schedules >= self.config.batch_size,
        )

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Materialize until ``stop`` is set (the periodic skeleton: errors are logged and retried)."""
        timing = LoopTiming(self.config.idle_interval, summary_every=summary_every)
        await PeriodicLoop("materializer", self.run_pass, timing, log, gauges=self._gauges).run(stop)

    async def _gauges(self) -> dict[str, int]:
        return {"backlog": await self.record_backlog()}

"""History retention: finished occurrences past their tenant's retention move, with their attempts, into the archive.

The policy is a global default (``history_retention``, 30 days after migration 0013) and an optional
per-tenant override (``tenants.history_keep_s``). An occurrence may go when it is final
(:data:`engine.rules.occurrence_states.TERMINAL`: SUCCEEDED, MISSED, CANCELED, SKIPPED_OVERLAP), was
scheduled before ``now - retention`` and nothing still hands it off (no unsent outbox row, no ahead-lane
queue row, no open stuck watch). Not-final occurrences, and DEAD ones (an operator may still replay them),
are never moved, however old.

Two ways out of the hot tables (both in :func:`prune`, days first):

* **whole days** (migration 0016): a day partition of ``occurrences``/``attempts`` older than the default
  retention moves into the archive with DDL (``chronoq_archive_day``: detach, keep hot what must stay,
  attach to the archive): no per-row WAL, no dead tuples. What must stay hot (not final, DEAD, in a
  handoff, or of a tenant whose override is longer) goes back into the hot tables' DEFAULT partition;
* **batches**: rows in the DEFAULT partition (days from before partitioning, rows kept hot by a day
  move), and the rows of tenants whose override is shorter than the default, wherever they are.

So a tenant on the default retention keeps its history at least ``keep`` and at most ``keep`` + 1 day.

Guarantee: :func:`prune` works in bounded batches, each one transaction that locks up to ``batch_size``
such occurrences (``FOR UPDATE SKIP LOCKED``), moves their attempts and them into ``archive.*``, deletes
their delivered outbox rows and resolved stuck watches, and advances the tenant's archive horizon. A pruner
killed, or its backend terminated, at any point leaves every occurrence and attempt in exactly one of the
hot table and the archive: nothing lost, nothing doubled; running it again continues. Readers (schedule
occurrences, an occurrence with its attempts, the reconciler) read both tables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import asyncpg
from opentelemetry import metrics, trace

from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.errors import InvalidInput, NotFound
from schemas.messages import format_instant
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.history")

#: The shortest retention accepted (the schema's CHECK): an hour keeps everything a reader of the last
#: runs, the stuck-occurrence watch and the reconciler's usual windows look at.
MIN_RETENTION = timedelta(hours=1)


@dataclass
class TenantPrune:
    """One tenant's part of a prune: its retention, its cutoff, and what moved (or would move)."""

    tenant_id: str
    keep_s: int
    overridden: bool
    cutoff: datetime
    occurrences: int = 0
    attempts: int = 0
    oldest: datetime | None = None
    newest: datetime | None = None
    #: Occurrences scheduled before the cutoff that stay hot, by state (not final, DEAD, or in a handoff).
    kept: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "retention_s": self.keep_s,
            "override": self.overridden,
            "cutoff": format_instant(self.cutoff),
            "occurrences": self.occurrences,
            "attempts": self.attempts,
            "oldest": format_instant(self.oldest) if self.oldest else None,
            "newest": format_instant(self.newest) if self.newest else None,
            "kept": dict(self.kept),
        }


@dataclass
class DayMove:
    """One day partition moved (or, in a dry run, that would move) into the archive whole."""

    day: date
    occurrences: int = 0
    attempts: int = 0
    #: Occurrences of the day that stay hot (back in the DEFAULT partition), by state in a dry run.
    kept: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "day": self.day.isoformat(),
            "occurrences": self.occurrences,
            "attempts": self.attempts,
            "kept": dict(self.kept),
        }


@dataclass
class PruneReport:
    """What a prune moved (or, in a dry run, would move), per tenant, and in how many batches."""

    dry_run: bool
    as_of: datetime
    tenants: list[TenantPrune] = field(default_factory=list)
    #: Day partitions moved whole (before the batches).
    days: list[DayMove] = field(default_factory=list)
    batches: int = 0
    #: False when ``max_batches`` stopped the run before everything prunable had moved.
    complete: bool = True

    @property
    def occurrences(self) -> int:
        return sum(t.occurrences for t in self.tenants) + sum(d.occurrences for d in self.days)

    @property
    def attempts(self) -> int:
        return sum(t.attempts for t in self.tenants) + sum(d.attempts for d in self.days)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "as_of": format_instant(self.as_of),
            "occurrences": self.occurrences,
            "attempts": self.attempts,
            "batches": self.batches,
            "complete": self.complete,
            "days": [d.to_json() for d in self.days],
            "tenants": [t.to_json() for t in self.tenants],
        }

    def lines(self) -> list[str]:
        verb = "would archive" if self.dry_run else "archived"
        out = [f"history prune as of {format_instant(self.as_of)}" + (" (dry run)" if self.dry_run else "")]
        for d in self.days:
            kept = ", ".join(f"{state} {n}" for state, n in sorted(d.kept.items())) or "none"
            out.append(
                f"  day {d.day.isoformat()} (whole partition): {verb} {d.occurrences} occurrences,"
                f" {d.attempts} attempts; kept hot {kept}"
            )
        for t in self.tenants:
            kept = ", ".join(f"{state} {n}" for state, n in sorted(t.kept.items())) or "none"
            span = (
                f" scheduled {format_instant(t.oldest)} .. {format_instant(t.newest)}" if t.oldest and t.newest else ""
            )
            out.append(
                f"  {t.tenant_id}: retention {_duration(t.keep_s)}{' (override)' if t.overridden else ''},"
                f" before {format_instant(t.cutoff)}: {verb} {t.occurrences} occurrences, {t.attempts} attempts"
                f"{span}; kept hot {kept}"
            )
        out.append(
            f"{verb} {self.occurrences} occurrences and {self.attempts} attempts"
            + ("" if self.dry_run else f" in {self.batches} batches")
            + ("" if self.complete else " (stopped at --max-batches; run again to continue)")
        )
        return out


def _duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def retention_seconds(keep: timedelta, field_name: str = "keep") -> int:
    """``keep`` as whole seconds; InvalidInput naming ``field_name`` when shorter than :data:`MIN_RETENTION`."""
    if keep < MIN_RETENTION:
        raise InvalidInput(field_name, f"must be at least {_duration(int(MIN_RETENTION.total_seconds()))}", "30d")
    return int(keep.total_seconds())


async def set_retention(
    pool: asyncpg.Pool, keep: timedelta | None, *, tenant_id: str | None = None, clock: Clock | None = None
) -> dict[str, Any]:
    """Set the global default (``tenant_id`` None) or a tenant's override; ``keep`` None clears the override."""
    if tenant_id is None:
        if keep is None:
            raise InvalidInput("keep", "the global default cannot be cleared, only changed", "--keep 30d")
        keep_s = await pool.fetchval(
            *QUERIES.set_retention_default(keep_s=retention_seconds(keep), now=(clock or DatabaseClock()).now())
        )
        return {"default_retention_s": keep_s}
    row = await pool.fetchrow(
        *QUERIES.set_tenant_retention(tenant_id=tenant_id, keep_s=None if keep is None else retention_seconds(keep))
    )
    if row is None:
        raise NotFound("tenant", tenant_id)
    return {"tenant_id": row["tenant_id"], "retention_s": row["history_keep_s"]}


async def retention_policy(pool: asyncpg.Pool, clock: Clock | None = None) -> dict[str, Any]:
    """The global default and every tenant's retention and current cutoff."""
    now = (clock or DatabaseClock()).now()
    default = await pool.fetchval(*QUERIES.retention_policy())
    rows = await pool.fetch(*QUERIES.retention_cutoffs(now=now))
    return {
        "default_retention_s": default,
        "tenants": [
            {
                "tenant_id": r["tenant_id"],
                "retention_s": r["keep_s"],
                "override": r["overridden"],
                "cutoff": format_instant(r["cutoff"]),
            }
            for r in rows
        ],
    }


class HistoryMetrics:
    def __init__(self, meter: metrics.Meter | None = None) -> None:
        meter = meter or obs.get_meter("history")
        self._archived = meter.create_counter(
            obs.HISTORY_ARCHIVED, unit="1", description="rows moved from the hot tables into the archive"
        )
        self._days = meter.create_counter(
            obs.HISTORY_DAYS_ARCHIVED, unit="1", description="day partitions moved whole into the archive"
        )

    def record(self, tenant_id: str, occurrences: int, attempts: int) -> None:
        self._archived.add(occurrences, {"table": "occurrences", "tenant_id": tenant_id})
        self._archived.add(attempts, {"table": "attempts", "tenant_id": tenant_id})

    def record_day(self, occurrences: int, attempts: int) -> None:
        self._days.add(1)
        self._archived.add(occurrences, {"table": "occurrences", "tenant_id": "*"})
        self._archived.add(attempts, {"table": "attempts", "tenant_id": "*"})


async def prune(
    pool: asyncpg.Pool,
    *,
    clock: Clock | None = None,
    dry_run: bool = False,
    batch_size: int = 1000,
    max_batches: int | None = None,
    tenant_id: str | None = None,
    on_batch: Callable[[str, int, int], None] | None = None,
    meter: metrics.Meter | None = None,
    tracer: trace.Tracer | None = None,
) -> PruneReport:
    """Move every tenant's (or ``tenant_id``'s) prunable occurrences into the archive, ``batch_size`` per
    transaction; with ``dry_run`` only count them (and what stays hot). ``on_batch(tenant, occurrences,
    attempts)`` is called after each committed batch. Stops after ``max_batches`` batches if given."""
    if batch_size < 1:
        raise InvalidInput("batch_size", "must be at least 1", "--batch 1000")
    if max_batches is not None and max_batches < 1:
        raise InvalidInput("max_batches", "must be at least 1", "--max-batches 100")
    clock = clock or DatabaseClock()
    tracer = tracer or obs.get_tracer("history")
    recorder = HistoryMetrics(meter)
    with tracer.start_as_current_span(obs.SPAN_HISTORY_PRUNE) as span:
        now = clock.now()
        as_of = await pool.fetchval(*QUERIES.current_instant(now=now))
        report = PruneReport(dry_run, as_of)
        if tenant_id is None:  # a day holds every tenant's rows: only a prune of all tenants moves days
            await _move_days(pool, report, as_of, dry_run, recorder)
        cutoffs = [
            r for r in await pool.fetch(*QUERIES.retention_cutoffs(now=as_of)) if tenant_id in (None, r["tenant_id"])
        ]
        if tenant_id is not None and not cutoffs:
            raise NotFound("tenant", tenant_id)
        for row in cutoffs:
            tenant = TenantPrune(row["tenant_id"], row["keep_s"], row["overridden"], row["cutoff"])
            report.tenants.append(tenant)
            bounds = {"tenant_id": tenant.tenant_id, "cutoff": tenant.cutoff}
            # Day partitions are the day moves' (above), except for a tenant whose retention is shorter.
            scope = {**bounds, "everywhere": row["shorter"]}
            if dry_run:
                moving = [d.day for d in report.days]
                summary = await pool.fetchrow(*QUERIES.prunable_summary(**scope, moving_days=moving))
                tenant.occurrences, tenant.attempts = summary["occurrences"], summary["attempts"]
                tenant.oldest, tenant.newest = summary["oldest"], summary["newest"]
            else:
                while report.complete:
                    if max_batches is not None and report.batches >= max_batches:
                        report.complete = False
                        break
                    moved = await _prune_batch(pool, tenant, batch_size, as_of, row["shorter"])
                    if moved is None:
                        break
                    report.batches += 1
                    recorder.record(tenant.tenant_id, *moved)
                    if on_batch is not None:
                        on_batch(tenant.tenant_id, *moved)
            tenant.kept = {r["state"]: r["occurrences"] for r in await pool.fetch(*QUERIES.kept_summary(**bounds))}
        span.set_attribute("chronoq.dry_run", dry_run)
        span.set_attribute("chronoq.occurrences", report.occurrences)
        span.set_attribute("chronoq.batches", report.batches)
    return report


async def _move_days(
    pool: asyncpg.Pool, report: PruneReport, now: datetime, dry_run: bool, recorder: HistoryMetrics
) -> None:
    """Move (or, in a dry run, count) every day partition wholly older than the default retention, oldest
    first, one transaction each. Today's partition never moves: its day is not over."""
    keep_s: int = await pool.fetchval(*QUERIES.retention_policy())
    cutoff = now - timedelta(seconds=keep_s)
    today = now.astimezone(UTC).date()
    for row in await pool.fetch(*QUERIES.hot_day_partitions()):
        day: date = row["day"]
        if day >= today or datetime.combine(day + timedelta(days=1), time(), UTC) > cutoff:
            continue
        move = DayMove(day)
        report.days.append(move)
        if dry_run:
            counts = await pool.fetchrow(*QUERIES.day_partition_rows(day=day))
            move.occurrences, move.attempts = counts["occurrences"], counts["attempts"]
            kept = await pool.fetch(*QUERIES.day_partition_kept(day=day, default_keep_s=keep_s, now=now))
            move.kept = {r["state"]: r["occurrences"] for r in kept}
            move.occurrences -= sum(r["occurrences"] for r in kept)
            move.attempts -= sum(r["attempts"] for r in kept)
            continue
        async with pool.acquire() as conn, conn.transaction():
            moved = await conn.fetchrow(*QUERIES.archive_day(day=day, default_keep_s=keep_s, now=now))
        move.occurrences, move.attempts = moved["occurrences"], moved["attempts"]
        move.kept = {"kept": moved["kept"]} if moved["kept"] else {}
        recorder.record_day(move.occurrences, move.attempts)
        log.info(
            "history day moved to the archive",
            extra={
                "action": "history.day_archived",
                "day": day.isoformat(),
                "occurrences": move.occurrences,
                "attempts": move.attempts,
                "kept": moved["kept"],
            },
        )


async def _prune_batch(
    pool: asyncpg.Pool, tenant: TenantPrune, limit: int, now: datetime, everywhere: bool
) -> tuple[int, int] | None:
    """One transaction: lock, move attempts, forget delivered handoffs, move occurrences, advance the horizon.
    None when nothing was left to move."""
    async with pool.acquire() as conn, conn.transaction():
        ids = [
            r["occurrence_id"]
            for r in await conn.fetch(
                *QUERIES.lock_prunable_batch(
                    tenant_id=tenant.tenant_id, cutoff=tenant.cutoff, limit=limit, everywhere=everywhere
                )
            )
        ]
        if not ids:
            return None
        attempts = await conn.fetchval(*QUERIES.archive_attempts(occurrence_ids=ids))
        await conn.fetchrow(*QUERIES.forget_delivered_handoffs(occurrence_ids=ids))
        moved = await conn.fetchrow(*QUERIES.archive_occurrences(occurrence_ids=ids))
        await conn.execute(*QUERIES.advance_archive_horizon(tenant_id=tenant.tenant_id, cutoff=tenant.cutoff, now=now))
    occurrences = moved["occurrences"]
    tenant.occurrences += occurrences
    tenant.attempts += attempts
    tenant.oldest = moved["oldest"] if tenant.oldest is None else min(tenant.oldest, moved["oldest"])
    tenant.newest = moved["newest"] if tenant.newest is None else max(tenant.newest, moved["newest"])
    return occurrences, attempts

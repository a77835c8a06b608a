"""Tenant quotas: the limits a tenant's schedules must fit in, and the check made on every change.

Enforced today, when a schedule is created or updated (:func:`check_quotas`, against the tenant's
usage counter, :func:`tenant_usage`)
or attempts are retried: ``max_active_schedules``, ``max_fires_per_minute``,
``max_payload_bytes`` and ``retry_budget_per_hour``; ``catch_up_per_minute``
paces backfills (:mod:`engine.rules.catch_up_pacing`) and the
materializer's misfire catch-up (a token bucket per tenant,
:mod:`engine.rules.token_bucket`; the two are separate budgets today). ``max_running`` is enforced
at dispatch (:mod:`engine.loops.tenant_gate`: further first deliveries are held, then released in due
order as the tenant's occurrences finish).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import asyncpg

from schemas import observability as obs
from schemas.errors import InvalidInput, NotFound, QuotaExceeded
from schemas.queries import QUERIES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TenantQuotas:
    """Per-tenant limits (defaults suit a production tenant; raise them per tenant).

    max_active_schedules: live (active or paused) schedules.
    max_fires_per_minute: sum of the trigger rates the live schedules imply, so
        a tenant cannot create a million every-second schedules.
    max_payload_bytes: encoded JSON payload of one schedule (default 64 KiB).
    retry_budget_per_hour: retries the tenant may spend per UTC hour (the attempt ledger spends them).
    max_running: occurrences of the tenant admitted at once (open: dispatched or due to be, and not
        finished); further first deliveries wait, held, until some finish (the tenant gate).
    catch_up_per_minute: past slots a backfill, and separately the misfire catch-up, may release per minute.
    weight: the tenant's share when a due backlog is served by weighted round-robin (engine.rules.fair_rounds).
    """

    max_active_schedules: int = 10000
    max_fires_per_minute: float = 10000.0
    max_payload_bytes: int = 64 * 1024
    max_running: int = 100
    catch_up_per_minute: int = 1000
    retry_budget_per_hour: int = 1000
    weight: int = 1

    def validate(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            minimum = 1 if item.name in ("max_payload_bytes", "max_running", "weight") else 0
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
                raise InvalidInput(
                    item.name, f"must be a number of at least {minimum}", str(getattr(TenantQuotas, item.name))
                )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TenantQuotas:
        return cls(**{item.name: row[item.name] for item in fields(cls)})


#: Retry budget of a tenant that has no row in ``tenants`` (the column default).
DEFAULT_RETRY_BUDGET = TenantQuotas.retry_budget_per_hour


@dataclass(frozen=True)
class TenantUsage:
    """What counts against a tenant's quotas: live (active or paused) schedules and their summed trigger rate,
    and its open occurrences (SCHEDULED, ENQUEUED, RUNNING, RETRY_WAIT: what ``max_running`` bounds)."""

    schedules: int
    fires_per_minute: float
    open_occurrences: int = 0

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TenantUsage:
        return cls(row["schedules"], row["fires_per_minute"], row["open_occurrences"])

    def nearest_share(self, quotas: TenantQuotas) -> float:
        """The larger of this usage's shares of ``max_active_schedules`` and ``max_fires_per_minute`` (either
        quota refuses the next create): the order ``read_tenants_usage`` ranks tenants in."""
        return max(
            self.schedules / max(quotas.max_active_schedules, 1),
            self.fires_per_minute / max(quotas.max_fires_per_minute, 1e-9),
        )


async def tenant_usage(conn: asyncpg.Connection, tenant_id: str, exclude: uuid.UUID | None = None) -> TenantUsage:
    """The tenant's usage without schedule ``exclude`` (the one being updated), from its counter.

    Costs the changes logged since the tenant's last check, not its schedules (migration 0024). Call it
    holding the tenant's row lock (``lock_tenant``): that serializes one tenant's folds of the change log.
    """
    return TenantUsage.from_row(
        await conn.fetchrow(*QUERIES.tenant_usage(tenant_id=tenant_id, exclude_schedule_id=exclude))
    )


@dataclass(frozen=True)
class UsageFolds:
    """What one pass of :func:`fold_usage_changes` did."""

    tenants: int  # tenants whose logged changes were folded into their counter
    changes: int  # change rows folded
    busy: int  # tenants skipped: a create or update held the tenant's lock (and folds the log itself)
    full: bool  # as many tenants had changes as the pass may take: more may be waiting


async def fold_usage_changes(pool: asyncpg.Pool, limit: int) -> UsageFolds:
    """Fold the change logs of up to ``limit`` tenants (the longest logs first) into their counters.

    A create or update folds its tenant's log before its quota check; this pass does it for tenants that
    change without creating (completions, cancels, writes by SQL), so the log, and every read that sums it
    (``GET /v1/tenant``, the console), stays short. Each tenant is folded in its own transaction under
    its row lock, taken SKIP LOCKED: a tenant whose create is under way is left to that create, and folds
    of one tenant never run at once (two deletes of one log in different orders could deadlock).
    """
    candidates = await pool.fetch(*QUERIES.tenants_with_usage_changes(limit=limit))
    tenants = changes = busy = 0
    for candidate in candidates:
        tenant_id = candidate["tenant_id"]
        async with pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(*QUERIES.lock_tenant_unless_busy(tenant_id=tenant_id)) is None:
                busy += 1
                continue
            folded = await conn.fetchrow(*QUERIES.tenant_usage(tenant_id=tenant_id, exclude_schedule_id=None))
        tenants += 1
        changes += folded["folded"]  # a create may have folded some since the candidates were read
    return UsageFolds(tenants, changes, busy, full=len(candidates) >= limit)


async def current_usage(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: str) -> TenantUsage:
    """The tenant's usage now, read only (its counter plus the changes not folded yet; none for an unknown
    tenant): for display, never for admission — a quota check folds under the tenant's lock
    (:func:`tenant_usage`)."""
    row = await conn.fetchrow(*QUERIES.read_tenants_usage(tenant_id=tenant_id, limit=None))
    return TenantUsage.from_row(row) if row is not None else TenantUsage(0, 0.0)


async def usage_of(pool: asyncpg.Pool, tenant_id: str, *, recount: bool = False) -> dict[str, Any]:
    """The tenant's quotas and its usage of them (``GET /v1/tenant``, ``chronoq tenant usage``).

    Read only, without waiting for the tenant's creates. ``recount``: count the tenant's live schedules and
    open occurrences and store that as its counter, reporting the ``drift`` corrected, under the tenant's row
    lock (no create or update of the tenant meanwhile). The counter is kept by triggers on ``schedules`` and
    ``occurrences`` (migrations 0024 and 0027); writes that bypass
    triggers (a restore with ``--disable-triggers``, ``session_replication_role = replica``) would make it
    drift, and a recount repairs it.
    """
    missing = NotFound("tenant", f"{tenant_id} (list tenants in the console, or create it: chronoq tenant create)")
    if not recount:
        row = await pool.fetchrow(*QUERIES.read_tenants_usage(tenant_id=tenant_id, limit=None))
        if row is None:
            raise missing
        return _usage_report(tenant_id, row, TenantUsage.from_row(row))
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(*QUERIES.lock_tenant(tenant_id=tenant_id))
        if row is None:
            raise missing
        kept = await tenant_usage(conn, tenant_id)
        counted = TenantUsage.from_row(await conn.fetchrow(*QUERIES.recount_tenant_usage(tenant_id=tenant_id)))
    drift = {
        "schedules": counted.schedules - kept.schedules,
        "fires_per_minute": round(counted.fires_per_minute - kept.fires_per_minute, 6),
        "open_occurrences": counted.open_occurrences - kept.open_occurrences,
    }
    if any(drift.values()):
        log.warning(
            "tenant usage counters had drifted from the tenant's schedules or open occurrences; recounted",
            extra={
                "action": "tenant.usage_recounted",
                "tenant_id": tenant_id,
                **{f"drift_{k}": v for k, v in drift.items()},
            },
        )
    return {**_usage_report(tenant_id, row, counted), "drift": drift}


async def every_usage(pool: asyncpg.Pool, limit: int | None = None) -> list[dict[str, Any]]:
    """Every tenant's quotas and usage (``chronoq tenant usage`` without a name; the first ``limit`` on an
    operator's console), read only, the tenants nearest a quota first (the larger of their shares of
    ``max_active_schedules`` and ``max_fires_per_minute``): the ones about to be refused."""
    rows = await pool.fetch(*QUERIES.read_tenants_usage(tenant_id=None, limit=limit))
    return [_usage_report(row["tenant_id"], row, TenantUsage.from_row(row)) for row in rows]


async def open_count_drift(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, tuple[int, int]]:
    """Every tenant whose open-occurrence counter (counter plus unfolded changes, what the tenant gate reads)
    differs from a count of its open hot occurrences, as ``{tenant: (counter, counted)}``; empty when all
    agree. One statement, one snapshot. Counts every open occurrence: an operator's check after writes that
    bypassed triggers (``chronoq tenant usage --drift``; ``--recount`` repairs a tenant), never a hot path."""
    rows = await conn.fetch(*QUERIES.open_count_drift())
    return {r["tenant_id"]: (r["counter"], r["counted"]) for r in rows}


def _usage_report(tenant_id: str, row: Mapping[str, Any], usage: TenantUsage) -> dict[str, Any]:
    return {
        "tenant_id": tenant_id,
        "quotas": asdict(TenantQuotas.from_row(row)),
        "usage": {
            "schedules": usage.schedules,
            "fires_per_minute": round(usage.fires_per_minute, 6),
            "open_occurrences": usage.open_occurrences,
        },
    }


async def check_quotas(
    conn: asyncpg.Connection, tenant_id: str, quotas: TenantQuotas, rate: float, exclude: uuid.UUID | None
) -> None:
    """Raise QuotaExceeded if one more live schedule with this trigger rate does not fit.

    ``exclude``: the schedule being updated (its current rate is replaced, not added). The caller holds the
    tenant's row lock.
    """
    usage = await tenant_usage(conn, tenant_id, exclude)
    refused = quota_refusal(tenant_id, quotas, usage.schedules, usage.fires_per_minute, rate)
    if refused is not None:
        raise refused


def quota_refusal(
    tenant_id: str, quotas: TenantQuotas, schedules: int, fires_per_minute: float, rate: float
) -> QuotaExceeded | None:
    """The refusal of one more live schedule with trigger rate ``rate`` beside a usage of ``schedules`` and
    ``fires_per_minute`` (counted on ``chronoq.quota_refusals``), or None when it fits."""
    if schedules + 1 > quotas.max_active_schedules:
        refused = QuotaExceeded("max_active_schedules", quotas.max_active_schedules, schedules + 1)
    elif fires_per_minute + rate > quotas.max_fires_per_minute:
        refused = QuotaExceeded("max_fires_per_minute", quotas.max_fires_per_minute, round(fires_per_minute + rate, 3))
    else:
        return None
    obs.get_meter("engine").create_counter(obs.QUOTA_REFUSALS, unit="1").add(
        1, {"tenant_id": tenant_id, "quota": refused.field}
    )
    return refused

"""Tenant quotas: the limits a tenant's schedules must fit in, and the check made on every change.

Enforced today, when a schedule is created or updated (:func:`check_quotas`)
or attempts are retried: ``max_active_schedules``, ``max_fires_per_minute``,
``max_payload_bytes`` and ``retry_budget_per_hour``; ``catch_up_per_minute``
paces backfills (:mod:`engine.rules.catch_up_pacing`) and the
materializer's misfire catch-up (a token bucket per tenant,
:mod:`engine.rules.token_bucket`; the two are separate budgets today). ``max_running`` is enforced
at dispatch (:mod:`engine.loops.tenant_gate`: further first deliveries are held, then released in due
order as the tenant's occurrences finish).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import asyncpg

from schemas.errors import InvalidInput, QuotaExceeded
from schemas.queries import QUERIES


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
    weight: the tenant's share in weighted fair dispatch — stored, NOT enforced yet.
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


async def check_quotas(
    conn: asyncpg.Connection, tenant_id: str, quotas: TenantQuotas, rate: float, exclude: uuid.UUID | None
) -> None:
    """Raise QuotaExceeded if one more live schedule with this trigger rate does not fit.

    ``exclude``: the schedule being updated (its current rate is replaced, not added).
    """
    usage = await conn.fetchrow(*QUERIES.tenant_usage(tenant_id=tenant_id, exclude_schedule_id=exclude))
    if usage["schedules"] + 1 > quotas.max_active_schedules:
        raise QuotaExceeded("max_active_schedules", quotas.max_active_schedules, usage["schedules"] + 1)
    wanted = usage["fires_per_minute"] + rate
    if wanted > quotas.max_fires_per_minute:
        raise QuotaExceeded("max_fires_per_minute", quotas.max_fires_per_minute, round(wanted, 3))

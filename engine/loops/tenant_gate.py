"""The tenant gate: a tenant's ``max_running`` bounds its admitted occurrences; the rest wait, held.

*Admitted* is what the overlap gate calls in flight (RUNNING is learned from
events, later): an open occurrence (SCHEDULED, ENQUEUED, RUNNING, RETRY_WAIT)
whose delivery no tenant hold keeps back — the relay may publish it at its due
time. Two halves (SQL in ``schemas/queries/tenant_gate.sql``):

* **hold, at materialization** (:func:`hold_beyond_max_running`, called by the
  materializer in its batch transaction): a tenant's new first deliveries
  beyond its room (``max_running`` minus admitted; none while it has
  deliveries held, so they leave in due order) are written to the outbox
  **held** — claimed with :data:`TENANT_GATE_TOKEN` until ``infinity``, which no
  relay takes — instead of the ahead lane, which has no per-row hold;
* **release, every pass** (:class:`TenantGate`): a tenant below its limit gets
  held deliveries let go, the earliest due first, as many as fit; the
  late-lane relay publishes them at their available_at.

Nothing is dropped: a held delivery keeps its occurrence_id and due time and
goes out when there is room (late by the wait; ``schedule_lag`` shows it; no
lateness verdict applies to it, as for the overlap gate's rows). Retries and
dead-letter replays are not held (they belong to an occurrence already
admitted); rows the overlap gate holds are its to release and count as open.

A tenant's open occurrences are read from a counter, not counted: triggers on
``occurrences`` log every statement's change of the tenant's open set, the
usage folds fold it (migration 0027, docs/control-plane.md), so a pass costs the
changes since the last fold, not the tenant's open set.

What is *not* exact, and why: materializer passes in flight at once (two
nodes', or one node's ``passes_in_flight``) for the same tenant may both count
the same room, so a tenant can exceed ``max_running`` by one batch's worth in
that moment; it never overshoots for long, since
nothing more is admitted until it is back under the limit. Like overlap
policies, ``max_running`` needs consumers that report attempts: an occurrence
never reported stays open (the stuck-occurrences loop flags it).

Metrics: ``chronoq.tenant_throttled`` (first deliveries held, by tenant) and
``chronoq.tenant_held`` (deliveries waiting now, all tenants).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from opentelemetry import metrics

from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import SUMMARY_EVERY
from schemas import observability as obs
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.tenant_gate")

#: The claim token of deliveries held for their tenant's max_running (never a relay's: relays use uuid4).
TENANT_GATE_TOKEN = uuid.UUID("6f1c2a0e-4d0b-5c8e-9a51-74656e616e74")


@dataclass(frozen=True)
class StagedColumns:
    """Where the fields the tenant hold reads and rewrites sit in a materializer staging row (``available_at``:
    the row's due instant in any ordered form; the materializer stages epoch microseconds)."""

    tenant_id: int
    available_at: int
    state: int
    held: int
    ahead: int
    late_after: int
    misfire_policy: int
    tenant_held: int


async def hold_beyond_max_running(
    conn: asyncpg.Connection, staged: Sequence[tuple[Any, ...]], columns: StagedColumns
) -> tuple[list[tuple[Any, ...]], Counter[str]]:
    """The staging rows with every first delivery beyond its tenant's room marked held (late lane, no ahead
    row, no lateness verdict), the earliest due admitted first; and how many were held, by tenant.

    Runs in the materializer's transaction, before the rows are written; rows the overlap gate holds and
    MISSED rows are left alone.
    """
    c = columns
    candidates = [i for i, row in enumerate(staged) if row[c.state] == "SCHEDULED" and not row[c.held]]
    if not candidates:
        return list(staged), Counter()
    tenants = sorted({staged[i][c.tenant_id] for i in candidates})
    room = {
        r["tenant_id"]: r["room"]
        for r in await conn.fetch(*QUERIES.tenant_room(tenant_ids=tenants, token=TENANT_GATE_TOKEN))
    }
    return hold_rows(staged, candidates, room, c)


def hold_rows(
    staged: Sequence[tuple[Any, ...]], candidates: list[int], room: dict[str, int], c: StagedColumns
) -> tuple[list[tuple[Any, ...]], Counter[str]]:
    """The staging rows with the ``candidates`` (indexes of first deliveries) beyond their tenant's ``room``
    marked held, the earliest due (then lowest id) admitted first; a tenant without room known is not held.
    Pure: tests/unit/test_tenant_hold.py compares it with sorting every candidate."""
    held: Counter[str] = Counter()
    out = list(staged)
    # Only a tenant with more candidates than room has any held: the order is sorted for those alone (a
    # burst's tenants are mostly far from their max_running; sorting every row of a pass by a Python key was
    # ~5 % of its time).
    wanted = Counter(staged[i][c.tenant_id] for i in candidates)
    left = {tenant: room[tenant] for tenant, count in wanted.items() if tenant in room and count > room[tenant]}
    if not left:
        return out, held
    beyond = [i for i in candidates if staged[i][c.tenant_id] in left]
    for i in sorted(beyond, key=lambda i: (staged[i][c.available_at], staged[i][0])):
        tenant = staged[i][c.tenant_id]
        if left[tenant] > 0:
            left[tenant] -= 1
            continue
        row = list(staged[i])
        row[c.ahead], row[c.late_after], row[c.misfire_policy], row[c.tenant_held] = False, None, None, True
        out[i] = tuple(row)
        held[tenant] += 1
    return out, held


@dataclass
class TenantGateReport:
    released: Counter[str] = field(default_factory=Counter)  # deliveries let go in this pass, by tenant
    waiting: int = 0  # deliveries held after this pass, all tenants


class TenantGate:
    """Releases held deliveries as their tenants' occurrences finish (see the module docstring)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        interval: float = 1.0,
        meter: metrics.Meter | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.pool = pool
        self.interval = interval
        meter = meter or obs.get_meter("engine")
        self._waiting = meter.create_gauge(obs.TENANT_HELD, unit="1")

    async def run_once(self) -> TenantGateReport:
        report = TenantGateReport()
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(*QUERIES.lock_tenant_gate())
            rows = await conn.fetch(*QUERIES.release_tenant_deliveries(token=TENANT_GATE_TOKEN))
        for row in rows:
            if row["released"]:
                report.released[row["tenant_id"]] = row["released"]
            report.waiting += row["held_before"] - row["released"]
        for tenant_id, count in report.released.items():
            log.info(
                "held deliveries released: the tenant is below max_running",
                extra={"action": "tenant.released", "tenant_id": tenant_id, "count": count},
            )
        self._waiting.set(report.waiting)
        return report

    async def run_pass(self) -> PassOutcome:
        report = await self.run_once()
        return PassOutcome({"released": sum(report.released.values()), "waiting": report.waiting})

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Release held deliveries until ``stop`` is set (the periodic skeleton: errors are logged and retried)."""
        timing = LoopTiming(self.interval, summary_every=summary_every)
        await PeriodicLoop("tenant-gate", self.run_pass, timing, log).run(stop)

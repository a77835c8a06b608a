"""The overlap gate: dispatch, hold or skip the held deliveries of overlap-policy schedules.

The policies are in :mod:`engine.rules.overlap_policy`. "In flight" is learned
asynchronously (RUNNING arrives as an attempt event, later), so it means
*dispatched and not finished*: SCHEDULED after the gate released it, ENQUEUED
(in Kafka, perhaps not started yet), RUNNING, RETRY_WAIT. Counting ENQUEUED is
what makes the decision safe: an occurrence dispatched a moment ago blocks the
next even before any worker reports it.

How it stays atomic with a generic relay: the materializer writes the outbox
rows of such schedules already held — claimed with :data:`OVERLAP_GATE_TOKEN`
until ``infinity`` — so the relay, which claims only unclaimed or expired
rows, cannot publish them. The :class:`OverlapGate` takes due held rows, locks their
schedules in id order (``FOR UPDATE``), reads what is in flight, and applies
:func:`decide_overlap`: dispatch (clear the claim: the relay publishes it on
its next pass), keep holding, or skip. Every decision about one schedule is
made under its row lock, so two occurrences can never both see "nothing
running", with any number of gates.

**Fair and bounded.** A pass looks only at schedules whose decision can move
something (dispatch or skip), the longest waiting first: a ``queue_one``
schedule whose one waiting row sits behind an occurrence in flight is left
out until that occurrence finishes, so any number of them can neither hide
other schedules' rows nor keep the gate spinning — with nothing movable a
pass finds no candidate and the loop sleeps ``interval``.

Replays from the dead-letter list and retries are not gated: a retry belongs
to the occurrence already in flight, and a replay is an operator's decision.
A schedule whose dispatched occurrence is never reported (no consumer runs,
or its consumer group does not report attempts) stays in flight, and the
policy keeps skipping: overlap policies need a consumer that reports attempts.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field

import asyncpg
from opentelemetry import metrics

from engine.loops.periodic import LoopTiming, PassOutcome, PeriodicLoop
from engine.loops.reporting import SUMMARY_EVERY
from engine.rules.overlap_policy import decide_overlap
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.queries import QUERIES

log = logging.getLogger("chronoq.overlap")

#: The claim token of outbox rows held by the overlap gate (never a relay's: relays use uuid4).
OVERLAP_GATE_TOKEN = uuid.UUID("6f1c2a0e-4d0b-5c8e-9a51-6f7665726c61")


@dataclass(frozen=True)
class OverlapGateConfig:
    """interval: seconds between passes when nothing was due (default 0.1: held rows wait for it).
    batch_size: schedules decided per transaction (default 200).
    """

    interval: float = 0.1
    batch_size: int = 200


@dataclass
class GateReport:
    schedules: int = 0
    dispatched: list[uuid.UUID] = field(default_factory=list)
    skipped: list[uuid.UUID] = field(default_factory=list)
    held: int = 0


class OverlapGate:
    def __init__(
        self,
        pool: asyncpg.Pool,
        config: OverlapGateConfig | None = None,
        clock: Clock | None = None,
        meter: metrics.Meter | None = None,
    ) -> None:
        self.pool = pool
        self.config = config or OverlapGateConfig()
        self.clock = clock or DatabaseClock()
        self._skips = (meter or obs.get_meter("engine")).create_counter(obs.OVERLAP_SKIPS, unit="1")

    async def run_once(self) -> GateReport:
        report = GateReport()
        async with self.pool.acquire() as conn, conn.transaction():
            now = await conn.fetchval(*QUERIES.current_instant(now=self.clock.now()))
            candidates = await conn.fetch(
                *QUERIES.gated_due_schedules(now=now, gate_token=OVERLAP_GATE_TOKEN, limit=self.config.batch_size)
            )
            if not candidates:
                return report
            locked = await conn.fetch(
                *QUERIES.lock_schedules_in_order(schedule_ids=[r["schedule_id"] for r in candidates])
            )
            policies = {r["schedule_id"]: r["overlap_policy"] for r in locked}
            rows = await conn.fetch(
                *QUERIES.gated_due_rows(now=now, schedule_ids=list(policies), gate_token=OVERLAP_GATE_TOKEN)
            )
            busy = {
                r["schedule_id"] for r in await conn.fetch(*QUERIES.schedules_in_flight(schedule_ids=list(policies)))
            }
            due: dict[uuid.UUID, list[int]] = {}
            occurrence_of: dict[int, asyncpg.Record] = {}
            for row in rows:
                due.setdefault(row["schedule_id"], []).append(row["outbox_id"])
                occurrence_of[row["outbox_id"]] = row
            dispatch: list[int] = []
            skip: list[int] = []
            for schedule_id, outbox_ids in due.items():
                decision = decide_overlap(policies[schedule_id], schedule_id in busy, outbox_ids)
                dispatch.extend(decision.dispatch)
                skip.extend(decision.skip)
                report.held += len(decision.hold)
            if dispatch:
                report.dispatched = [
                    r["occurrence_id"]
                    for r in await conn.fetch(
                        *QUERIES.dispatch_held_rows(outbox_ids=dispatch, gate_token=OVERLAP_GATE_TOKEN, now=now)
                    )
                ]
            if skip:
                report.skipped = [
                    r["occurrence_id"]
                    for r in await conn.fetch(
                        *QUERIES.skip_held_rows(outbox_ids=skip, gate_token=OVERLAP_GATE_TOKEN, now=now)
                    )
                ]
            report.schedules = len(due)
        for outbox_id in skip:
            row = occurrence_of[outbox_id]
            log.info(
                "occurrence skipped: another occurrence of its schedule is in flight",
                extra={
                    "action": "occurrence.skipped_overlap",
                    "occurrence_id": str(row["occurrence_id"]),
                    "schedule_id": str(row["schedule_id"]),
                    "tenant_id": row["tenant_id"],
                },
            )
        if report.skipped:
            self._skips.add(len(report.skipped))
        return report

    async def run_pass(self) -> PassOutcome:
        report = await self.run_once()
        moved = len(report.dispatched) + len(report.skipped)
        return PassOutcome(
            {"dispatched": len(report.dispatched), "skipped": len(report.skipped), "held": report.held},
            # At once again only after a full batch that moved something: a pass that could only keep
            # holding (a race with the candidates' query) waits like an idle one.
            more=report.schedules >= self.config.batch_size and moved > 0,
        )

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Decide held deliveries until ``stop`` is set (the periodic skeleton: errors are logged and retried)."""
        timing = LoopTiming(self.config.interval, summary_every=summary_every)
        await PeriodicLoop("overlap-gate", self.run_pass, timing, log).run(stop)

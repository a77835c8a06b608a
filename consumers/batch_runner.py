"""One batch of one target's occurrences: one transaction, dedupe by set, attempts reported in batches.

A batch handler (``@app.handler(target, batch=N)``) receives up to N occurrences of its target in one
call, with one open transaction on the app's database. For a batch the runner:

1. skips the occurrences whose schedule version is obsolete or whose schedule was canceled (reported
   ``canceled``, as for single handlers);
2. collapses copies of one occurrence in the batch (published twice) to the highest delivery; the
   other copies count as dedupe hits and need no report of their own;
3. opens the transaction (bounded by the lease like a single attempt) and inserts every dedupe row in
   one ``INSERT … ON CONFLICT DO NOTHING RETURNING``, each with a fresh lease token: the rows that were
   already there are occurrences applied before, reported ``already_applied`` — they never reach the
   handler;
4. reports ``started`` for the rest as group records (one per partition of ``chronoq.attempts``; one record per
   occurrence with ``group_attempt_events=False``) and
   waits for the acknowledgement before the handler runs; with the barrier, then **one wait** for the
   engine's answers to all of them: a refused occurrence loses its dedupe row inside the transaction and
   never reaches the handler (nothing more reported: the engine decided), and an occurrence without an
   answer in time rolls the batch back and retries the unsettled rest in place (new claims, no attempt
   consumed);
5. re-checks the schedule-state view; occurrences that became obsolete meanwhile lose their dedupe row
   inside the transaction and are reported ``canceled``;
6. calls the handler with the list and the connection, under the target's timeout. Every lease of the
   batch is heartbeated in one Kafka batch per renewal, from the first try to send the starts (through the
   wait for the answers) to the commit (:mod:`consumers.attempt_leases`);
7. commits — effects and dedupe rows together — then reports ``succeeded`` in one Kafka batch.

**Failures.** The transaction rolls back: no effect, no dedupe row. A handler that raises
:class:`~consumers.errors.FailedOccurrences` says which occurrences failed: those are reported
``failed`` (permanent or transient as for single handlers) and the others run again at once as a
batch. Any other error cannot be pinned on an occurrence, so the batch's occurrences run again one by
one — each a batch of one, through the single-occurrence protocol of :mod:`consumers.attempt_runner`,
whose outcome is final. A batch of one fails exactly as a single handler does. A rerun takes new lease
tokens for the same deliveries, which the engine treats as a takeover: no attempt is consumed by the
batch that failed. A broker that does not acknowledge the starts in time gets the same starts again
(same tokens: duplicates for the engine, not takeovers) while the leases last. Infrastructure errors (the
app database unreachable, the broker not acknowledging for a whole lease) retry the whole batch in place,
consuming no attempt; a lease lost while the process was stopped
fails every occurrence of the batch with ``LeaseExpired``, as it would a single attempt.

Crash safety is the single protocol's: every dedupe row commits with its effect, the engine fences by
lease token, and offsets move only after the reports.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import cast

import asyncpg

from consumers.attempt_leases import HeldLease, LeaseKeeper, LocalLease
from consumers.attempt_reports import AttemptReporter
from consumers.attempt_runner import (
    GRANT_ASKS,
    LEASE_EXPIRED,
    AttemptRunner,
    BatchHandler,
    ConsumerHooks,
    ConsumerMetrics,
    ConsumerStats,
    HandlerRegistration,
    Outcome,
    commit,
    ids,
    limit_ms,
    rollback,
)
from consumers.config import ConsumerConfig
from consumers.errors import FailedOccurrences, InfrastructureError, lost_connection
from consumers.occurrence import Cancellation, Occurrence
from consumers.schedule_states import ScheduleStateView
from schemas.attempt_events import AttemptEvent
from schemas.attempt_grants import FOREIGN_GROUP
from schemas.clock import pause
from schemas.connections import json_rows, unchecked_first
from schemas.error_classification import DATABASE_ERRORS
from schemas.identity import is_slot_occurrence
from schemas.messages import OccurrenceMessage
from schemas.queries import CONSUMER_QUERIES

log = logging.getLogger("chronoq.consumer")


@dataclass
class _Item:
    """One occurrence of the batch on its way through the protocol."""

    index: int  # position in the delivered batch
    message: OccurrenceMessage
    token: uuid.UUID | None = None
    occurrence: Occurrence | None = None

    @property
    def lease(self) -> uuid.UUID:
        """The lease token of this try (set once the dedupe row is inserted)."""
        assert self.token is not None, "no attempt yet"
        return self.token

    @property
    def started(self) -> Occurrence:
        """The occurrence as the handler gets it (set once ``started`` is acknowledged)."""
        assert self.occurrence is not None, "not started"
        return self.occurrence


class BatchRunner:
    """Runs batches of one target's occurrences; reruns what a failed batch cannot settle through ``single``."""

    def __init__(
        self,
        config: ConsumerConfig,
        pool: asyncpg.Pool,
        reporter: AttemptReporter,
        view: ScheduleStateView,
        hooks: ConsumerHooks,
        meters: ConsumerMetrics,
        stats: ConsumerStats,
        stopping: asyncio.Event,
        single: AttemptRunner,
    ) -> None:
        self.config = config
        self.pool = pool
        self.reporter = reporter
        self.view = view
        self.hooks = hooks
        self.meters = meters
        self.stats = stats
        self.stopping = stopping
        self.single = single

    async def deliver(self, messages: Sequence[OccurrenceMessage], registration: HandlerRegistration) -> list[Outcome]:
        """Process a batch to the end; one outcome per message, in order."""
        outcomes: dict[int, Outcome] = {}
        items = [_Item(i, m) for i, m in enumerate(messages)]
        self.meters.batch_size.record(len(items), {"target": messages[0].target if messages else ""})
        pending = self._collapse_copies(items, outcomes)
        delays = self.config.redelivery_delays()
        while pending:
            try:
                pending = await self._attempt(pending, registration, outcomes)
                delays = self.config.redelivery_delays()  # progress: the next failure waits the first delay
            except InfrastructureError as err:
                pending = [item for item in pending if item.index not in outcomes]  # what is settled stays so
                self.stats.infrastructure_errors += 1
                delay = next(delays)
                log.warning(
                    "infrastructure error; the batch is retried in place, no attempt consumed",
                    extra={
                        "action": "batch.infrastructure_error",
                        "occurrences": len(pending),
                        "error": str(err),
                        "retry_in_s": delay,
                    },
                )
                await pause(self.stopping, delay)
                if self.stopping.is_set():
                    break
        result = []
        for item in items:
            outcome = outcomes.get(item.index, Outcome.ABANDONED)
            if outcome is Outcome.ABANDONED:
                self.stats.abandoned += 1
            self.stats.record(item.message.occurrence_id, item.message.attempt, outcome)
            result.append(outcome)
        return result

    def _collapse_copies(self, items: list[_Item], outcomes: dict[int, Outcome]) -> list[_Item]:
        """One item per occurrence: the highest delivery (the earliest copy of it); the rest are dedupe hits."""
        best: dict[uuid.UUID, _Item] = {}
        for item in items:
            kept = best.get(item.message.occurrence_id)
            if kept is None or item.message.attempt > kept.message.attempt:
                best[item.message.occurrence_id] = item
        keep = {id(item) for item in best.values()}
        for item in items:
            if id(item) not in keep:
                outcomes[item.index] = Outcome.DUPLICATE
                self.stats.duplicates += 1
                self.meters.duplicates.add(1, {"target": item.message.target})
        return [item for item in items if id(item) in keep]

    # -- one try of the batch -------------------------------------------------------------------

    async def _attempt(
        self, items: list[_Item], registration: HandlerRegistration, outcomes: dict[int, Outcome]
    ) -> list[_Item]:
        """One transaction for ``items``; returns the items to run again as a batch (none, usually)."""
        live: list[_Item] = []
        obsolete: list[tuple[_Item, str]] = []
        for item in items:
            item.token = item.occurrence = None  # every try is a new attempt with new lease tokens
            verdict = self.view.verdict(item.message.schedule_id, item.message.schedule_version)
            (obsolete.append((item, verdict)) if verdict else live.append(item))
        if obsolete:
            await self._skip(obsolete, outcomes)
        if not live:
            return []
        try:
            conn = await self.pool.acquire()
        except DATABASE_ERRORS as err:
            raise InfrastructureError(f"app database unreachable: {err!r}") from err
        try:
            return await self._in_transaction(conn, live, registration, outcomes)
        finally:
            try:
                await self.pool.release(conn)
            except DATABASE_ERRORS:
                pass  # a dead connection; the pool replaces it

    async def _in_transaction(
        self,
        conn: asyncpg.Connection,
        items: list[_Item],
        registration: HandlerRegistration,
        outcomes: dict[int, Outcome],
    ) -> list[_Item]:
        cfg = self.config
        # One lock order for every batch (the uuid's bytes, as PostgreSQL orders them): twins never deadlock.
        items = sorted(items, key=lambda i: i.message.occurrence_id.int)
        for item in items:
            item.token = uuid.uuid4()
        transaction = conn.transaction()
        try:
            await transaction.start()
            await conn.fetchval(
                *CONSUMER_QUERIES.limit_transaction(
                    lock_timeout_ms=limit_ms(cfg.lock_timeout),
                    idle_timeout_ms=limit_ms(registration.idle_limit(cfg)),
                )
            )
            inserted = await _insert_dedupe_rows(conn, cfg.group, _dedupe_rows(items))
            applied_at = {row["occurrence_id"]: row["applied_at"] for row in inserted}
            claim_order = {row["occurrence_id"]: row["claim_order"] for row in inserted}
            before = [i for i in items if i.message.occurrence_id not in applied_at]
            earlier = (
                await conn.fetch(
                    *CONSUMER_QUERIES.dedupe_rows(
                        consumer_group=cfg.group, occurrence_ids=[i.message.occurrence_id for i in before]
                    )
                )
                if before
                else []
            )
        except asyncpg.exceptions.LockNotAvailableError as err:
            await rollback(transaction)
            raise InfrastructureError(
                "another attempt of an occurrence of this batch holds its uncommitted dedupe row; trying again later"
            ) from err
        except DATABASE_ERRORS as err:
            await rollback(transaction)
            raise InfrastructureError(f"app database error before the handler: {err!r}") from err
        fresh = [i for i in items if i.message.occurrence_id in applied_at]
        if not fresh:
            await rollback(transaction)
            await self._already_applied(before, earlier, outcomes)
            return []
        # The duplicates' reports ride in the same Kafka batch as the starts.
        duplicates = self._already_applied_events(before, earlier)
        keeper = self.single.lease_keeper(fresh[0].message.target, [HeldLease.of(i.message, i.lease) for i in fresh])
        try:
            started = await self._announce(transaction, duplicates, fresh, claim_order, keeper)
            self._count_duplicates(before, outcomes)
            if self.single.grants is not None:
                fresh = await self._granted(conn, transaction, fresh, started, outcomes, keeper)
                if not fresh:
                    await rollback(transaction)
                    return []
            await self.single.ensure_lease(keeper, transaction)
            for item in fresh:
                item.occurrence = Occurrence.from_message(
                    item.message, applied_at[item.message.occurrence_id], item.token, Cancellation()
                )
            fresh = await self._drop_obsolete_since_start(conn, transaction, fresh, outcomes, keeper)
            if not fresh:
                await rollback(transaction)
                return []
            for item in fresh:
                if self.hooks.after_started:
                    await self.hooks.after_started(item.started)
            error, timed_out = await self._run_handler(conn, transaction, fresh, registration, keeper)
        finally:
            await keeper.stop()  # before any outcome is reported
        if error is None or await self.single.committed_anyway(error, [i.started for i in fresh], keeper.lease):
            await self._succeeded(fresh, outcomes)
            return []
        await rollback(transaction)
        return await self._failed(conn, fresh, registration, keeper.lease, error, timed_out, outcomes)

    async def _announce(
        self,
        transaction: asyncpg.transaction.Transaction,
        duplicates: list[AttemptEvent],
        fresh: list[_Item],
        claim_order: dict[uuid.UUID, int | None],
        keeper: LeaseKeeper,
    ) -> list[AttemptEvent]:
        """``started`` for every fresh occurrence (and the duplicates' reports) in one Kafka batch per
        partition, sent again with the same tokens while the broker does not acknowledge and the leases last
        (``AttemptRunner.announce``); rolled back and raised (InfrastructureError) once they do not. Returns
        the ``started`` events sent."""
        cfg = self.config
        started = [
            AttemptEvent.started(
                i.message.occurrence_id,
                i.message.attempt,
                i.lease,
                cfg.lease_ttl,
                cfg.group,
                cfg.worker,
                claim_order=claim_order[i.message.occurrence_id],
                scheduled_for=i.message.scheduled_for,
            )
            for i in fresh
        ]
        target = fresh[0].message.target
        await self.single.announce(
            lambda: self.reporter.send_many(duplicates + started, target), keeper, transaction, [i.lease for i in fresh]
        )
        return started

    async def _granted(
        self,
        conn: asyncpg.Connection,
        transaction: asyncpg.transaction.Transaction,
        items: list[_Item],
        started: list[AttemptEvent],
        outcomes: dict[int, Outcome],
        keeper: LeaseKeeper,
    ) -> list[_Item]:
        """The barrier for the whole batch: one wait for the engine's answers to every ``started``, asking
        again for the unanswered ones while the leases last (``AttemptRunner.await_grants``).

        Refused occurrences lose their (uncommitted) dedupe row and are settled as canceled, unreported (the
        engine knows); the granted ones go on. Any occurrence still without an answer rolls the batch back
        and raises InfrastructureError: the unsettled rest is retried in place with new claims.
        """
        target = items[0].message.target

        def ask_again(tokens: list[uuid.UUID]) -> Awaitable[None]:
            unanswered = set(tokens)
            return self.reporter.send_many([e for e in started if e.lease_token in unanswered], target)

        answers = await self.single.await_grants([i.lease for i in items], target, ask_again, keeper, conn)
        refused = [
            (i, g) for i in items if (g := answers[i.lease]) is not None and not g.granted and g.reason != FOREIGN_GROUP
        ]
        if any(g is None for g in answers.values()):
            await rollback(transaction)
            for item, grant in refused:
                outcomes[item.index] = self.single.refused(item.message, grant)
            raise InfrastructureError(
                f"no answer from the engine to started in {GRANT_ASKS} waits of {self.config.grant_timeout:g} s, or"
                " before the leases ran out, for part of the batch (attempt processor down or behind); rolled back,"
                " retrying with new claims"
            )
        if not refused:
            return items
        keeper.release(i.lease for i, _ in refused)
        remaining = await self._drop_claims(conn, transaction, items, [i for i, _ in refused])
        for item, grant in refused:
            outcomes[item.index] = self.single.refused(item.message, grant)
        return remaining

    async def _drop_obsolete_since_start(
        self,
        conn: asyncpg.Connection,
        transaction: asyncpg.transaction.Transaction,
        items: list[_Item],
        outcomes: dict[int, Outcome],
        keeper: LeaseKeeper,
    ) -> list[_Item]:
        """The view, right before the handler: an occurrence obsolete by now loses its dedupe row (uncommitted)."""
        obsolete = []
        for item in items:
            verdict = self.view.verdict(item.message.schedule_id, item.message.schedule_version)
            if verdict:
                obsolete.append((item, verdict))
        if not obsolete:
            return items
        keeper.release(i.lease for i, _ in obsolete)
        remaining = await self._drop_claims(conn, transaction, items, [i for i, _ in obsolete])
        await self._skip(obsolete, outcomes)
        return remaining

    async def _drop_claims(
        self,
        conn: asyncpg.Connection,
        transaction: asyncpg.transaction.Transaction,
        items: list[_Item],
        dropped: list[_Item],
    ) -> list[_Item]:
        """Delete the (uncommitted) dedupe rows of ``dropped`` in the batch's transaction; the rest of
        ``items``. A database error rolls the batch back and raises InfrastructureError (retried in place)."""
        try:
            await conn.execute(
                *CONSUMER_QUERIES.delete_dedupe_rows(
                    consumer_group=self.config.group,
                    occurrence_ids=[i.message.occurrence_id for i in dropped],
                    lease_tokens=[i.token for i in dropped],
                )
            )
        except DATABASE_ERRORS as err:
            await rollback(transaction)
            raise InfrastructureError(f"app database error before the handler: {err!r}") from err
        gone = {id(i) for i in dropped}
        return [i for i in items if id(i) not in gone]

    async def _run_handler(
        self,
        conn: asyncpg.Connection,
        transaction: asyncpg.transaction.Transaction,
        items: list[_Item],
        registration: HandlerRegistration,
        keeper: LeaseKeeper,
    ) -> tuple[Exception | None, bool]:
        """Run the handler and commit, while ``keeper`` renews the leases; it stops renewing before returning."""
        occurrences = [i.started for i in items]
        started = time.perf_counter()
        deadline = asyncio.timeout(registration.timeout)
        error: Exception | None = None
        with self.view.watch_many([(o.schedule_id, o.cancellation) for o in occurrences]):
            try:
                async with deadline:
                    await cast(BatchHandler, registration.fn)(occurrences, conn)
                if self.hooks.before_commit:
                    for occurrence in occurrences:
                        await self.hooks.before_commit(occurrence)
                await commit(conn, transaction)
            except Exception as err:  # noqa: BLE001 - every handler failure is classified below
                error = err
            finally:
                await keeper.stop()
        self.meters.duration.record(time.perf_counter() - started, {"target": items[0].message.target})
        return error, deadline.expired()

    # -- outcomes -------------------------------------------------------------------------------

    async def _succeeded(self, items: list[_Item], outcomes: dict[int, Outcome]) -> None:
        self.stats.applied += len(items)
        self.meters.applied.add(len(items), {"target": items[0].message.target})
        for item in items if log.isEnabledFor(logging.INFO) else ():
            log.info(
                "occurrence applied",
                extra={
                    **ids(item.message),
                    "action": "occurrence.applied",
                    "attempt": item.message.attempt,
                    "batch": len(items),
                },
            )
        if self.hooks.after_commit:
            for item in items:
                await self.hooks.after_commit(item.started)
        events = [
            AttemptEvent.succeeded(i.message.occurrence_id, i.message.attempt, i.lease, i.message.scheduled_for)
            for i in items
        ]
        reported = await self._report(events, items[0].message.target)
        if reported and self.hooks.after_report:
            for item in items:
                await self.hooks.after_report(item.started)
        for item in items:
            outcomes[item.index] = Outcome.APPLIED if reported else Outcome.ABANDONED

    async def _failed(
        self,
        conn: asyncpg.Connection,
        items: list[_Item],
        registration: HandlerRegistration,
        lease: LocalLease,
        error: Exception,
        timed_out: bool,
        outcomes: dict[int, Outcome],
    ) -> list[_Item]:
        """Settle what the failure says; return the items to run again as a batch."""
        if len(items) == 1:
            item = items[0]
            outcomes[item.index] = await self.single.conclude_failure(
                conn, item.started, registration, lease, error, timed_out
            )
            return []
        if lost_connection(error, conn):
            if not lease.check():
                await self._report_failures(
                    items,
                    LEASE_EXPIRED,
                    f"the attempt outlived its {self.config.lease_ttl} s lease; its transaction was ended",
                    outcomes,
                )
                return []
            if not await self.single.database_reachable():
                raise InfrastructureError(f"app database unreachable during the batch: {error!r}") from error
        canceled = [i for i in items if i.started.cancellation.is_canceled]
        if canceled:
            await self._skip([(i, "cooperative") for i in canceled], outcomes)
        rest = [i for i in items if not i.started.cancellation.is_canceled]
        named = [i for i in rest if isinstance(error, FailedOccurrences) and i.message.occurrence_id in error.errors]
        if named and not timed_out:  # naming none of the batch's occurrences says nothing: one by one
            assert isinstance(error, FailedOccurrences)
            for item in named:
                outcomes[item.index] = await self.single.conclude_failure(
                    conn,
                    item.started,
                    registration,
                    lease,
                    _as_exception(error.errors[item.message.occurrence_id]),
                    False,
                )
            log.warning(
                "batch failed for some occurrences; the others run again as a batch",
                extra={"action": "batch.partly_failed", "failed": len(named), "again": len(rest) - len(named)},
            )
            return [_Item(i.index, i.message) for i in rest if i.message.occurrence_id not in error.errors]
        self.stats.batch_failures += 1
        log.warning(
            "batch failed; its occurrences run again one by one",
            extra={
                "action": "batch.failed",
                "occurrences": len(rest),
                "timed_out": timed_out,
                "error_class": type(error).__name__,
                "error": str(error)[:500],
            },
        )
        alone = replace(registration, fn=_one_by_one(cast(BatchHandler, registration.fn)))
        for item in rest:
            outcomes[item.index] = await self.single.deliver(item.message, alone)
        return []

    async def _report_failures(
        self, items: list[_Item], error_class: str, text: str, outcomes: dict[int, Outcome]
    ) -> None:
        self.stats.failures += len(items)
        self.meters.failures.add(len(items), {"target": items[0].message.target, "permanent": False})
        events = [
            AttemptEvent.failed(
                i.message.occurrence_id,
                i.message.attempt,
                i.lease,
                error_class,
                text,
                scheduled_for=i.message.scheduled_for,
            )
            for i in items
        ]
        reported = await self._report(events, items[0].message.target)
        for item in items:
            outcomes[item.index] = Outcome.FAILED if reported else Outcome.ABANDONED

    def _already_applied_events(self, items: list[_Item], rows: Sequence[asyncpg.Record]) -> list[AttemptEvent]:
        """``already_applied`` for occurrences whose dedupe row existed, naming the token stored with it."""
        tokens = {row["occurrence_id"]: row["lease_token"] for row in rows}
        return [
            AttemptEvent.already_applied(
                i.message.occurrence_id,
                i.message.attempt,
                tokens.get(i.message.occurrence_id),
                self.config.group,
                i.message.scheduled_for,
            )
            for i in items
        ]

    def _count_duplicates(self, items: list[_Item], outcomes: dict[int, Outcome]) -> None:
        if not items:
            return
        self.stats.duplicates += len(items)
        self.meters.duplicates.add(len(items), {"target": items[0].message.target})
        for item in items:
            outcomes[item.index] = Outcome.DUPLICATE
        for item in items if log.isEnabledFor(logging.INFO) else ():
            log.info(
                "duplicate delivery suppressed",
                extra={**ids(item.message), "action": "occurrence.duplicate", "attempt": item.message.attempt},
            )

    async def _already_applied(
        self, items: list[_Item], rows: Sequence[asyncpg.Record], outcomes: dict[int, Outcome]
    ) -> None:
        if items and await self._report(self._already_applied_events(items, rows), items[0].message.target):
            self._count_duplicates(items, outcomes)

    async def _skip(self, items: list[tuple[_Item, str]], outcomes: dict[int, Outcome]) -> None:
        """Report obsolete or cooperatively canceled occurrences ``canceled`` (with the token once started)."""
        self.stats.canceled += len(items)
        for item, reason in items:
            self.meters.canceled.add(1, {"target": item.message.target, "reason": reason})
            log.info(
                "occurrence canceled: not applied",
                extra={
                    **ids(item.message),
                    "action": "occurrence.canceled",
                    "reason": reason,
                    "version": item.message.schedule_version,
                },
            )
        events = [
            AttemptEvent.canceled(
                i.message.occurrence_id, i.message.attempt, reason, i.token, self.config.group, i.message.scheduled_for
            )
            for i, reason in items
        ]
        reported = await self._report(events, items[0][0].message.target)
        for item, _ in items:
            outcomes[item.index] = Outcome.CANCELED if reported else Outcome.ABANDONED

    async def _report(self, events: list[AttemptEvent], target: str) -> bool:
        """Send outcomes in one Kafka batch per partition, retrying in place
        (``AttemptRunner.report_until_acknowledged``)."""
        return await self.single.report_until_acknowledged(
            lambda: self.reporter.send_many(events, target),
            "attempt reports not delivered; retrying",
            {"events": len(events)},
        )


def _as_exception(error: BaseException) -> Exception:
    """What a handler named as an occurrence's failure (anything not an Exception becomes a RuntimeError)."""
    return error if isinstance(error, Exception) else RuntimeError(repr(error))


def _one_by_one(fn: BatchHandler) -> Callable[[Occurrence, asyncpg.Connection], Awaitable[None]]:
    """A batch handler called with one occurrence: the single protocol runs it (an occurrence the handler
    names in FailedOccurrences fails with its own error)."""

    async def alone(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        try:
            await fn([occurrence], conn)
        except FailedOccurrences as failed:
            error = failed.errors.get(occurrence.occurrence_id)
            if error is None:
                raise
            raise _as_exception(error) from failed

    return alone


async def _insert_dedupe_rows(conn: asyncpg.Connection, group: str, rows: str) -> list[asyncpg.Record]:
    """The batch's dedupe rows inserted in the open transaction; returns those inserted now (the others were
    applied before, or by a twin this waited for). Unchecked first (schemas.connections.unchecked_first): a
    batch rarely holds a redelivery."""

    async def run(checked: bool) -> list[asyncpg.Record]:
        return await conn.fetch(*CONSUMER_QUERIES.insert_dedupe_batch(consumer_group=group, rows=rows, checked=checked))

    inserted, checked = await unchecked_first(conn, run)
    if checked:
        log.debug("a batch holds an occurrence applied before; its dedupe rows inserted again, checked")
    return inserted


def _dedupe_rows(items: list[_Item]) -> str:
    """The dedupe rows of ``items`` as ``insert_dedupe_batch`` reads them."""
    return json_rows(
        [
            {
                "occurrence_id": m.occurrence_id,
                "schedule_id": m.schedule_id,
                "schedule_version": m.schedule_version,
                "tenant_id": m.tenant_id,
                "scheduled_for": m.scheduled_for,
                "attempt": m.attempt,
                "lease_token": i.token,
                "slot": is_slot_occurrence(m.occurrence_id, m.schedule_id, m.schedule_version, m.scheduled_for),
            }
            for i, m in ((i, i.message) for i in items)
        ]
    )

"""One delivery of one occurrence: the attempt protocol between the app's database and the engine.

For a decoded occurrence message the runner:

1. skips it if the schedule-state view says its version is obsolete or its
   schedule canceled (reports ``canceled``, no transaction);
2. opens a transaction on the app's database, bounded by the lease
   (``lock_timeout``, ``idle_in_transaction_session_timeout``), and inserts
   the dedupe row (consumer group, occurrence_id) with a fresh lease token;
   if the row already exists the effect was applied: report
   ``already_applied`` with the token recorded in the row, and stop;
3. reports ``started`` (attempt number from the message, the new token, the
   lease TTL) and waits for the broker's acknowledgement — only then is the
   attempt real; no acknowledgement in time sends the same ``started`` again
   (the record may be written: a copy is a duplicate for the engine) until
   the lease runs out by the worker's clock, then rolls back and retries in
   place with a new claim;
4. **the barrier** (``ConsumerConfig.attempt_barrier``, on by default): waits
   for the engine's answer to that ``started`` (``consumers.attempt_grants``),
   sent after the engine's transaction committed. ``granted`` means the engine
   confirmed, after this dedupe insert, that the occurrence is live and the
   lease this worker's; ``refused`` (canceled, fenced, ...) rolls back: no
   effect, the handler is not called, nothing more is reported (the engine
   knows). No answer within ``attempt_grant_timeout`` asks again: the same
   ``started`` (a duplicate the engine answers from its state), while the lease
   lasts, up to ``GRANT_ASKS`` waits in all; then it rolls back and retries in
   place: a new claim, a new ``started``, no attempt consumed;
5. re-checks the view right before calling the handler (a fast path, and the
   only check with the barrier off);
6. calls the handler with the occurrence and the open connection, under the
   target's timeout, while the view watches for the schedule's cancellation.
   The lease is heartbeated from the first try to send ``started`` (through
   the wait for the answer) to the commit, and a lease that ran out by the
   worker's own clock before the handler is not used
   (:mod:`consumers.attempt_leases`);
7. commits, then reports ``succeeded``; or rolls back and reports ``failed``
   (error class, message, permanent or not) or ``canceled``.

Only the engine decides retries: a failed handler is reported, never retried
here. What is retried here, in place and without consuming an attempt, is an
**infrastructure error**: the app's database unreachable, or the broker not
acknowledging a report. A database session that ended during the handler
while the database itself is reachable (e.g. PostgreSQL ended a transaction
left idle past the lease) is the attempt's failure, not an outage.

Crash safety (``docs/consumer-runtime.md``): every step is either undone by a
rollback or repeated harmlessly on redelivery, because the dedupe row commits
with the effect and the engine fences by lease token.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import asyncpg
from opentelemetry import metrics

from consumers.attempt_grants import GrantWaiter
from consumers.attempt_leases import HeldLease, LeaseKeeper, LocalLease
from consumers.attempt_reports import AttemptReporter
from consumers.config import ConsumerConfig
from consumers.errors import (
    CommitOutcomeUnknown,
    InfrastructureError,
    OccurrenceCanceled,
    PermanentError,
    lost_connection,
)
from consumers.occurrence import Cancellation, Occurrence
from consumers.schedule_states import ScheduleStateView
from schemas import observability as obs
from schemas.attempt_events import AttemptEvent
from schemas.attempt_grants import FOREIGN_GROUP, NOT_AUTHENTICATED, AttemptGrant
from schemas.clock import pause
from schemas.error_classification import DATABASE_ERRORS
from schemas.identity import is_slot_occurrence
from schemas.messages import OccurrenceMessage
from schemas.queries import CONSUMER_QUERIES

log = logging.getLogger("chronoq.consumer")

Handler = Callable[[Occurrence, asyncpg.Connection], Awaitable[None]]
BatchHandler = Callable[[list[Occurrence], asyncpg.Connection], Awaitable[None]]
Hook = Callable[[Occurrence], Awaitable[None]]

LEASE_EXPIRED = "LeaseExpired"
HANDLER_TIMEOUT = "HandlerTimeout"


class Outcome(enum.Enum):
    APPLIED = "applied"  # effect committed and succeeded reported
    DUPLICATE = "duplicate"  # the dedupe row existed: already_applied reported
    FAILED = "failed"  # the handler failed; reported, the engine decides the retry
    CANCELED = "canceled"  # obsolete version / canceled schedule; reported
    DEAD_LETTERED = "dead_lettered"  # a poison record went to the dead-letter topic
    ABANDONED = "abandoned"  # shutdown came first: not finished, its offset is not committed
    PARKED = "parked"  # the binding view is behind the record: not finished, retried once it caught up


@dataclass(frozen=True)
class HandlerRegistration:
    """A target's handler and its limits. ``batch``: the handler takes a list of up to that many
    occurrences (:mod:`consumers.batch_runner`); None: one occurrence per call. ``idle_timeout``: the
    idle-in-transaction limit of this target's transactions (``ConsumerConfig.idle_timeout_for`` of its
    timeout, so a per-target timeout above the app's limit can still commit); None: the app's."""

    fn: Handler | BatchHandler
    timeout: float
    concurrency: int
    permanent_errors: tuple[type[BaseException], ...] = ()
    batch: int | None = None
    idle_timeout: float | None = None

    def idle_limit(self, config: ConsumerConfig) -> float:
        """Seconds this target's transaction may sit idle before PostgreSQL ends it."""
        return self.idle_timeout if self.idle_timeout is not None else config.idle_timeout_for(self.timeout)


@dataclass(frozen=True)
class ConsumerHooks:
    """Awaited at the handoffs of a delivery; tests use them to kill or pause the process exactly there.

    after_started: dedupe row inserted (uncommitted), ``started`` acknowledged; the handler has not run.
    before_commit: the handler returned; effect and dedupe row not committed yet.
    after_commit: effect and dedupe row committed; ``succeeded`` not reported yet.
    after_report: ``succeeded`` acknowledged by the broker; the Kafka offset not committed yet.
    """

    after_started: Hook | None = None
    before_commit: Hook | None = None
    after_commit: Hook | None = None
    after_report: Hook | None = None


@dataclass
class ConsumerStats:
    """Counts since start: what happened to the deliveries this app processed."""

    applied: int = 0
    duplicates: int = 0
    failures: int = 0
    canceled: int = 0
    dead_lettered: int = 0
    infrastructure_errors: int = 0
    abandoned: int = 0
    batch_failures: int = 0  # batches whose failure sent their occurrences through one by one
    refused: int = 0  # deliveries the engine refused (the barrier): rolled back, the handler not called
    grant_timeouts: int = 0  # deliveries whose asks for the engine's answer all ran out (retried in place)
    grants_asked_again: int = 0  # `started` sent again with its token because no answer came in time
    leases_lost: int = 0  # attempts whose lease ran out by the worker's clock before they finished
    binding_behind: int = 0  # records parked because the target-binding view was older than their version
    consumer_restarts: int = 0  # Kafka consumers recreated because they stalled (ConsumerConfig.stall_timeout)
    outcomes: list[tuple[uuid.UUID, int, str]] = field(default_factory=list)  # last 1000 (id, attempt, outcome)

    def record(self, occurrence_id: uuid.UUID, attempt: int, outcome: Outcome) -> None:
        self.outcomes.append((occurrence_id, attempt, outcome.value))
        del self.outcomes[:-1000]


class ConsumerMetrics:
    def __init__(self, meter: metrics.Meter) -> None:
        self.applied = meter.create_counter(obs.OCCURRENCES_APPLIED, unit="1")
        self.duplicates = meter.create_counter(obs.DUPLICATE_DELIVERIES, unit="1")
        self.failures = meter.create_counter(obs.HANDLER_FAILURES, unit="1")
        self.poison = meter.create_counter(obs.POISON_MESSAGES, unit="1")
        self.duration = meter.create_histogram(obs.HANDLER_DURATION, unit="s")
        self.canceled = meter.create_counter(obs.CANCELED_DELIVERIES, unit="1")
        self.restarts = meter.create_counter(obs.CONSUMER_RESTARTS, unit="1")
        self.lag = meter.create_gauge(obs.CONSUMER_LAG, unit="1")
        self.batch_size = meter.create_histogram(
            obs.CONSUMER_BATCH_SIZE, unit="1", description="occurrences per batch handler delivery"
        )
        self.grants = meter.create_counter(
            obs.ATTEMPT_GRANTS, unit="1", description="answers to started: granted, refused or timeout"
        )
        self.binding_behind = meter.create_counter(
            obs.BINDING_VIEW_BEHIND, unit="1", description="records whose binding version the view had not read"
        )
        self.leases_lost = meter.create_counter(
            obs.CONSUMER_LEASES_LOST, unit="1", description="attempts whose lease the worker found overdue"
        )
        self.grant_wait = meter.create_histogram(
            obs.ATTEMPT_GRANT_WAIT, unit="s", description="from sending started to the engine's answer"
        )


#: Waits for the engine's answer to one ``started`` before its claim is given up: the first, and two more each
#: after sending the same ``started`` again (:meth:`AttemptRunner.await_grants`).
GRANT_ASKS = 3
#: Asking again ends at these (the database or the broker away); the delivery then goes back to its retry in place.
ASK_AGAIN_ERRORS: tuple[type[BaseException], ...] = (InfrastructureError, *DATABASE_ERRORS)


def limit_ms(seconds: float) -> str:
    return str(max(int(seconds * 1000), 1))


class AttemptRunner:
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
        grants: GrantWaiter | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.reporter = reporter
        self.view = view
        self.hooks = hooks
        self.meters = meters
        self.stats = stats
        self.stopping = stopping
        self.grants = grants  # None: no barrier (ConsumerConfig.attempt_barrier off, or nothing reported)

    async def deliver(self, message: OccurrenceMessage, registration: HandlerRegistration) -> Outcome:
        """Process one delivery to the end, retrying infrastructure errors in place until shutdown."""
        delays = self.config.redelivery_delays()
        while True:
            try:
                outcome = await self._attempt(message, registration)
            except InfrastructureError as err:
                self.stats.infrastructure_errors += 1
                delay = next(delays)
                log.warning(
                    "infrastructure error; the delivery is retried in place, no attempt consumed",
                    extra={
                        **ids(message),
                        "action": "occurrence.infrastructure_error",
                        "error": str(err),
                        "retry_in_s": delay,
                    },
                )
                await pause(self.stopping, delay)
                if self.stopping.is_set():
                    outcome = Outcome.ABANDONED
                else:
                    continue
            if outcome is Outcome.ABANDONED:
                self.stats.abandoned += 1
            self.stats.record(message.occurrence_id, message.attempt, outcome)
            return outcome

    # -- one try --------------------------------------------------------------------------------

    async def _attempt(self, message: OccurrenceMessage, registration: HandlerRegistration) -> Outcome:
        obsolete = self.view.verdict(message.schedule_id, message.schedule_version)
        if obsolete:
            return await self._skip(message, obsolete, None)
        try:
            conn = await self.pool.acquire()
        except DATABASE_ERRORS as err:
            raise InfrastructureError(f"app database unreachable: {err!r}") from err
        try:
            return await self._in_transaction(conn, message, registration)
        finally:
            try:
                await self.pool.release(conn)
            except DATABASE_ERRORS:
                pass  # a dead connection; the pool replaces it

    async def _in_transaction(
        self, conn: asyncpg.Connection, message: OccurrenceMessage, registration: HandlerRegistration
    ) -> Outcome:
        cfg = self.config
        token = uuid.uuid4()
        transaction = conn.transaction()
        try:
            await transaction.start()
            await conn.fetchval(
                *CONSUMER_QUERIES.limit_transaction(
                    lock_timeout_ms=limit_ms(cfg.lock_timeout),
                    idle_timeout_ms=limit_ms(registration.idle_limit(cfg)),
                )
            )
            claimed = await conn.fetchrow(
                *CONSUMER_QUERIES.insert_dedupe(
                    consumer_group=cfg.group,
                    occurrence_id=message.occurrence_id,
                    schedule_id=message.schedule_id,
                    schedule_version=message.schedule_version,
                    tenant_id=message.tenant_id,
                    scheduled_for=message.scheduled_for,
                    attempt=message.attempt,
                    lease_token=token,
                    slot=is_slot_occurrence(
                        message.occurrence_id, message.schedule_id, message.schedule_version, message.scheduled_for
                    ),
                )
            )
        except asyncpg.exceptions.LockNotAvailableError as err:
            await rollback(transaction)
            raise InfrastructureError(
                "another attempt of this occurrence holds its uncommitted dedupe row; trying again later"
            ) from err
        except DATABASE_ERRORS as err:
            await rollback(transaction)
            raise InfrastructureError(f"app database error before the handler: {err!r}") from err
        if claimed is None:
            await rollback(transaction)
            return await self._duplicate(conn, message)
        applied_at = claimed["applied_at"]
        keeper = self.lease_keeper(message.target, [HeldLease.of(message, token)])
        try:
            refusal = await self._start(message, token, claimed["claim_order"], conn, transaction, keeper)
            if refusal is not None:
                return refusal
            await self.ensure_lease(keeper, transaction)
            obsolete = self.view.verdict(message.schedule_id, message.schedule_version)  # right before the handler
            if obsolete:
                await rollback(transaction)
                await keeper.stop()
                return await self._skip(message, obsolete, token)
            occurrence = Occurrence.from_message(message, applied_at, token, Cancellation())
            if self.hooks.after_started:
                await self.hooks.after_started(occurrence)
            error, timed_out = await self._run_handler(conn, transaction, occurrence, registration, keeper)
        finally:
            await keeper.stop()  # before any outcome is reported
        if error is None or await self.committed_anyway(error, [occurrence], keeper.lease):
            return await self._succeeded(occurrence)
        await rollback(transaction)
        return await self.conclude_failure(conn, occurrence, registration, keeper.lease, error, timed_out)

    def lease_keeper(self, target: str, leases: list[HeldLease]) -> LeaseKeeper:
        """The keeper of an attempt's leases, created right before its ``started`` is sent."""
        return LeaseKeeper(
            self.reporter,
            target,
            self.config.lease_ttl,
            self.config.renew_interval,
            leases,
            on_lost=lambda held: self._lease_lost(target, held),
        )

    def _lease_lost(self, target: str, held: int) -> None:
        self.stats.leases_lost += held
        self.meters.leases_lost.add(held, {"target": target})

    async def ensure_lease(self, keeper: LeaseKeeper, transaction: asyncpg.transaction.Transaction) -> None:
        """Before the handler: the lease must still be this worker's by its own clock. One that ran out while
        the engine's answer was on its way (the process starved or paused, heartbeats not acknowledged) is not
        used — the engine may have ended it — so the attempt is rolled back and retried in place with a new
        claim (InfrastructureError): the engine takes it over if the lease is still open, else refuses it."""
        if keeper.alive():
            return
        await rollback(transaction)
        raise InfrastructureError(
            f"the lease ran out ({self.config.lease_ttl:g} s without an acknowledged heartbeat) before the handler"
            " could run; rolled back, retrying with a new claim"
        )

    async def _run_handler(
        self,
        conn: asyncpg.Connection,
        transaction: asyncpg.transaction.Transaction,
        occurrence: Occurrence,
        registration: HandlerRegistration,
        keeper: LeaseKeeper,
    ) -> tuple[Exception | None, bool]:
        """Run the handler and commit, while ``keeper`` renews the lease; it stops renewing before returning."""
        started = time.perf_counter()
        deadline = asyncio.timeout(registration.timeout)
        error: Exception | None = None
        with self.view.watch(occurrence.schedule_id, occurrence.cancellation):
            try:
                async with deadline:
                    await cast(Handler, registration.fn)(occurrence, conn)
                if self.hooks.before_commit:
                    await self.hooks.before_commit(occurrence)
                await commit(conn, transaction)
            except Exception as err:  # noqa: BLE001 - every handler failure is classified below
                error = err
            finally:
                await keeper.stop()
        self.meters.duration.record(time.perf_counter() - started, {"target": occurrence.target})
        return error, deadline.expired()

    # -- the barrier ----------------------------------------------------------------------------

    async def _start(
        self,
        message: OccurrenceMessage,
        token: uuid.UUID,
        claim_order: int | None,
        conn: asyncpg.Connection,
        transaction: asyncpg.transaction.Transaction,
        keeper: LeaseKeeper,
    ) -> Outcome | None:
        """Send ``started`` inside the dedupe transaction (:meth:`announce`) and, with the barrier, await the
        engine's answer (:meth:`await_grants`, asking again while the lease lasts).

        None: go ahead (granted, or no barrier). An Outcome: the engine refused, rolled back. Raises
        InfrastructureError (rolled back) when the broker does not take ``started`` within the lease or no
        answer comes after asking ``GRANT_ASKS`` times: the delivery is retried in place with a new claim.
        """
        cfg = self.config
        started = AttemptEvent.started(
            message.occurrence_id,
            message.attempt,
            token,
            cfg.lease_ttl,
            cfg.group,
            cfg.worker,
            claim_order=claim_order,
            scheduled_for=message.scheduled_for,
        )
        await self.announce(lambda: self.reporter.send(started, message.target), keeper, transaction, [token])
        if self.grants is None:
            return None
        grant = (
            await self.await_grants(
                [token], message.target, lambda _: self.reporter.send(started, message.target), keeper, conn
            )
        )[token]
        if grant is None:
            await rollback(transaction)
            raise InfrastructureError(
                f"no answer from the engine to started in {GRANT_ASKS} waits of {cfg.grant_timeout:g} s, or"
                " before the lease ran out (attempt processor down or behind); rolled back, retrying with a new"
                " claim"
            )
        if not grant.granted and grant.reason != FOREIGN_GROUP:
            await rollback(transaction)
            return self.refused(message, grant)
        return None  # granted; or an observing group, which the engine does not gate (the view does)

    async def announce(
        self,
        send: Callable[[], Awaitable[None]],
        keeper: LeaseKeeper,
        transaction: asyncpg.transaction.Transaction,
        tokens: list[uuid.UUID],
    ) -> None:
        """Send ``started`` (``send``) inside the dedupe transaction, renewing its leases from the first try.

        A broker that does not acknowledge in time may still write the records, and the engine then starts
        their leases. So ``started`` is sent again with the same lease tokens — a copy is a duplicate the
        engine recognises, answered from the state — instead of rolled back and claimed anew, which would
        make each delivery a takeover (a new attempt row, the old one closed ``fenced``: in a burst on a
        starved broker, thousands of them per batch, all load on the engine that is already behind). Only
        once the lease is lost by the worker's own clock (no heartbeat acknowledged for a ttl either), after
        ``attempt_grant_timeout`` of tries (the transaction sits idle meanwhile), or on shutdown, is the
        transaction rolled back and InfrastructureError raised: retried in place with a new claim. Each try
        sent again counts as an infrastructure error.
        """
        if self.grants is not None:
            self.grants.expect(tokens)  # before sending: the answers may come back at once
        keeper.start()  # the engine's leases may begin with the first try, acknowledged or not
        delays = self.config.redelivery_delays()
        give_up_at = time.monotonic() + self.config.grant_timeout
        while True:
            try:
                await send()
                return
            except InfrastructureError as err:
                if self.stopping.is_set() or not keeper.alive() or time.monotonic() >= give_up_at:
                    if self.grants is not None:
                        self.grants.forget(tokens)
                    await rollback(transaction)
                    raise  # counted by the caller's retry in place
                self.stats.infrastructure_errors += 1
                log.warning(
                    "started not acknowledged in time; sending it again with the same lease tokens",
                    extra={"action": "attempt.started_resent", "occurrences": len(tokens), "error": str(err)},
                )
            await pause(self.stopping, next(delays))

    async def await_grants(
        self,
        lease_tokens: list[uuid.UUID],
        target: str,
        ask_again: Callable[[list[uuid.UUID]], Awaitable[None]],
        keeper: LeaseKeeper,
        conn: asyncpg.Connection,
    ) -> dict[uuid.UUID, AttemptGrant | None]:
        """The engine's answers to the ``started`` just sent for ``lease_tokens`` (registered with ``expect``
        before sending); None: no answer after ``GRANT_ASKS`` waits of ``attempt_grant_timeout``.

        An answer late is not a reason to give the claim up: the attempt processor may be behind (the answer
        is on its way) or its answer lost (a reply the broker did not take is dropped). While the lease lasts
        by the worker's clock, ``ask_again(tokens)`` sends the same ``started`` for the tokens still unanswered
        — a duplicate, answered from the engine's state — and the wait starts again; the transaction (on
        ``conn``) is touched first, so PostgreSQL does not end it for sitting idle. A new claim instead would
        make each delivery a takeover (a new attempt row, the old one fenced) for an engine already behind.
        """
        assert self.grants is not None
        answers = await self._wait_for_grants(lease_tokens, target)
        for _ in range(GRANT_ASKS - 1):
            missing = [token for token, grant in answers.items() if grant is None]
            if not missing or self.stopping.is_set() or not keeper.alive():
                break
            self.stats.grants_asked_again += len(missing)
            self.meters.grants.add(len(missing), {"target": target, "result": "asked_again"})
            log.warning(
                "no answer from the engine to started in time; sending it again with the same lease tokens",
                extra={"action": "attempt.grant_asked_again", "target": target, "occurrences": len(missing)},
            )
            self.grants.expect(missing)  # before sending: the answers may come back at once
            try:
                await conn.fetchval(*CONSUMER_QUERIES.ping())
                await ask_again(missing)
            except ASK_AGAIN_ERRORS:
                self.grants.forget(missing)
                break  # the broker or the database is away: the caller rolls back and retries in place
            answers.update(await self._wait_for_grants(missing, target))
        # One add per result, not per answer: the SDK's add costs ~10 µs, a batch has thousands of answers.
        results = Counter("timeout" if grant is None else grant.result for grant in answers.values())
        for result, count in results.items():
            self.meters.grants.add(count, {"target": target, "result": result})
        timeouts = results["timeout"]
        if timeouts:
            self.stats.grant_timeouts += timeouts
            log.warning(
                "no answer from the engine to started, asked again while the lease lasted; the delivery is rolled"
                " back and retried in place",
                extra={"action": "attempt.grant_timeout", "target": target, "occurrences": timeouts},
            )
        return answers

    async def _wait_for_grants(
        self, lease_tokens: list[uuid.UUID], target: str
    ) -> dict[uuid.UUID, AttemptGrant | None]:
        """One wait of ``attempt_grant_timeout`` for the answers to tokens registered with ``expect``."""
        assert self.grants is not None
        began = time.perf_counter()
        answers = await self.grants.wait(lease_tokens, self.config.grant_timeout)
        self.meters.grant_wait.record(time.perf_counter() - began, {"target": target})
        return answers

    def refused(self, occurrence: OccurrenceMessage | Occurrence, grant: AttemptGrant) -> Outcome:
        """The engine refused the attempt (rolled back already): no effect, nothing more to report."""
        self.stats.refused += 1
        self.stats.canceled += 1
        self.meters.canceled.add(1, {"target": occurrence.target, "reason": f"refused_{grant.reason}"})
        # Not authenticated is a misconfiguration (the target's attempt credential), not a race: say so.
        log.log(
            logging.WARNING if grant.reason == NOT_AUTHENTICATED else logging.INFO,
            "attempt refused by the engine: not applied"
            + (
                "; its events are not signed with the target's attempt credential (ConsumerConfig.attempt_credentials)"
                if grant.reason == NOT_AUTHENTICATED
                else ""
            ),
            extra={
                **ids(occurrence),
                "action": "attempt.refused",
                "reason": grant.reason,
                "lease_token": str(grant.lease_token),
            },
        )
        return Outcome.CANCELED

    # -- outcomes -------------------------------------------------------------------------------

    async def _succeeded(self, occurrence: Occurrence) -> Outcome:
        self.stats.applied += 1
        self.meters.applied.add(1, {"target": occurrence.target})
        log.info(
            "occurrence applied",
            extra={**ids(occurrence), "action": "occurrence.applied", "attempt": occurrence.attempt},
        )
        if self.hooks.after_commit:
            await self.hooks.after_commit(occurrence)
        event = AttemptEvent.succeeded(
            occurrence.occurrence_id,
            occurrence.attempt,
            occurrence.lease_token,  # type: ignore[arg-type]
            occurrence.scheduled_for,
        )
        if not await self._report(event, occurrence.target):
            return Outcome.ABANDONED
        if self.hooks.after_report:
            await self.hooks.after_report(occurrence)
        return Outcome.APPLIED

    async def conclude_failure(
        self,
        conn: asyncpg.Connection,
        occurrence: Occurrence,
        registration: HandlerRegistration,
        lease: LocalLease,
        error: Exception,
        timed_out: bool,
    ) -> Outcome:
        """Classify a failed attempt (rolled back) and report it: canceled, failed (permanent or not), or
        an infrastructure error when the app database is gone (raised: the delivery is retried in place)."""
        token = occurrence.lease_token
        assert token is not None
        if isinstance(error, OccurrenceCanceled) or occurrence.cancellation.is_canceled:
            return await self._skip(occurrence, "cooperative", token)
        permanent = False
        error_class, text = type(error).__name__, str(error) or repr(error)
        if timed_out:
            error_class, text = HANDLER_TIMEOUT, f"the handler ran longer than {registration.timeout} s"
        elif lost_connection(error, conn):
            if not lease.check():
                error_class = LEASE_EXPIRED
                text = f"the attempt outlived its {self.config.lease_ttl} s lease; its transaction was ended"
            elif not await self.database_reachable():
                raise InfrastructureError(f"app database unreachable during the handler: {error!r}") from error
            else:
                text = f"the attempt's database session ended: {text}"
        else:
            permanent = isinstance(error, PermanentError) or isinstance(error, registration.permanent_errors)
        self.stats.failures += 1
        self.meters.failures.add(1, {"target": occurrence.target, "permanent": permanent})
        log.warning(
            "handler failed",
            extra={
                **ids(occurrence),
                "action": "occurrence.failed",
                "attempt": occurrence.attempt,
                "error_class": error_class,
                "permanent": permanent,
                "error": text[:500],
            },
        )
        event = AttemptEvent.failed(
            occurrence.occurrence_id, occurrence.attempt, token, error_class, text, permanent, occurrence.scheduled_for
        )
        return Outcome.FAILED if await self._report(event, occurrence.target) else Outcome.ABANDONED

    async def committed_anyway(self, error: Exception, occurrences: Sequence[Occurrence], lease: LocalLease) -> bool:
        """Whether an attempt that failed committed after all. Only a COMMIT whose connection died
        (CommitOutcomeUnknown) can have: its outcome is read by key on a fresh connection — the dedupe rows of
        ``occurrences`` carry this attempt's lease tokens exactly when it committed (one transaction wrote
        them all). True: it did. It did not, within its lease: the error is raised, an infrastructure error
        (nothing of the attempt exists; the delivery is retried in place, no attempt spent). It did not and
        its lease is lost (paused past it, its session ended by the server): False, the caller reports the
        failure as before. False for any other failure. InfrastructureError when the database cannot be asked
        (retried in place; the dedupe key decides)."""
        if not isinstance(error, CommitOutcomeUnknown):
            return False
        tokens = {o.occurrence_id: o.lease_token for o in occurrences}
        try:
            rows = await self.pool.fetch(
                *CONSUMER_QUERIES.dedupe_rows(consumer_group=self.config.group, occurrence_ids=list(tokens))
            )
        except DATABASE_ERRORS as err:
            raise InfrastructureError(f"a commit's outcome is unknown and the database unreachable: {err!r}") from err
        committed = any(r["lease_token"] == tokens[r["occurrence_id"]] for r in rows)
        log.warning(
            "connection lost during COMMIT; looked up by key: %s",
            "committed" if committed else "not committed",
            extra={"action": "attempt.commit_outcome_unknown", "committed": committed, "occurrences": len(tokens)},
        )
        if not committed and lease.check():
            raise error
        return committed

    async def _duplicate(self, conn: asyncpg.Connection, message: OccurrenceMessage) -> Outcome:
        try:
            row = await conn.fetchrow(
                *CONSUMER_QUERIES.dedupe_row(consumer_group=self.config.group, occurrence_id=message.occurrence_id)
            )
        except DATABASE_ERRORS as err:
            raise InfrastructureError(f"app database error reading the dedupe row: {err!r}") from err
        self.stats.duplicates += 1
        self.meters.duplicates.add(1, {"target": message.target})
        log.info(
            "duplicate delivery suppressed",
            extra={**ids(message), "action": "occurrence.duplicate", "attempt": message.attempt},
        )
        event = AttemptEvent.already_applied(
            message.occurrence_id,
            message.attempt,
            row["lease_token"] if row else None,
            self.config.group,
            message.scheduled_for,
        )
        return Outcome.DUPLICATE if await self._report(event, message.target) else Outcome.ABANDONED

    async def _skip(self, occurrence: OccurrenceMessage | Occurrence, reason: str, token: uuid.UUID | None) -> Outcome:
        self.stats.canceled += 1
        self.meters.canceled.add(1, {"target": occurrence.target, "reason": reason})
        log.info(
            "occurrence canceled: not applied",
            extra={
                **ids(occurrence),
                "action": "occurrence.canceled",
                "reason": reason,
                "version": occurrence.schedule_version,
            },
        )
        event = AttemptEvent.canceled(
            occurrence.occurrence_id, occurrence.attempt, reason, token, self.config.group, occurrence.scheduled_for
        )
        return Outcome.CANCELED if await self._report(event, occurrence.target) else Outcome.ABANDONED

    async def _report(self, event: AttemptEvent, target: str) -> bool:
        """Send an outcome, retrying in place (:meth:`report_until_acknowledged`)."""
        return await self.report_until_acknowledged(
            lambda: self.reporter.send(event, target),
            "attempt report not delivered; retrying",
            {"occurrence_id": str(event.occurrence_id), "event": event.event},
        )

    async def report_until_acknowledged(
        self, send: Callable[[], Awaitable[None]], warning: str, about: dict[str, object]
    ) -> bool:
        """Send outcomes (``send``), retrying in place until the broker acknowledges them: the effects are
        settled, only the reports are missing. Each failed try is an infrastructure error, logged as
        ``warning`` with ``about``.

        False if shutdown came first: the offsets are then not committed and the redelivery reports again.
        """
        delays = self.config.redelivery_delays()
        while True:
            try:
                await send()
                return True
            except InfrastructureError as err:
                self.stats.infrastructure_errors += 1
                log.warning(warning, extra={"action": "attempt.report_failed", **about, "error": str(err)})
            await pause(self.stopping, next(delays))
            if self.stopping.is_set():
                return False

    async def database_reachable(self) -> bool:
        try:
            async with asyncio.timeout(5):
                await self.pool.fetchval(*CONSUMER_QUERIES.ping())
        except Exception:  # noqa: BLE001 - any failure means "not reachable now"
            return False
        return True


async def commit(conn: asyncpg.Connection, transaction: asyncpg.transaction.Transaction) -> None:
    """Commit a delivery's transaction; a connection lost on the way raises CommitOutcomeUnknown (whether the
    server committed is not known to us: the caller looks it up by key). Any other failure is the commit's own
    (a deferred constraint, a serialization failure): the transaction did not commit."""
    try:
        await transaction.commit()
    except Exception as err:
        if lost_connection(err, conn):
            raise CommitOutcomeUnknown(f"the connection was lost during COMMIT: {err!r}") from err
        raise


async def rollback(transaction: asyncpg.transaction.Transaction) -> None:
    """Roll back if still possible; a dead connection has rolled back already."""
    try:
        await transaction.rollback()
    except DATABASE_ERRORS:
        pass


def ids(occurrence: OccurrenceMessage | Occurrence) -> dict[str, str]:
    return {
        "occurrence_id": str(occurrence.occurrence_id),
        "schedule_id": str(occurrence.schedule_id),
        "tenant_id": occurrence.tenant_id,
    }

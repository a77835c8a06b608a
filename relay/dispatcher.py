"""The relay pass: due outbox rows → Kafka, at least once.

Each pass (:meth:`Relay.run_once`; the engine's periodic skeleton runs the
passes, backs off after failures and logs the summary) claims a batch of due rows, publishes them in partition batches,
waits for the broker's acknowledgements, then marks exactly the acknowledged
rows sent (under the claim token) and releases the others for a retry. It
records ``schedule_lag`` (enqueued_at − scheduled_for) for every marked row
and injects W3C trace context into each message's headers, so the consumer's
span continues the relay's trace.

Poison rows: a row the broker refuses for a reason about the row itself (too
large, an invalid or unauthorized topic, any non-retriable answer about it;
``relay/publish_refusals.py``) is given back with ``refusal_retry_delay``, so
it never heads the next pass and the rows behind it are published meanwhile,
and after ``poison_tries`` refusals it is quarantined: never claimed again, its
occurrence DEAD with reason ``unpublishable`` and the broker's error (``chronoq
dlq list``; ``chronoq dlq replay`` once the cause is fixed), counted in
``chronoq.outbox_quarantined``. A transient failure (broker away, timeout) is
retried without limit: nothing about the row is wrong.

Crash safety: dying after the claim leaves rows claimed until the claim
expires, then another pass publishes them; dying after the broker's ack but
before the mark republishes them (a duplicate with the same occurrence_id).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

import asyncpg
from aiokafka.errors import KafkaError
from opentelemetry import metrics, trace

from relay.outbox import Claim, OutboxRow, OutboxStore
from relay.publish_refusals import refusal_reason
from relay.publisher import KafkaPublisher, Outcome, OutgoingRecord
from schemas import observability as obs
from schemas.clock import Clock, DatabaseClock
from schemas.messages import HEADER_OCCURRENCE_ID, HEADER_TENANT

log = logging.getLogger("chronoq.relay")


@dataclass(frozen=True)
class RelayConfig:
    """batch_size: outbox rows claimed and published per pass (default 5000).
    claim_ttl: how long a claim fences other relays; must exceed the publisher's
        ack timeout so a live relay never loses rows it is still publishing.
    idle_interval: longest wait between passes when nothing is due (s).
    error_backoff: wait after a failed pass (s).
    poison_tries: refusals about the row itself (too large, invalid topic...) after
        which a row is quarantined and its occurrence goes DEAD (default 3: a
        refusal during a broker reconfiguration is not final at once).
    refusal_retry_delay: how long a refused row waits before its next try.
    """

    batch_size: int = 5000
    claim_ttl: timedelta = timedelta(seconds=60)
    idle_interval: float = 0.05
    error_backoff: float = 1.0
    poison_tries: int = 3
    refusal_retry_delay: timedelta = timedelta(seconds=1)

    def validate(self, ack_timeout: float) -> None:
        if self.claim_ttl.total_seconds() <= ack_timeout:
            raise ValueError("claim_ttl must exceed the publisher's ack_timeout")
        if self.poison_tries < 1:
            raise ValueError("poison_tries must be at least 1")
        if self.refusal_retry_delay < timedelta(0):
            raise ValueError("refusal_retry_delay must not be negative")


@dataclass(frozen=True)
class RelayHooks:
    """Awaited at the relay's handoffs; tests use them to kill the process exactly there.

    after_claim: rows are claimed in the database, nothing published yet.
    after_publish: the broker acknowledged, the rows are not yet marked sent.
    """

    after_claim: Callable[[], Awaitable[None]] | None = None
    after_publish: Callable[[], Awaitable[None]] | None = None


@dataclass
class RelayReport:
    claimed: int = 0
    published: int = 0
    failed: int = 0
    fenced: int = 0
    refused: int = 0  # of the failed: refused for a reason about the row, retried later
    quarantined: int = 0  # of the refused: given up on, occurrence DEAD
    missed: int = 0  # late at dispatch: recorded MISSED instead of published


class Relay:
    def __init__(
        self,
        store: OutboxStore,
        publisher: KafkaPublisher,
        config: RelayConfig | None = None,
        meter: metrics.Meter | None = None,
        tracer: trace.Tracer | None = None,
        hooks: RelayHooks | None = None,
    ) -> None:
        self.store = store
        self.hooks = hooks or RelayHooks()
        self.publisher = publisher
        self.config = config or RelayConfig()
        self.config.validate(publisher.config.ack_timeout)
        meter = meter or obs.get_meter("relay")
        self.tracer = tracer or obs.get_tracer("relay")
        self._lag = meter.create_histogram(obs.SCHEDULE_LAG, unit="s", description="enqueued_at - scheduled_for")
        self._published = meter.create_counter(obs.OUTBOX_PUBLISHED, unit="1")
        self._failures = meter.create_counter(obs.OUTBOX_PUBLISH_FAILURES, unit="1")
        self._fenced = meter.create_counter(obs.OUTBOX_FENCED_MARKS, unit="1")
        self._backlog = meter.create_gauge(obs.OUTBOX_BACKLOG, unit="1")
        self._quarantined = meter.create_counter(obs.OUTBOX_QUARANTINED, unit="1")
        self._dispatch_missed = meter.create_counter(obs.DISPATCH_MISSED, unit="1")
        self._late_published = meter.create_counter(obs.DISPATCH_LATE_PUBLISHED, unit="1")

    @classmethod
    def create(
        cls,
        pool: asyncpg.Pool,
        publisher: KafkaPublisher,
        config: RelayConfig | None = None,
        clock: Clock | None = None,
        **kwargs: object,
    ) -> Relay:
        return cls(OutboxStore(pool, clock or DatabaseClock()), publisher, config, **kwargs)  # type: ignore[arg-type]

    async def run_once(self) -> RelayReport:
        """One pass: claim, publish, mark acknowledged rows sent, release the rest."""
        claim = await self.store.claim(self.config.batch_size, self.config.claim_ttl)
        report = RelayReport(claimed=len(claim.rows))
        if not claim.rows:
            return report
        if self.hooks.after_claim:
            await self.hooks.after_claim()
        claim = await self._judge_late(claim, report)
        if not claim.rows:
            return report
        with self.tracer.start_as_current_span(obs.SPAN_PUBLISH) as span:
            span.set_attribute("chronoq.outbox_rows", len(claim.rows))
            # Every message of the batch continues this span's trace: the context
            # is serialized once per batch, not once per message.
            trace_headers: list[tuple[str, bytes]] = []
            obs.inject_trace_headers(trace_headers)
            records = [
                OutgoingRecord(
                    row.id,
                    row.topic,
                    row.message_key,
                    row.message,
                    [*_identity_headers(row.occurrence_id, row.tenant_id), *trace_headers],
                )
                for row in claim.rows
            ]
            try:
                outcome = await self.publisher.publish(records)
            except KafkaError as err:
                outcome = {row.id: err for row in claim.rows}
        if self.hooks.after_publish:
            await self.hooks.after_publish()
        acked = [row for row in claim.rows if outcome.get(row.id, KeyError("no outcome")) is None]
        failed = [row for row in claim.rows if outcome.get(row.id, KeyError("no outcome")) is not None]
        if acked:
            result = await self.store.mark_sent(claim.token, [row.id for row in acked])
            report.published = result.marked
            report.fenced = len(acked) - result.marked
            for row in acked:
                self._lag.record(max((result.marked_at - row.scheduled_for).total_seconds(), 0.0))
            self._published.add(result.marked)
            if report.fenced:
                self._fenced.add(report.fenced)
                log.warning(
                    "claim lost before marking; another relay owns these rows",
                    extra={"action": "outbox.fenced", "count": report.fenced},
                )
        if failed:
            report.failed = len(failed)
            self._failures.add(len(failed))
            transient = [row for row in failed if refusal_reason(outcome.get(row.id)) is None]
            if transient:
                first_error = repr(outcome.get(transient[0].id, KeyError("no outcome")))
                await self.store.release(claim.token, [row.id for row in transient], first_error)
                log.warning(
                    "publish failed; rows released for retry",
                    extra={"action": "outbox.publish_failed", "count": len(transient), "error": first_error},
                )
            refused = [row for row in failed if refusal_reason(outcome.get(row.id)) is not None]
            if refused:
                await self._refuse(claim.token, refused, outcome, report)
        return report

    async def _refuse(self, token: uuid.UUID, refused: list[OutboxRow], outcome: Outcome, report: RelayReport) -> None:
        """Give refused rows back for a later try, and quarantine those refused ``poison_tries`` times."""
        by_error: dict[str, list[OutboxRow]] = {}
        for row in refused:
            by_error.setdefault(repr(outcome[row.id]), []).append(row)
        for error_text, rows in by_error.items():
            error = outcome[rows[0].id]
            assert error is not None
            reason = refusal_reason(error)
            refusals = await self.store.refuse(token, [r.id for r in rows], error_text, self.config.refusal_retry_delay)
            report.refused += len(refusals)
            spent = [row_id for row_id, count in refusals.items() if count >= self.config.poison_tries]
            log.warning(
                "publish refused for a reason about the rows; retried later",
                extra={"action": "outbox.publish_refused", "reason": reason, "count": len(rows), "error": error_text},
            )
            if not spent:
                continue
            dead = await self.store.quarantine(spent, type(error).__name__, error_text)
            report.quarantined += len(spent)
            self._quarantined.add(len(spent), {"reason": reason or "refused"})
            log.error(
                "outbox rows quarantined after repeated refusals; their occurrences are DEAD",
                extra={
                    "action": "outbox.quarantined",
                    "reason": reason,
                    "rows": spent,
                    "occurrence_ids": [str(r["occurrence_id"]) for r in dead],
                    "error": error_text,
                },
            )

    async def _judge_late(self, claim: Claim, report: RelayReport) -> Claim:
        """Lateness at dispatch: claimed deliveries of on-time occurrences past their late_after are published
        only if their schedule's policy still allows; the others are recorded MISSED and left out."""
        now = claim.now
        late = [r for r in claim.rows if r.late_after is not None and now is not None and r.late_after < now]
        if not late or now is None:
            return claim
        judgement = await self.store.judge_late(claim.token, late, now)
        if judgement.missed:
            report.missed += judgement.missed
            self._dispatch_missed.add(judgement.missed, {"lane": "late"})
            log.warning(
                "occurrences too late at dispatch for their misfire policy; recorded MISSED",
                extra={"action": "outbox.missed_at_dispatch", "count": judgement.missed},
            )
        if judgement.published_late:
            self._late_published.add(judgement.published_late, {"lane": "late"})
        if not judgement.skip:
            return claim
        return Claim(claim.token, [r for r in claim.rows if r.id not in judgement.skip], claim.now)

    async def record_backlog(self) -> int:
        """Record (and return) how many due outbox rows are not yet sent."""
        count = await self.store.backlog()
        self._backlog.set(count)
        return count


def _identity_headers(occurrence_id: object, tenant_id: str) -> list[tuple[str, bytes]]:
    """Headers that let a router act without decoding the body (none for non-occurrence rows)."""
    if occurrence_id is None:
        return [(HEADER_TENANT, tenant_id.encode())]
    return [(HEADER_OCCURRENCE_ID, str(occurrence_id).encode()), (HEADER_TENANT, tenant_id.encode())]

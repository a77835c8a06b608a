"""Telemetry names and per-process OpenTelemetry set-up.

Metric and span names are listed in docs/operations.md ("Metrics and spans"); every component
creates its instruments from the names here so dashboards and tests agree.
Components take an optional ``meter``/``tracer`` (tests inject in-memory
providers); by default they use the process-wide providers that
:func:`configure_telemetry` installs once per process.

OTLP export is enabled only when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``
is set. Metrics are also readable in the Prometheus text format: the
OpenTelemetry Prometheus exporter's reader feeds ``/metrics`` (the API
process's port, or ``--metrics-port`` of engine and relay processes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context

# Metric names (docs/operations.md, "Metrics and spans": keep the two lists equal).
SCHEDULE_LAG = "chronoq.schedule_lag"  # histogram, s: enqueued_at - scheduled_for
MATERIALIZATION_LAG = "chronoq.materialization_lag"  # histogram, s: materialized - (scheduled_for - horizon)
OCCURRENCES_MATERIALIZED = "chronoq.occurrences_materialized"  # counter
UNIQUENESS_CONFLICTS = "chronoq.uniqueness_conflicts"  # counter: occurrence already existed
TENANT_THROTTLED = "chronoq.tenant_throttled"  # counter, attr tenant_id: first deliveries held for max_running
TENANT_HELD = "chronoq.tenant_held"  # gauge: deliveries waiting for their tenant's max_running now
MISSED_OCCURRENCES = "chronoq.missed_occurrences"  # counter
OUTBOX_PUBLISHED = "chronoq.outbox_published"  # counter
OUTBOX_PUBLISH_FAILURES = "chronoq.outbox_publish_failures"  # counter
OUTBOX_FENCED_MARKS = "chronoq.outbox_fenced_marks"  # counter: mark-sent refused, claim lost
OUTBOX_BACKLOG = "chronoq.outbox_backlog"  # gauge: due, unsent rows
DUE_BACKLOG = "chronoq.due_backlog"  # gauge: schedules past next_run_at
COHORTS = "chronoq.cohorts"  # counter, attr result: advanced|dissolved|joined (a schedule joined one at its advance)
DUPLICATE_DELIVERIES = "chronoq.duplicate_deliveries"  # counter: consumer dedupe hits
OCCURRENCES_APPLIED = "chronoq.occurrences_applied"  # counter
HANDLER_FAILURES = "chronoq.handler_failures"  # counter
HANDLER_DURATION = "chronoq.handler_duration"  # histogram, s
POISON_MESSAGES = "chronoq.poison_messages"  # counter: sent to the dead-letter topic
COMMANDS_PROCESSED = "chronoq.commands_processed"  # counter by status (applied|rejected) and action
QUEUE_AGE = "chronoq.queue_age"  # gauge, s: now - available_at of the oldest due, unsent outbox row
# Attempts, retries and dead letters (engine side unless noted).
ATTEMPTS = "chronoq.attempts"  # counter, attr result: succeeded|failed|timed_out|canceled|fenced
RETRIES = "chronoq.retries"  # counter: retries scheduled (RETRY_WAIT + outbox row)
DEAD_LETTERS = "chronoq.dead_letters"  # counter, attr reason: occurrences that went DEAD
DLQ_SIZE = "chronoq.dlq_size"  # gauge: DEAD occurrences not replayed
FENCED_EVENTS = "chronoq.fenced_attempt_events"  # counter, attr event: stale lease token rejected
FOREIGN_GROUP_EVENTS = "chronoq.foreign_group_attempt_events"  # counter, attr event: an observing group, ignored
LEASE_TIMEOUTS = "chronoq.lease_timeouts"  # counter: RUNNING attempts the reaper timed out
OVERLAP_SKIPS = "chronoq.overlap_skips"  # counter: occurrences SKIPPED_OVERLAP
CANCELED_DELIVERIES = "chronoq.canceled_deliveries"  # counter (consumer): skipped, older version or canceled
CONSUMER_LAG = "chronoq.consumer_lag"  # gauge (consumer), per partition: high water - committable
CONSUMER_RESTARTS = "chronoq.consumer_restarts"  # counter (consumer), attr reason: Kafka consumer recreated (stalled)
# counter (consumer), attr target: attempts whose lease the worker found overdue before it finished (paused,
# starved, or no heartbeat acknowledged for a lease ttl): no longer renewed, no handler called under it
CONSUMER_LEASES_LOST = "chronoq.consumer_leases_lost"
CONSUMER_BATCH_SIZE = "chronoq.consumer_batch_size"  # histogram (consumer): occurrences per batch handler delivery
ATTEMPT_EVENT_BATCH = "chronoq.attempt_event_batch"  # histogram: attempt events applied per transaction
# gauge: attempt events not applied yet; attr partition (the attempt processor, its partitions), attr group
# (the stuck-occurrence watcher: a consumer group's total on chronoq.attempts)
ATTEMPT_EVENTS_LAG = "chronoq.attempt_events_lag"
# One description for both recorders: registrations of one name that differ in it export as two metrics.
ATTEMPT_EVENTS_LAG_DESCRIPTION = "records on chronoq.attempts not applied yet (a group record holds up to 500 events)"
# gauge: attempt outcomes and heartbeats the attempt processor read and holds behind a stream of starts
ATTEMPT_EVENTS_HELD = "chronoq.attempt_events_held"
ATTEMPT_EVENTS_HELD_DESCRIPTION = "attempt outcomes and heartbeats read and held behind a stream of starts"
REAPER_DEFERRED = "chronoq.reaper_deferred"  # gauge, s: how far the reaper trails now (attempt events not applied yet)
# Operator features.
BACKFILLED_OCCURRENCES = (
    "chronoq.backfilled_occurrences"  # counter: past slots a backfill released (created or refired)
)
MANUAL_TRIGGERS = "chronoq.manual_triggers"  # counter: manual occurrences (trigger now)
BATCH_SCHEDULES = "chronoq.batch_schedules"  # counter, attr status: items of batch creates (201|200|409|422|429)
OVERLAP_HELD = "chronoq.overlap_held"  # gauge: outbox rows the overlap gate holds
EXCLUDED_SLOTS = "chronoq.excluded_slots"  # counter: fires an exclusion calendar removed at materialization
SCHEDULES_COMPLETED = "chronoq.schedules_completed"  # counter, attr reason: exhausted|max_runs
CALENDAR_CHANGES = "chronoq.calendar_changes"  # counter, attr change: create|update|import|delete
# Hostile input and tenant isolation (docs/security.md).
RECORDS_SKIPPED = "chronoq.records_skipped"  # counter, attr loop: records passed after a non-transient failure
KAFKA_REFUSALS = "chronoq.kafka_refusals"  # counter, attr kind: authentication|authorization, setting
TARGET_REFUSALS = "chronoq.target_refusals"  # counter: schedules refused on another tenant's target
QUOTA_REFUSALS = "chronoq.quota_refusals"  # counter, attrs tenant_id, quota: creates/updates refused over a quota
TENANT_USAGE_FOLDED = "chronoq.tenant_usage_folded"  # counter: usage change rows folded by the periodic fold
# The sharded data plane (issue 12).
TENANT_DISPATCHES = "chronoq.tenant_dispatches"  # counter, attrs tenant_id, lane: ahead-lane rows published
AHEAD_BACKLOG = "chronoq.ahead_backlog"  # gauge, attr lane: due ahead-lane rows not yet published
QUARANTINED_DELIVERIES = "chronoq.quarantined_deliveries"  # counter: poison rows set aside after bounded tries
SHARDS_OWNED = "chronoq.shards_owned"  # gauge, attr node_id: shard leases this node holds
SHARD_MOVES = "chronoq.shard_moves"  # counter, attr direction: acquired|released
# histogram, s, attr node_id: time between a node's successive lease renewals (interval when healthy; a lease
# lapses when it reaches lease_ttl)
SHARD_RENEWAL_GAP = "chronoq.shard_renewal_gap"
EVENT_LOOP_LAG = "chronoq.event_loop_lag"  # histogram, s, attr node_id: how late a node's event loop ran a timer
SETTLED_DELIVERIES = "chronoq.settled_deliveries"  # counter: ahead-lane rows the settle pass recorded ENQUEUED
DISPATCH_LOG_PRUNED = "chronoq.dispatch_log_pruned"  # counter: settled dispatch-log entries forgotten after keep_log
SETTLE_DEFERRALS = "chronoq.settle_deferrals"  # counter: settle passes put off because a burst is being dispatched
HANDOVER_ANNOUNCEMENTS = "chronoq.handover_announcements"  # counter: a node told the others it hands a burst over
# counter: an attempt processor told the settle passes that consumers are working through a backlog (migration 0031)
CONSUMERS_BEHIND_ANNOUNCEMENTS = "chronoq.consumers_behind_announcements"
# counter, attr reason: unsigned|malformed|unknown_credential|expired_credential|wrong_target|bad_signature
ATTEMPT_EVENTS_REJECTED = "chronoq.attempt_events_rejected"
# The cancel barrier (docs/state-machine.md, "Cancel as a barrier").
ATTEMPT_GRANTS_SENT = "chronoq.attempt_grants_sent"  # counter (engine), attr result: granted|refused, reason
# counter (consumer), attr outcome: parked (the target-binding view was older than the record's binding_version:
# retried in place, not dead-lettered), admitted|refused (decided once the view caught up), expired (still behind
# after binding_behind_timeout: dead-lettered, "binding view behind"); attr target
BINDING_VIEW_BEHIND = "chronoq.binding_view_behind"
ATTEMPT_GRANTS = "chronoq.attempt_grants"  # counter (consumer), attr result: granted|refused|timeout, target
ATTEMPT_GRANT_WAIT = "chronoq.attempt_grant_wait"  # histogram (consumer), s: from sending started to its answer
ATTEMPT_GRANTS_MALFORMED = "chronoq.attempt_grants_malformed"  # counter (consumer): undecodable reply records
# counter, attr reason: too_large|invalid_topic|unauthorized_topic|refused (relay quarantined an outbox row)
OUTBOX_QUARANTINED = "chronoq.outbox_quarantined"
CATCH_UP_ENQUEUED = "chronoq.catch_up_enqueued"  # counter, attr tenant_id: misfire catch-up occurrences materialized
CATCH_UP_THROTTLED = "chronoq.catch_up_throttled"  # counter, attr tenant_id: catch-ups released later by the bucket
DISPATCH_MISSED = "chronoq.dispatch_missed"  # counter, attr lane: on-time occurrences too late at dispatch: MISSED
DISPATCH_LATE_PUBLISHED = "chronoq.dispatch_late_published"  # counter, attr lane: late, published per the policy
# Proof and recovery: the reconciler, stuck occurrences, the attempt processor's own lag.
RECONCILE_COUNTS = "chronoq.reconcile.counts"  # gauge, attr count: expected|missing|unexpected|... of the last run
RECONCILE_DURATION = "chronoq.reconcile.duration"  # histogram, s: one reconcile run
STUCK_REDELIVERIES = "chronoq.stuck_redeliveries"  # counter: ENQUEUED without attempt events, published again
STUCK_OCCURRENCES = "chronoq.stuck_occurrences"  # gauge, attr status: watched|flagged
# History retention (issue 17).
HISTORY_ARCHIVED = (
    "chronoq.history_archived"  # counter, attrs table (occurrences|attempts), tenant_id: rows moved to the archive
)
HISTORY_PARTITIONS_CREATED = "chronoq.history_partitions_created"  # counter: day partitions created ahead
HISTORY_DAYS_ARCHIVED = "chronoq.history_days_archived"  # counter: day partitions moved whole into the archive

# Span names.
SPAN_MATERIALIZE = "chronoq.materialize"
SPAN_PUBLISH = "chronoq.relay.publish"
SPAN_CONSUME = "chronoq.consume"
SPAN_ATTEMPT_EVENTS = "chronoq.engine.attempt_events"
SPAN_REAP = "chronoq.engine.reap"
SPAN_RECONCILE = "chronoq.reconcile"
SPAN_HISTORY_PRUNE = "chronoq.history.prune"

_configured = False


def configure_telemetry(service_name: str, prometheus: bool = True) -> None:
    """Install this process's meter and tracer providers (once; later calls do nothing).

    With ``prometheus`` the OpenTelemetry Prometheus exporter's reader is added beside OTLP: it serves the
    same instruments to ``prometheus_client``'s default registry, which ``/metrics`` renders.
    """
    global _configured
    if _configured:
        return
    _configured = True
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    resource = Resource.create({"service.name": service_name})
    readers: list[MetricReader] = []
    tracer_provider = TracerProvider(resource=resource)
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if prometheus:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader())
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
    trace.set_tracer_provider(tracer_provider)


def flush_telemetry() -> None:
    """Export what this process recorded so far: a short-lived command (``chronoq reconcile``) calls it
    before exiting, since periodic exporters would otherwise drop its last readings."""
    for provider in (metrics.get_meter_provider(), trace.get_tracer_provider()):
        flush = getattr(provider, "force_flush", None)  # the SDK providers have it; the API's no-op ones do not
        if flush is not None:
            flush()


def get_meter(component: str, provider: metrics.MeterProvider | None = None) -> metrics.Meter:
    return (provider or metrics.get_meter_provider()).get_meter(f"chronoq.{component}")


def get_tracer(component: str, provider: trace.TracerProvider | None = None) -> trace.Tracer:
    return (provider or trace.get_tracer_provider()).get_tracer(f"chronoq.{component}")


def inject_trace_headers(headers: list[tuple[str, bytes]], context: Context | None = None) -> None:
    """Append W3C trace-context headers for the current (or given) span."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    headers.extend((key, value.encode()) for key, value in carrier.items())


def extract_trace_context(headers: Sequence[tuple[str, bytes]] | Iterable[tuple[str, bytes]] | None) -> Context:
    """The trace context carried in Kafka headers (empty context when absent or garbled)."""
    carrier: dict[str, str] = {}
    for key, value in headers or ():
        try:
            carrier[key] = value.decode()
        except (UnicodeDecodeError, AttributeError):
            continue
    return propagate.extract(carrier)

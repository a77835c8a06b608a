"""The settle pass and the attempt processor meet on the same occurrences after a burst: a consumer may report
``started`` before the settle pass recorded ENQUEUED (it waits while a burst is dispatched). The occurrence's
enqueued_at is then still the broker's acknowledgement (the dispatch log's instant), not the moment the
attempt processor applied the event."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from engine.control.schedules import ControlPlane
from engine.loops.attempt_processor import AttemptProcessor, AttemptProcessorConfig
from engine.loops.dispatch_settler import DispatchSettler, SettlerConfig
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.shard_leases import ShardLeaseConfig, ShardLeases
from relay.ahead_lane import AheadLaneStore
from relay.ahead_relay import AheadRelay, AheadRelayConfig
from schemas import observability as obs
from schemas.attempt_events import AttemptEvent
from schemas.clock import ManualClock
from schemas.messages import decode_occurrence
from schemas.shard_ownership import ShardOwnership
from schemas.topics import occurrence_topic
from tests.support.kafka import librdkafka_publisher, read_topic

AT = datetime(2026, 11, 29, 10, 0, 10, tzinfo=UTC)  # the fixture clock starts at 10:00:00


@pytest.fixture
async def publisher(kafka_bootstrap):
    async with librdkafka_publisher(kafka_bootstrap) as publisher:
        yield publisher


async def published_once(
    pool: asyncpg.Pool, clock: ManualClock, publisher: Any, target: str, kafka_bootstrap: str
) -> tuple[dict[str, Any], uuid.UUID]:
    """A one-time schedule of tenant acme due at AT, materialized ahead and published by the ahead-lane relay at
    AT (the clock is left there): the schedule and its occurrence's id. Nothing is settled yet."""
    schedule = await ControlPlane(pool, clock).create_schedule(
        "acme", {"kind": "once", "target": target, "expression": AT.isoformat()}
    )
    ownership = ShardOwnership("node-a")
    await ShardLeases(pool, ownership, ShardLeaseConfig(interval=1.0, lease_ttl=6.0, max_moves=256), clock).run_once()
    assert (await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()).ahead == 1
    relay = AheadRelay(
        AheadLaneStore(pool, clock, ownership.node_id), publisher, ownership,
        AheadRelayConfig(read_ahead=timedelta(seconds=2)), clock,
    )  # fmt: skip
    clock.set(AT)
    assert (await relay.run_once()).published == 1
    (record,) = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=1)
    occurrence_id = decode_occurrence(record.value).occurrence_id
    return schedule, occurrence_id


async def test_a_start_applied_before_the_settle_pass_keeps_the_acknowledgement_as_enqueued_at(
    pool, clock, publisher, target, kafka_bootstrap, telemetry, acme
):
    schedule, occurrence_id = await published_once(pool, clock, publisher, target, kafka_bootstrap)
    # The consumer's start is applied 20 s later, before the settle pass (deferred by a burst) ran.
    clock.set(AT + timedelta(seconds=20))
    processor = AttemptProcessor(pool, clock=clock, rng=random.Random(7), **telemetry.instruments("engine"))
    await processor.apply_events([AttemptEvent.started(occurrence_id, 1, uuid.uuid4(), 30.0, "billing", "host:1")])
    assert await pool.fetchval("SELECT state FROM occurrences") == "RUNNING"
    # Read before the settle pass ran: the API shows the acknowledgement from the log, not the instant the
    # processor applied the start (the row's own value until the pass runs).
    control = ControlPlane(pool, clock)
    before = await control.get_occurrence("acme", occurrence_id)
    (listed,) = (await control.list_occurrences("acme", schedule["schedule_id"])).items
    assert (before["state"], before["enqueued_at"]) == ("RUNNING", "2026-11-29T10:00:10Z")
    assert listed["enqueued_at"] == "2026-11-29T10:00:10Z"
    await DispatchSettler(pool, clock=clock).run_once()
    row = await pool.fetchrow("SELECT state, enqueued_at FROM occurrences")
    assert (row["state"], row["enqueued_at"]) == ("RUNNING", AT), "enqueued_at is the broker's acknowledgement"
    view = await control.get_occurrence("acme", occurrence_id)
    assert view["enqueued_at"] == "2026-11-29T10:00:10Z"


@pytest.mark.parametrize(("started_after_s", "behind"), [(20.0, True), (1.0, False)])
async def test_starts_of_a_backlog_hold_the_settle_pass_back_and_starts_on_time_do_not(
    pool, clock, publisher, target, kafka_bootstrap, telemetry, acme, started_after_s, behind
):
    """The attempt processor tells the settle pass that consumers are working through a backlog when the starts
    it applies came seconds after their occurrences became available (migration 0031); starts on time never do."""
    _, occurrence_id = await published_once(pool, clock, publisher, target, kafka_bootstrap)
    clock.set(AT + timedelta(seconds=started_after_s))
    config = AttemptProcessorConfig(behind_after=5.0, behind_events=1, behind_window=2.0)
    processor = AttemptProcessor(
        pool, config=config, clock=clock, rng=random.Random(7), **telemetry.instruments("engine")
    )
    await processor.apply_events([AttemptEvent.started(occurrence_id, 1, uuid.uuid4(), 30.0, "billing", "host:1")])
    assert await processor.announce_if_behind(clock.now()) is behind
    settler = DispatchSettler(pool, SettlerConfig(max_defer=30.0, max_defer_behind=300.0), clock=clock)
    report = await settler.run_once(gated=True)
    assert report.deferred is behind
    if behind:
        assert sum(p.value for p in telemetry.points(obs.CONSUMERS_BEHIND_ANNOUNCEMENTS)) == 1
        assert not await processor.announce_if_behind(clock.now()), "rewritten every half window, not every round"
        clock.advance(timedelta(seconds=6.0))  # three windows: the announcement lapsed, nothing renewed it
        report = await settler.run_once(gated=True)
        assert not report.deferred
    assert report.occurrences == 1
    assert await pool.fetchval("SELECT enqueued_at FROM occurrences") == AT, "the broker's acknowledgement"


@pytest.mark.parametrize(("started_after_s", "behind"), [(20.0, True), (1.0, False)])
async def test_outcomes_count_by_when_their_attempt_started_not_by_how_long_it_ran(
    pool, clock, publisher, target, kafka_bootstrap, telemetry, acme, started_after_s, behind
):
    """The outcomes of a backlog keep the announcement up until the consumers are through, so the settle pass does
    not run among a burst's last outcomes; the outcome of a handler that started on time and ran for a minute is
    no backlog."""
    _, occurrence_id = await published_once(pool, clock, publisher, target, kafka_bootstrap)
    config = AttemptProcessorConfig(behind_after=5.0, behind_events=1, behind_window=2.0)
    processor = AttemptProcessor(
        pool, config=config, clock=clock, rng=random.Random(7), **telemetry.instruments("engine")
    )
    settler = DispatchSettler(pool, SettlerConfig(max_defer=30.0, max_defer_behind=300.0), clock=clock)
    token = uuid.uuid4()
    clock.set(AT + timedelta(seconds=started_after_s))
    await processor.apply_events([AttemptEvent.started(occurrence_id, 1, token, 120.0, "billing", "host:1")])
    if not behind:
        assert (await settler.run_once(gated=True)).occurrences == 1  # settled: enqueued_at is the acknowledgement
    clock.advance(timedelta(seconds=60))  # the handler runs for a minute; any announcement lapsed meanwhile
    await processor.apply_events([AttemptEvent.succeeded(occurrence_id, 1, token)])
    assert await pool.fetchval("SELECT state FROM occurrences") == "SUCCEEDED"
    assert await processor.announce_if_behind(clock.now()) is behind
    assert (await settler.run_once(gated=True)).deferred is behind


async def test_a_late_start_counts_also_where_the_settle_pass_already_wrote_the_acknowledgement(
    pool, clock, publisher, target, kafka_bootstrap, telemetry, acme
):
    """The settle pass may begin before the first announcement (once the burst is dispatched, seconds before any
    start is late). Judged by the acknowledgement it wrote, no later start looked late, and in one 500,000 run the
    pass settled the whole burst among the consumers' starts."""
    _, occurrence_id = await published_once(pool, clock, publisher, target, kafka_bootstrap)
    settler = DispatchSettler(pool, SettlerConfig(max_defer=30.0, max_defer_behind=300.0), clock=clock)
    assert (await settler.run_once()).occurrences == 1  # ENQUEUED, enqueued_at = the acknowledgement
    config = AttemptProcessorConfig(behind_after=5.0, behind_events=1, behind_window=2.0)
    processor = AttemptProcessor(
        pool, config=config, clock=clock, rng=random.Random(7), **telemetry.instruments("engine")
    )
    clock.set(AT + timedelta(seconds=20))
    await processor.apply_events([AttemptEvent.started(occurrence_id, 1, uuid.uuid4(), 30.0, "billing", "host:1")])
    assert await processor.announce_if_behind(clock.now())

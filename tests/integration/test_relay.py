"""The relay against real PostgreSQL and the real broker."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from relay.dispatcher import Relay, RelayConfig
from relay.outbox import OutboxStore
from relay.publisher import KafkaPublisher, PublisherConfig
from schemas import observability as obs
from schemas.messages import HEADER_OCCURRENCE_ID, decode_occurrence
from schemas.topics import occurrence_topic
from tests.support.kafka import read_topic
from tests.support.rows import due_occurrence


@pytest.fixture
async def publisher(broker):
    publisher = KafkaPublisher(
        PublisherConfig(broker.bootstrap, partitions=4, ack_timeout=10, idempotent=broker.idempotent_producer)
    )
    await publisher.start()
    yield publisher
    await publisher.stop()


def make_relay(pool, publisher, clock, telemetry=None, **config):
    extra = telemetry.instruments("relay") if telemetry else {}
    return Relay(OutboxStore(pool, clock), publisher, RelayConfig(**config), **extra)


async def test_publishes_due_rows_marks_them_sent_and_records_schedule_lag(
    pool, publisher, clock, target, kafka_bootstrap, telemetry
):
    now = clock.now()
    due = [await due_occurrence(pool, "acme", target, now - timedelta(seconds=i)) for i in range(3)]
    later = await due_occurrence(pool, "acme", target, now + timedelta(minutes=5))
    relay = make_relay(pool, publisher, clock, telemetry)

    report = await relay.run_once()

    assert (report.claimed, report.published, report.failed, report.fenced) == (3, 3, 0, 0)
    records = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=3)
    assert sorted(decode_occurrence(r.value).occurrence_id for r in records) == sorted(m.occurrence_id for m in due)
    for record in records:
        headers = dict(record.headers)
        assert headers[HEADER_OCCURRENCE_ID].decode() == str(decode_occurrence(record.value).occurrence_id)
        assert "traceparent" in headers
        # Keyed by schedule (issue 12): one tenant's burst spreads over the partitions, a schedule stays ordered.
        assert record.key == str(decode_occurrence(record.value).schedule_id).encode()
    rows = await pool.fetch(
        "SELECT o.state, o.enqueued_at, b.sent_at FROM occurrences o"
        " JOIN outbox b USING (occurrence_id) WHERE o.occurrence_id = ANY($1)",
        [m.occurrence_id for m in due],
    )
    assert {(r["state"], r["enqueued_at"], r["sent_at"]) for r in rows} == {("ENQUEUED", now, now)}
    assert await pool.fetchval("SELECT sent_at FROM outbox WHERE occurrence_id = $1", later.occurrence_id) is None
    (lag,) = telemetry.points(obs.SCHEDULE_LAG)
    assert lag.count == 3 and lag.sum == pytest.approx(0 + 1 + 2)

    clock.advance(timedelta(minutes=5))
    assert (await relay.run_once()).published == 1


async def test_a_row_committed_after_a_later_id_is_still_published(pool, publisher, clock, target, kafka_bootstrap):
    """Sequence values are taken before commit: id 1 can commit after id 2 was relayed."""
    relay = make_relay(pool, publisher, clock)
    async with pool.acquire() as slow:
        transaction = slow.transaction()
        await transaction.start()
        first = await due_occurrence(slow, "acme", target, clock.now())  # takes the lower id
        second = await due_occurrence(pool, "acme", target, clock.now())  # commits first
        assert (await relay.run_once()).published == 1
        await transaction.commit()
    assert (await relay.run_once()).published == 1
    records = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=2)
    assert {decode_occurrence(r.value).occurrence_id for r in records} == {first.occurrence_id, second.occurrence_id}


async def test_a_relay_that_lost_its_claim_cannot_mark_rows(pool, publisher, clock, target, telemetry):
    message = await due_occurrence(pool, "acme", target, clock.now())
    paused = OutboxStore(pool, clock)
    claim = await paused.claim(10, timedelta(seconds=60))  # relay A claims, then stalls
    assert len(claim.rows) == 1
    clock.advance(timedelta(seconds=61))  # its claim expires
    other = make_relay(pool, publisher, clock)
    assert (await other.run_once()).published == 1  # relay B publishes and marks
    sent_at = await pool.fetchval("SELECT sent_at FROM outbox WHERE occurrence_id = $1", message.occurrence_id)

    clock.advance(timedelta(seconds=5))
    late = await paused.mark_sent(claim.token, [row.id for row in claim.rows])  # A wakes up

    assert late.marked == 0
    assert await pool.fetchval("SELECT sent_at FROM outbox WHERE occurrence_id = $1", message.occurrence_id) == sent_at


async def test_unexpired_claims_are_not_published_twice(pool, publisher, clock, target):
    await due_occurrence(pool, "acme", target, clock.now())
    held = await OutboxStore(pool, clock).claim(10, timedelta(seconds=60))
    assert len(held.rows) == 1
    relay = make_relay(pool, publisher, clock)
    assert (await relay.run_once()).claimed == 0


async def test_concurrent_relays_publish_every_row_once(pool, kafka_bootstrap, clock, target):
    messages = [await due_occurrence(pool, f"tenant-{i % 5}", target, clock.now()) for i in range(200)]
    publishers = [KafkaPublisher(PublisherConfig(kafka_bootstrap, partitions=4)) for _ in range(3)]
    for p in publishers:
        await p.start()
    try:
        relays = [make_relay(pool, p, clock, batch_size=17) for p in publishers]

        async def drain(relay):
            while (await relay.run_once()).claimed:
                pass

        await asyncio.gather(*(drain(r) for r in relays))
    finally:
        for p in publishers:
            await p.stop()
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0
    records = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=200)
    ids = [decode_occurrence(r.value).occurrence_id for r in records]
    assert sorted(ids) == sorted(m.occurrence_id for m in messages)

"""The stuck-occurrence pass: ENQUEUED without attempt events -> republished a bounded number of times, then
flagged; and, with a real consumer whose attempt reports were lost, the redelivery ends SUCCEEDED with one
effect."""

from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.loops.service import PIPELINE_ROLES, Role
from engine.loops.stuck_occurrences import StuckOccurrences, StuckOccurrencesConfig
from schemas.messages import decode_occurrence
from schemas.topics import occurrence_topic
from tests.support.rows import due_occurrence, occurrence_row, outbox_rows
from tests.support.services import Running, fast_services, services_running
from tests.support.waiting import wait_for

TIMEOUT = timedelta(minutes=10)


async def enqueued(pool, clock, target):
    """An occurrence published (its outbox row sent) at the clock's instant, then nothing."""
    sent = await due_occurrence(pool, "acme", target, clock.now())
    await pool.execute("UPDATE outbox SET sent_at = $2 WHERE occurrence_id = $1", sent.occurrence_id, clock.now())
    await pool.execute(
        "UPDATE occurrences SET state = 'ENQUEUED', enqueued_at = $2, updated_at = $2 WHERE occurrence_id = $1",
        sent.occurrence_id,
        clock.now(),
    )
    return sent


async def stuck_row(pool, ident):
    return await pool.fetchrow("SELECT * FROM stuck_occurrences WHERE occurrence_id = $1", ident)


async def test_redelivered_with_backoff_then_flagged_then_resolved(pool, acme, clock, target, telemetry):
    sent = await enqueued(pool, clock, target)
    stuck = StuckOccurrences(
        pool,
        None,
        StuckOccurrencesConfig(timeout=TIMEOUT, max_redeliveries=2),
        clock,
        **{k: v for k, v in telemetry.instruments("engine").items() if k == "meter"},
    )
    clock.advance(TIMEOUT)
    assert (await stuck.run_once()).redelivered == 0  # exactly at the timeout: not yet
    clock.advance(timedelta(seconds=1))
    assert (await stuck.run_once()).redelivered == 1
    rows = await outbox_rows(pool, sent.occurrence_id)
    assert len(rows) == 2 and rows[1]["message"] == rows[0]["message"] and rows[1]["sent_at"] is None
    assert rows[1]["available_at"] == clock.now()
    assert (await stuck_row(pool, sent.occurrence_id))["redeliveries"] == 1

    assert (await stuck.run_once()).redelivered == 0  # backoff: 10 min * 2 after the first
    clock.advance(2 * TIMEOUT)
    assert (await stuck.run_once()).redelivered == 0  # exactly 20 min of silence: not yet
    clock.advance(timedelta(seconds=1))
    assert (await stuck.run_once()).redelivered == 1
    clock.advance(4 * TIMEOUT + timedelta(seconds=1))
    report = await stuck.run_once()
    assert (report.redelivered, report.flagged) == (0, 1)  # max_redeliveries=2: flagged
    row = await stuck_row(pool, sent.occurrence_id)
    assert row["redeliveries"] == 2 and row["flagged_at"] == clock.now()
    assert len(await outbox_rows(pool, sent.occurrence_id)) == 3
    clock.advance(10 * TIMEOUT)
    assert (await stuck.run_once()).flagged == 0  # flagged once, not every pass
    gauge = {p.attributes["status"]: p.value for p in telemetry.points("chronoq.stuck_occurrences")}
    assert gauge == {"watched": 0, "flagged": 1}
    assert sum(p.value for p in telemetry.points("chronoq.stuck_redeliveries")) == 2

    await pool.execute("UPDATE occurrences SET state = 'SUCCEEDED' WHERE occurrence_id = $1", sent.occurrence_id)
    assert (await stuck.run_once()).resolved == 1
    assert (await stuck_row(pool, sent.occurrence_id))["resolved_at"] == clock.now()


async def test_an_occurrence_whose_events_keep_arriving_is_not_stuck(pool, acme, clock, target):
    sent = await enqueued(pool, clock, target)
    stuck = StuckOccurrences(pool, None, StuckOccurrencesConfig(timeout=TIMEOUT), clock)
    clock.advance(TIMEOUT / 2)
    await pool.execute(
        "UPDATE occurrences SET state = 'RUNNING', updated_at = $2 WHERE occurrence_id = $1",
        sent.occurrence_id,
        clock.now(),
    )
    clock.advance(TIMEOUT * 3)
    assert (await stuck.run_once()).redelivered == 0  # RUNNING belongs to the lease reaper
    assert await stuck_row(pool, sent.occurrence_id) is None


async def test_zero_redeliveries_flags_at_once(pool, acme, clock, target):
    sent = await enqueued(pool, clock, target)
    clock.advance(TIMEOUT * 2)
    report = await StuckOccurrences(
        pool, None, StuckOccurrencesConfig(timeout=TIMEOUT, max_redeliveries=0), clock
    ).run_once()
    assert (report.redelivered, report.flagged) == (0, 1)
    assert (await stuck_row(pool, sent.occurrence_id))["redeliveries"] == 0


async def test_lost_attempt_reports_end_succeeded_with_one_effect(
    engine_db, pool, acme, kafka_bootstrap, consumer_db, target
):
    """The chaos finding: a consumer applied the effect but its events never reached the engine."""
    effects = await asyncpg.create_pool(consumer_db, min_size=1, max_size=2)
    await effects.execute("CREATE TABLE effects (occurrence_id uuid)")
    group = f"stuck-{uuid.uuid4().hex[:8]}"

    def app(report: bool) -> ConsumerApp:
        consumer = ConsumerApp(
            ConsumerConfig(
                group,
                kafka_bootstrap,
                consumer_db,
                session_timeout=2.0,
                heartbeat_interval=0.4,
                shutdown_grace=2.0,
                report_attempts=report,
            )
        )

        @consumer.handler(target)
        async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
            await conn.execute("INSERT INTO effects VALUES ($1)", occurrence.occurrence_id)

        return consumer

    async def applied() -> int:
        return await effects.fetchval("SELECT count(*) FROM effects")

    try:
        async with services_running(
            engine_db, kafka_bootstrap, fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER})
        ):
            now = await pool.fetchval("SELECT now()")
            sent = await due_occurrence(pool, "acme", target, now)
            async with Running(app(report=False)):
                await wait_for(lambda: state_is(pool, sent.occurrence_id, "ENQUEUED"))
                await wait_for(lambda: applied())
            assert (await occurrence_row(pool, sent.occurrence_id))["state"] == "ENQUEUED"  # the engine never knew
            # Eleven minutes later (the occurrence's last change is moved back instead of waiting), the stuck
            # pass publishes it again; the consumer (reporting again) finds its dedupe row and reports
            # already_applied.
            await pool.execute(
                "UPDATE occurrences SET updated_at = updated_at - interval '11 minutes' WHERE occurrence_id = $1",
                sent.occurrence_id,
            )
            assert (
                await StuckOccurrences(pool, None, StuckOccurrencesConfig(timeout=TIMEOUT)).run_once()
            ).redelivered == 1
            async with Running(app(report=True)):
                await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED"), timeout=30)
        assert await applied() == 1
    finally:
        await effects.close()


async def state_is(pool, ident, expected: str) -> bool:
    return (await occurrence_row(pool, ident))["state"] == expected


async def test_an_occurrence_published_through_the_ahead_lane_is_redelivered_not_flagged(pool, acme, clock, target):
    """The ahead lane leaves no outbox row behind (the settle pass deletes its queue row): the stuck pass
    rebuilds the message instead of flagging the occurrence at once (found by the loop-survival test)."""
    sent = await enqueued(pool, clock, target)
    await pool.execute("DELETE FROM outbox WHERE occurrence_id = $1", sent.occurrence_id)
    clock.advance(TIMEOUT * 2)
    report = await StuckOccurrences(pool, None, StuckOccurrencesConfig(timeout=TIMEOUT), clock).run_once()
    assert (report.redelivered, report.flagged) == (1, 0)
    row = await pool.fetchrow(
        "SELECT topic, message_key, message, available_at FROM outbox WHERE occurrence_id = $1", sent.occurrence_id
    )
    again = decode_occurrence(row["message"])
    assert (again.occurrence_id, again.schedule_id, again.scheduled_for) == (
        sent.occurrence_id,
        sent.schedule_id,
        sent.scheduled_for,
    )
    assert row["topic"] == occurrence_topic(target) and row["available_at"] == clock.now()

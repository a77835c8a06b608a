"""A worker's lease lives from its `started`, not from its handler (consumers/attempt_leases.py).

The engine starts a lease when it applies `started` and ends it a lease ttl later unless a heartbeat comes.
The answer to that `started` (the cancel barrier) can reach the worker late — an attempt processor far
behind, a starved grant reader, a burst — and a worker that first heartbeats when its handler starts finds
the engine's lease over by then: the reaper times a healthy attempt out (issue 16: "no healthy attempt is
timed out"). Here the engine applies `started` at once and its answer is held back; the engine's clock is
advanced past the first lease's end; nothing may be timed out. A worker whose lease ran out while it
waited (its heartbeats not acknowledged) must not call its handler when the answer finally comes. And a
`started` the broker wrote but acknowledged late, or whose answer is later than the grant timeout, is sent
again with its token, not claimed anew.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Sequence
from datetime import timedelta

import asyncpg
import pytest
from opentelemetry.metrics import NoOpMeter

from consumers import ConsumerApp, Occurrence
from consumers.attempt_reports import AttemptReporter
from consumers.errors import InfrastructureError
from engine.loops.attempt_grants import GrantPublisher
from engine.loops.attempt_processor import AttemptProcessor, AttemptProcessorConfig
from engine.loops.reaper import Reaper
from schemas.attempt_events import HEARTBEAT, STARTED, AttemptEvent
from schemas.attempt_grants import AttemptGrant
from schemas.messages import OccurrenceMessage
from schemas.topics import ATTEMPT_GRANTS_TOPIC, create_missing_topics, occurrence_topic
from tests.integration.test_attempts_runtime import state_is
from tests.integration.test_cancel_barrier import app_for
from tests.support.kafka import produce
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row
from tests.support.services import Running
from tests.support.waiting import wait_for

# The fault is the consumer's timing, not the broker's: one broker keeps the suite's budget.
pytestmark = [pytest.mark.slow, pytest.mark.on_broker("tansu")]

TTL = 3.0


class HeldAnswers:
    """The processor's answers, kept back until released, then published for real (a late reply topic)."""

    def __init__(self, publisher: GrantPublisher) -> None:
        self.publisher = publisher
        self.held: list[AttemptGrant] = []
        self.released = False

    async def send(self, grants: Sequence[AttemptGrant], grouped: bool = False) -> None:
        if self.released:
            await self.publisher.send(grants)
        else:
            self.held.extend(grants)

    async def release(self) -> None:
        self.released = True
        held, self.held = self.held, []
        await self.publisher.send(held)


class EngineSide:
    """The attempt processor on the test's clock with its answers held back, and a reaper to call."""

    def __init__(self, pool: asyncpg.Pool, kafka_bootstrap: str, clock) -> None:
        self.pool, self.clock = pool, clock
        self.publisher = GrantPublisher(kafka_bootstrap, NoOpMeter("test"))
        self.answers = HeldAnswers(self.publisher)
        self.processor = AttemptProcessor(
            pool,
            kafka_bootstrap,
            AttemptProcessorConfig(session_timeout=2.0, heartbeat_interval=0.4),
            clock=clock,
            rng=random.Random(5),
            grants=self.answers,
        )
        self.stop = asyncio.Event()

    async def __aenter__(self) -> EngineSide:
        await create_missing_topics(self.processor.kafka_bootstrap or "", [ATTEMPT_GRANTS_TOPIC])
        await self.publisher.start()
        self.task = asyncio.create_task(self.processor.run(self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await self.task
        await self.publisher.stop()

    async def horizon_is_now(self) -> bool:
        """The reaper judges by now: every attempt event produced before now is applied."""
        horizon = await self.pool.fetchval("SELECT min(applied_through) FROM attempt_event_progress")
        return horizon is not None and horizon >= self.clock.now()


def app_recording(
    kafka_bootstrap: str, consumer_db: str, target: str, batch: int | None, grant_timeout: float = 60.0
) -> tuple[ConsumerApp, list[tuple[int, uuid.UUID | None]]]:
    """An app whose handler (single or batch) records each call's (attempt, lease token) and inserts effects."""
    app = app_for(
        kafka_bootstrap,
        consumer_db,
        shutdown_grace=2.0,
        lease_ttl=TTL,
        lease_renew_interval=0.3,
        attempt_grant_timeout=grant_timeout,
    )
    calls: list[tuple[int, uuid.UUID | None]] = []

    async def effect(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
        calls.extend((o.attempt, o.lease_token) for o in occurrences)
        await conn.executemany(
            "INSERT INTO effects (occurrence_id) VALUES ($1)", [(o.occurrence_id,) for o in occurrences]
        )

    if batch is None:

        @app.handler(target)
        async def one(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
            await effect([occurrence], conn)

    else:

        @app.handler(target, batch=batch)
        async def many(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
            await effect(occurrences, conn)

    return app, calls


async def started_by_the_worker(pool: asyncpg.Pool, kafka_bootstrap: str, target: str, sent: OccurrenceMessage) -> None:
    """Publish the occurrence as the relay would and wait until the engine applied the worker's `started`."""
    await produce(kafka_bootstrap, occurrence_topic(target), [sent.encode()])
    await wait_for(lambda: state_is(pool, sent.occurrence_id, "RUNNING"), timeout=30)


async def heartbeat_applied_after(pool: asyncpg.Pool, occurrence_id: uuid.UUID, at) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT bool_or(heartbeat_at >= $2) FROM attempts WHERE occurrence_id = $1", occurrence_id, at
        )
    )


@pytest.mark.parametrize("batch", [None, 10], ids=["single", "batch"])
async def test_a_worker_waiting_for_its_answer_heartbeats_and_no_lease_is_timed_out(
    pool, clock, kafka_bootstrap, consumer_db, effects, target, batch
):
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=3)
    app, calls = app_recording(kafka_bootstrap, consumer_db, target, batch)

    async with EngineSide(pool, kafka_bootstrap, clock) as engine, Running(app):
        await started_by_the_worker(pool, kafka_bootstrap, target, sent)
        first_end = (await occurrence_row(pool, sent.occurrence_id))["lease_expires_at"]
        clock.advance(timedelta(seconds=TTL - 1))  # inside the first lease
        renewed_at = clock.now()
        # The worker has no answer yet, so its handler has not run; it must renew its lease anyway.
        await wait_for(lambda: heartbeat_applied_after(pool, sent.occurrence_id, renewed_at), timeout=30)
        clock.advance(timedelta(seconds=2))  # past the first lease's end, inside the renewed one
        assert clock.now() > first_end
        await wait_for(engine.horizon_is_now, timeout=30)
        assert await Reaper(pool, clock=clock).run_once() == 0
        assert calls == []  # still waiting for the answer
        await engine.answers.release()
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED"), timeout=30)
    assert [attempt for attempt, _ in calls] == [1]
    row = await occurrence_row(pool, sent.occurrence_id)
    assert (row["state"], row["attempt_count"]) == ("SUCCEEDED", 1)
    assert [a["result"] for a in await attempt_rows(pool, sent.occurrence_id)] == ["succeeded"]
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1


@pytest.mark.parametrize("batch", [None, 10], ids=["single", "batch"])
async def test_a_lease_that_ran_out_during_the_wait_is_not_used_when_the_answer_comes(
    pool, clock, kafka_bootstrap, consumer_db, effects, target, batch, monkeypatch
):
    """The broker takes `started` but no heartbeat (they time out): the worker's own view of its lease ends a
    ttl after it sent `started`, whatever the engine says later. When the (held) answer `granted` arrives after
    that, the handler is not called under the lost lease: the delivery is rolled back and retried in place
    with a new claim, which the engine grants (a takeover of the same delivery, no attempt consumed)."""
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=3)
    real_send_many = AttemptReporter.send_many
    heartbeats_fail = [True]

    async def no_heartbeats(self, events, target):
        if heartbeats_fail[0] and any(e.event == HEARTBEAT for e in events):
            raise InfrastructureError("heartbeat not acknowledged (the test's broker fault)")
        await real_send_many(self, events, target)

    monkeypatch.setattr(AttemptReporter, "send_many", no_heartbeats)
    app, calls = app_recording(kafka_bootstrap, consumer_db, target, batch)

    async with EngineSide(pool, kafka_bootstrap, clock) as engine, Running(app):
        await started_by_the_worker(pool, kafka_bootstrap, target, sent)
        first_token = (await occurrence_row(pool, sent.occurrence_id))["lease_token"]
        await wait_for(lambda: app.stats.leases_lost >= 1, timeout=30)  # its own view: a ttl after `started`
        heartbeats_fail[0] = False
        await engine.answers.release()  # `granted` for the first claim, too late to be used
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED"), timeout=30)
    assert len(calls) == 1 and calls[0][1] != first_token
    row = await occurrence_row(pool, sent.occurrence_id)
    assert (row["state"], row["attempt_count"]) == ("SUCCEEDED", 1)
    results = [(a["lease_token"], a["result"]) for a in await attempt_rows(pool, sent.occurrence_id)]
    assert results[0] == (first_token, "fenced") and results[-1] == (calls[0][1], "succeeded")
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1


@pytest.mark.parametrize("batch", [None, 10], ids=["single", "batch"])
async def test_a_started_written_but_not_acknowledged_in_time_is_sent_again_not_claimed_anew(
    pool, clock, kafka_bootstrap, consumer_db, effects, target, batch, monkeypatch
):
    """A starved broker writes `started` but acknowledges after report_timeout. The worker sends the same
    `started` again in the same transaction (a duplicate for the engine) instead of rolling back and claiming
    anew: one attempt row, no takeover, nothing fenced, one effect."""
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=3)
    real_send, real_send_many = AttemptReporter.send, AttemptReporter.send_many
    late = [1]

    def acknowledged_late(events: Sequence[AttemptEvent]) -> None:
        if late[0] and any(e.event == STARTED for e in events):
            late[0] -= 1
            raise InfrastructureError("started written, but not acknowledged within report_timeout (the fault)")

    async def send(self, event, target):
        await real_send(self, event, target)
        acknowledged_late([event])

    async def send_many(self, events, target):
        await real_send_many(self, events, target)
        acknowledged_late(events)

    monkeypatch.setattr(AttemptReporter, "send", send)
    monkeypatch.setattr(AttemptReporter, "send_many", send_many)
    app, calls = app_recording(kafka_bootstrap, consumer_db, target, batch)

    async with EngineSide(pool, kafka_bootstrap, clock) as engine, Running(app):
        await engine.answers.release()  # answers flow as they come
        await produce(kafka_bootstrap, occurrence_topic(target), [sent.encode()])
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED"), timeout=30)
    assert late == [0] and app.stats.infrastructure_errors >= 1
    assert [attempt for attempt, _ in calls] == [1]
    row = await occurrence_row(pool, sent.occurrence_id)
    assert (row["state"], row["attempt_count"]) == ("SUCCEEDED", 1)
    assert [(a["lease_token"], a["result"]) for a in await attempt_rows(pool, sent.occurrence_id)] == [
        (calls[0][1], "succeeded")
    ]
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1


@pytest.mark.parametrize("batch", [None, 10], ids=["single", "batch"])
async def test_an_answer_later_than_the_grant_timeout_is_asked_for_again_not_claimed_anew(
    pool, clock, kafka_bootstrap, consumer_db, effects, target, batch
):
    """The attempt processor applied `started` but its answer is late (a backlog) or lost: past
    attempt_grant_timeout the worker, its lease alive, sends the same `started` again (a duplicate the engine
    answers from its state) and waits again, instead of rolling back and claiming anew — a takeover per
    delivery (a new attempt row, the old one fenced) for an engine already behind. One attempt, one effect."""
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=3)
    app, calls = app_recording(kafka_bootstrap, consumer_db, target, batch, grant_timeout=1.0)

    async with EngineSide(pool, kafka_bootstrap, clock) as engine, Running(app):
        await started_by_the_worker(pool, kafka_bootstrap, target, sent)
        first_token = (await occurrence_row(pool, sent.occurrence_id))["lease_token"]
        await wait_for(lambda: app.stats.grants_asked_again >= 1, timeout=30)
        assert calls == [] and app.stats.grant_timeouts == 0
        await engine.answers.release()
        await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED"), timeout=30)
    assert calls == [(1, first_token)]
    assert app.stats.grant_timeouts == 0
    assert [(a["lease_token"], a["result"]) for a in await attempt_rows(pool, sent.occurrence_id)] == [
        (first_token, "succeeded")
    ]
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1

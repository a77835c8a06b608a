"""One owning consumer group per target (issue 11, "Two consumer groups on one target").

Events are applied directly (``AttemptProcessor.apply_events``) on the manual clock, against real
PostgreSQL: billing owns the target, audit observes it. Before target owners, audit's ``started`` took
billing's lease over, billing's transient failure was fenced and never retried, and audit's
``already_applied`` settled the occurrence SUCCEEDED: billing's effect was lost.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import timedelta

import asyncpg
import pytest

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.control.attempt_owners import attempt_owner, register_attempt_owner
from engine.loops.attempt_ledger import Verdict
from engine.loops.attempt_processor import AttemptProcessor
from schemas import observability as obs
from schemas.attempt_events import AttemptEvent as Ev
from schemas.errors import InvalidInput
from schemas.messages import decode_occurrence
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row, outbox_rows
from tests.support.services import Running
from tests.support.waiting import wait_for

TTL = 30.0


@pytest.fixture
def processor(pool, clock, telemetry):
    return AttemptProcessor(pool, clock=clock, rng=random.Random(5), **telemetry.instruments("engine"))


async def test_an_observing_group_cannot_take_over_or_settle_the_owners_attempt(
    pool, clock, target, processor, telemetry
):
    """billing starts first and so owns the target; audit's start and already_applied are ignored;
    billing's transient failure is retried (a new delivery of the same occurrence) and then succeeds."""
    message = await due_occurrence(pool, "acme", target, clock.now())
    owner, observer = uuid.uuid4(), uuid.uuid4()
    verdicts = await processor.apply_events(
        [
            Ev.started(message.occurrence_id, 1, owner, TTL, "billing"),
            Ev.started(message.occurrence_id, 1, observer, TTL, "audit"),
            Ev.already_applied(message.occurrence_id, 1, observer, "audit"),
            Ev.failed(message.occurrence_id, 1, owner, "Timeout", "downstream"),
        ]
    )
    assert verdicts == [Verdict.ACCEPTED, Verdict.FOREIGN, Verdict.FOREIGN, Verdict.ACCEPTED]
    assert await attempt_owner(pool, target) == "billing"
    row = await occurrence_row(pool, message.occurrence_id)
    assert row["state"] == "RETRY_WAIT"
    assert [(a["lease_token"], a["result"]) for a in await attempt_rows(pool, message.occurrence_id)] == [
        (owner, "failed")
    ]
    deliveries = [decode_occurrence(r["message"]).attempt for r in await outbox_rows(pool, message.occurrence_id)]
    assert deliveries == [1, 2]  # the retry's delivery: the owner's effect is not lost

    # audit sees the retry too and reports it applied (its own dedupe row): still ignored.
    clock.advance(timedelta(minutes=5))
    again = uuid.uuid4()
    assert await processor.apply_events(
        [
            Ev.started(message.occurrence_id, 2, uuid.uuid4(), TTL, "audit"),
            Ev.already_applied(message.occurrence_id, 2, None, "audit"),
            Ev.started(message.occurrence_id, 2, again, TTL, "billing"),
            Ev.succeeded(message.occurrence_id, 2, again),
        ]
    ) == [Verdict.FOREIGN, Verdict.FOREIGN, Verdict.ACCEPTED, Verdict.ACCEPTED]
    assert (await occurrence_row(pool, message.occurrence_id))["state"] == "SUCCEEDED"
    assert sum(p.value for p in telemetry.points(obs.FOREIGN_GROUP_EVENTS)) == 4


async def test_the_first_group_to_start_claims_the_target_whatever_arrives_later(pool, clock, target, processor):
    """Ownership is per target, not per occurrence: audit's start of a second occurrence is ignored too,
    and that occurrence stays ENQUEUED for billing."""
    first = await due_occurrence(pool, "acme", target, clock.now())
    second = await due_occurrence(pool, "acme", target, clock.now())
    token = uuid.uuid4()
    assert await processor.apply_events([Ev.started(first.occurrence_id, 1, token, TTL, "billing")]) == [
        Verdict.ACCEPTED
    ]
    assert await processor.apply_events([Ev.started(second.occurrence_id, 1, uuid.uuid4(), TTL, "audit")]) == [
        Verdict.FOREIGN
    ]
    assert (await occurrence_row(pool, second.occurrence_id))["state"] != "RUNNING"
    assert await attempt_owner(pool, target) == "billing"


async def test_an_operator_registers_the_owner_before_any_group_starts(pool, clock, target, processor):
    """Registered to billing: audit's start, although it arrives first, does not claim the target."""
    registered = await register_attempt_owner(pool, target, "billing", clock)
    assert (registered.consumer_group, registered.registered_by) == ("billing", "operator")
    message = await due_occurrence(pool, "acme", target, clock.now())
    token = uuid.uuid4()
    assert await processor.apply_events(
        [
            Ev.started(message.occurrence_id, 1, uuid.uuid4(), TTL, "audit"),
            Ev.started(message.occurrence_id, 1, token, TTL, "billing"),
            Ev.succeeded(message.occurrence_id, 1, token),
        ]
    ) == [Verdict.FOREIGN, Verdict.ACCEPTED, Verdict.ACCEPTED]
    # Moving reporting to another group: its events count from now on.
    await register_attempt_owner(pool, target, "billing-v2", clock)
    assert await attempt_owner(pool, target) == "billing-v2"
    later = await due_occurrence(pool, "acme", target, clock.now())
    assert await processor.apply_events(
        [
            Ev.started(later.occurrence_id, 1, uuid.uuid4(), TTL, "billing"),
            Ev.started(later.occurrence_id, 1, uuid.uuid4(), TTL, "billing-v2"),
        ]
    ) == [Verdict.FOREIGN, Verdict.ACCEPTED]


async def test_events_without_a_group_are_judged_as_before(pool, clock, target, processor):
    """Events that name no group (an older runtime) claim nothing and are never foreign."""
    message = await due_occurrence(pool, "acme", target, clock.now())
    token = uuid.uuid4()
    assert await processor.apply_events(
        [Ev.started(message.occurrence_id, 1, token, TTL), Ev.succeeded(message.occurrence_id, 1, token)]
    ) == [Verdict.ACCEPTED, Verdict.ACCEPTED]
    assert await attempt_owner(pool, target) is None


@pytest.mark.parametrize("field,value", [("target", ""), ("consumer_group", " "), ("consumer_group", "g" * 256)])
async def test_registering_an_owner_with_a_bad_name_names_the_field(pool, clock, field, value):
    args = {"target": "billing.invoice", "consumer_group": "billing", field: value}
    with pytest.raises(InvalidInput) as raised:
        await register_attempt_owner(pool, args["target"], args["consumer_group"], clock)
    assert raised.value.field == field


async def test_two_consumer_groups_on_one_target_the_owners_failure_is_retried_and_its_effect_not_lost(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects, target
):
    """The real stack: billing's app starts the attempt (and so owns the target) and its handler fails
    after audit's app, a second group on the same topic, has started, applied and reported the same
    delivery. Before target owners audit's `started` took billing's lease over, billing's failure was
    fenced, audit's success settled the occurrence and billing never applied it."""
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=3, base=1.0, cap=1.0)
    billing_running, audit_done = asyncio.Event(), asyncio.Event()
    billing_calls: list[int] = []
    audit_calls: list[int] = []
    billing, audit = (group_app(f"{name}-{uuid.uuid4().hex[:6]}", kafka_bootstrap, consumer_db) for name in "ba")

    @billing.handler(target)
    async def bill(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        billing_calls.append(occurrence.attempt)
        await conn.execute(
            "INSERT INTO effects (occurrence_id, attempt) VALUES ($1, $2)", occurrence.occurrence_id, occurrence.attempt
        )
        if occurrence.attempt == 1:
            billing_running.set()
            await audit_done.wait()
            raise ConnectionRefusedError("payment provider unavailable")  # transient: must be retried

    @audit.handler(target)
    async def observe(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        audit_calls.append(occurrence.attempt)

    async with Running(billing):
        await wait_for(billing_running.wait, timeout=30)
        async with Running(audit):
            await wait_for(lambda: audit.stats.applied >= 1, timeout=30)  # reported, too
            audit_done.set()
            await wait_for(lambda: state_is(pool, sent.occurrence_id, "RETRY_WAIT"), timeout=30)
            clock.advance(1)  # past the backoff (cap 1 s): the relay publishes the retry
            await wait_for(lambda: state_is(pool, sent.occurrence_id, "SUCCEEDED"), timeout=30)
            await wait_for(lambda: audit.stats.duplicates >= 1, timeout=30)  # audit's report of the retry
    attempts = await attempt_rows(pool, sent.occurrence_id)
    assert [(a["attempt_number"], a["result"], a["consumer_group"]) for a in attempts] == [
        (1, "failed", billing.config.group),
        (2, "succeeded", billing.config.group),
    ]
    assert billing_calls == [1, 2] and audit_calls == [1]
    assert await effects.fetch("SELECT occurrence_id, attempt FROM effects") == [(sent.occurrence_id, 2)]


def group_app(group: str, kafka_bootstrap: str, consumer_db: str) -> ConsumerApp:
    return ConsumerApp(
        ConsumerConfig(
            group, kafka_bootstrap, consumer_db, session_timeout=2.0, heartbeat_interval=0.4, redelivery_backoff=0.05
        )
    )


async def state_is(pool, ident: uuid.UUID, expected: str) -> bool:
    return (await occurrence_row(pool, ident))["state"] == expected

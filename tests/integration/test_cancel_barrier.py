"""The cancel barrier on the real stack (docs/state-machine.md, "Cancel as a barrier"): the runtime calls a
handler only after the engine answered its `started` with `granted`, on chronoq.attempt-grants.

The two orders of cancel and start are in tests/integration/test_cancel_race.py; here: no answer within
the bound (the attempt processor stopped), a duplicate `started` read again after a crash between the
commit and the reply, batch handlers, and records on the reply topic that are no answer.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import timedelta

import asyncpg
import pytest
from aiokafka.structs import ConsumerRecord
from opentelemetry.metrics import NoOpMeter

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from consumers.attempt_grants import GrantWaiter
from engine.control.schedules import ControlPlane
from engine.loops.attempt_grants import GrantPublisher
from engine.loops.attempt_processor import AttemptProcessor, AttemptProcessorConfig
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.service import PIPELINE_ROLES, Role
from schemas.attempt_events import AttemptEvent, encode_group
from schemas.attempt_grants import AttemptGrant, grant_partition
from schemas.messages import decode_occurrence
from schemas.topics import (
    ATTEMPT_GRANTS_TOPIC,
    ATTEMPTS_TOPIC,
    create_missing_topics,
    occurrence_topic,
    topic_partitions,
)
from tests.support.kafka import produce
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row
from tests.support.services import Running, fast_services, services_running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def app_for(kafka_bootstrap: str, consumer_db: str, **config: object) -> ConsumerApp:
    return ConsumerApp(
        ConsumerConfig(
            f"barrier-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            redelivery_backoff=0.05,
            redelivery_backoff_max=0.2,
            **config,  # type: ignore[arg-type]
        )
    )


async def produce_to_group_partition(kafka_bootstrap: str, group: str, values: list[bytes]) -> None:
    partitions = await topic_partitions(kafka_bootstrap, ATTEMPT_GRANTS_TOPIC)
    # Not keyed: these must reach the group's partition, as the engine's answers do.
    await produce(
        kafka_bootstrap, ATTEMPT_GRANTS_TOPIC, values, key=None, partition=grant_partition(group, len(partitions))
    )


async def test_no_answer_within_the_bound_retries_in_place_until_the_processor_runs(
    engine_db, pool, clock, kafka_bootstrap, consumer_db, effects, target
):
    """The attempt processor is down: every `started` goes unanswered, so the handler is never called; each
    wait ends after attempt_grant_timeout, rolls back and retries in place with a new claim. Records on the
    reply topic that are no answer (garbled, or an answer for a token nobody waits on) change nothing.
    Once the processor runs, the latest claim is granted: one effect, no attempt consumed."""
    sent = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=3)
    calls: list[int] = []
    app = app_for(kafka_bootstrap, consumer_db, attempt_grant_timeout=0.5)

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        calls.append(occurrence.attempt)
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)

    without_attempts = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER, Role.ATTEMPTS, Role.STUCK})
    async with services_running(engine_db, kafka_bootstrap, without_attempts, clock), Running(app):
        await wait_for(lambda: app.stats.grant_timeouts >= 2, timeout=30)
        forged = AttemptGrant(sent.occurrence_id, uuid.uuid4(), app.config.group, "granted")
        await produce_to_group_partition(kafka_bootstrap, app.config.group, [b"\xff not a grant", forged.encode()])
        assert app.grants is not None
        await wait_for(lambda: app.grants.malformed >= 1, timeout=30)  # type: ignore[union-attr]
        assert calls == [] and app.stats.applied == 0  # no answer, no forged token: no handler
        async with services_running(engine_db, kafka_bootstrap, fast_services(roles={Role.ATTEMPTS}), clock):
            await wait_for(lambda: app.stats.applied >= 1, timeout=30)
            await wait_for(
                lambda: pool.fetchval(
                    "SELECT state = 'SUCCEEDED' FROM occurrences WHERE occurrence_id = $1", sent.occurrence_id
                ),
                timeout=30,
            )
    assert calls == [1]
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1
    row = await occurrence_row(pool, sent.occurrence_id)
    assert (row["state"], row["attempt_count"]) == ("SUCCEEDED", 1)  # the waits consumed no attempt
    attempts = await attempt_rows(pool, sent.occurrence_id)
    assert {a["attempt_number"] for a in attempts} == {1}
    assert [a["result"] for a in attempts if a["result"] != "fenced"] == ["succeeded"]  # earlier claims: fenced


async def test_a_duplicate_started_read_again_after_a_crash_before_the_reply_is_granted(
    pool, clock, kafka_bootstrap, target
):
    """The engine committed a `started` and died before answering; the next engine reads the same record
    again (its offset was not committed): a duplicate that changes nothing, answered from the state —
    RUNNING on that token — so `granted`, on the group's partition, where the waiting runtime reads it."""
    sent = await due_occurrence(pool, "acme", target, clock.now())
    group, token = f"barrier-{uuid.uuid4().hex[:8]}", uuid.uuid4()
    started = AttemptEvent.started(sent.occurrence_id, 1, token, 30.0, group, "w", claim_order=7)
    crashed = AttemptProcessor(pool, clock=clock, rng=random.Random(1))  # no answers: died before them
    assert [v.value for v in await crashed.apply_events([started])] == ["accepted"]
    await create_missing_topics(kafka_bootstrap, [ATTEMPT_GRANTS_TOPIC])
    waiter = GrantWaiter(group, NoOpMeter("test"))
    await waiter.start(kafka_bootstrap)
    waiter.expect([token])
    publisher = GrantPublisher(kafka_bootstrap, NoOpMeter("test"))
    await publisher.start()
    try:
        again = AttemptProcessor(pool, clock=clock, rng=random.Random(2), grants=publisher)
        assert [v.value for v in await again.apply_events([started])] == ["duplicate"]
        stop = asyncio.Event()
        follow = asyncio.create_task(waiter.follow(stop))
        answer = (await waiter.wait([token], timeout=15))[token]
        stop.set()
        await follow
    finally:
        await publisher.stop()
        await waiter.stop()
    assert answer == AttemptGrant(sent.occurrence_id, token, group, "granted")
    assert publisher.sent == 1
    assert (await occurrence_row(pool, sent.occurrence_id))["lease_token"] == token


class _Answers:
    """A GrantSink that keeps what the processor would send."""

    def __init__(self) -> None:
        self.sent: list[AttemptGrant] = []
        self.forms: list[tuple[bool, list[uuid.UUID]]] = []

    async def send(self, grants, grouped=False) -> None:
        self.sent.extend(grants)
        self.forms.append((grouped, [grant.lease_token for grant in grants]))


async def test_every_started_is_answered_whether_its_scheduled_for_is_right_wrong_or_absent(pool, clock, target):
    """The answers read the leases in the days the events name (one partition, not every day's) and fall
    back to the id alone: an event from an older runtime (no scheduled_for) or with a wrong one is answered
    as surely as one with the right instant, and an occurrence that does not exist is refused `unknown`."""
    sent = [await due_occurrence(pool, "acme", target, clock.now() - timedelta(days=d)) for d in (0, 1, 2)]
    group, tokens = f"barrier-{uuid.uuid4().hex[:8]}", [uuid.uuid4() for _ in range(4)]
    nowhere = uuid.uuid4()
    instants = [sent[0].scheduled_for, sent[1].scheduled_for + timedelta(days=5), None]
    events = [
        AttemptEvent.started(message.occurrence_id, 1, token, 30.0, group, "w", scheduled_for=at)
        for message, token, at in zip(sent, tokens, instants, strict=False)
    ] + [AttemptEvent.started(nowhere, 1, tokens[3], 30.0, group, "w", scheduled_for=clock.now())]
    answers = _Answers()
    processor = AttemptProcessor(pool, clock=clock, rng=random.Random(3), grants=answers)
    assert [v.value for v in await processor.apply_events(events)] == ["accepted"] * 3 + ["unknown"]
    assert answers.sent == [
        *(AttemptGrant(m.occurrence_id, t, group, "granted") for m, t in zip(sent, tokens, strict=False)),
        AttemptGrant(nowhere, tokens[3], group, "refused", "unknown"),
    ]


async def test_started_in_a_group_is_answered_in_a_group_and_a_single_one_alone(pool, clock, target):
    """Engines are upgraded before runtimes: a runtime that sends single events (an older one) must get single
    answers, which it can read; a runtime that sends groups gets its answers in groups. A partition holding
    more events than a transaction takes is applied in several, in order."""
    sent = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(5)]
    group, tokens = f"barrier-{uuid.uuid4().hex[:8]}", [uuid.uuid4() for _ in sent]
    started = [
        AttemptEvent.started(m.occurrence_id, 1, token, 30.0, group, "w", scheduled_for=m.scheduled_for)
        for m, token in zip(sent, tokens, strict=True)
    ]
    key, value, headers = encode_group(started[:4])
    grouped = ConsumerRecord(ATTEMPTS_TOPIC, 0, 0, 0, 0, key, value, None, len(key), len(value), headers)
    single = started[4]
    alone = ConsumerRecord(ATTEMPTS_TOPIC, 1, 0, 0, 0, single.key, single.encode(), None, 0, 0, single.headers())
    answers = _Answers()
    config = AttemptProcessorConfig(max_poll_records=3)  # 5 events: two transactions
    processor = AttemptProcessor(pool, clock=clock, rng=random.Random(3), grants=answers, config=config)

    assert await processor.handle_records([grouped, alone]) == {"accepted": 5}
    # Partition 0's four events take two transactions, in order; partition 1's single one a transaction beside
    # them. Each answered in its form.
    assert [form for form in answers.forms if form[0]] == [(True, tokens[:3]), (True, [tokens[3]])]
    assert [form for form in answers.forms if not form[0]] == [(False, [tokens[4]])]
    assert {(await occurrence_row(pool, m.occurrence_id))["lease_token"] for m in sent} == set(tokens)


class _StatesAtAnswer(_Answers):
    """Also reads, when each answer goes out, the states of the occurrences ``watched``."""

    def __init__(self, pool: asyncpg.Pool, watched: list[uuid.UUID]) -> None:
        super().__init__()
        self.pool, self.watched = pool, watched
        self.states: list[list[str]] = []

    async def send(self, grants, grouped=False) -> None:
        rows = await self.pool.fetch(
            "SELECT state FROM occurrences WHERE occurrence_id = ANY($1) ORDER BY state", self.watched
        )
        self.states.append([row["state"] for row in rows])
        await super().send(grants, grouped)


async def test_starts_waiting_behind_earlier_outcomes_are_answered_in_the_first_transaction(pool, clock, target):
    """A backlogged partition: an earlier batch's outcomes, then a new batch's `started`, more than a transaction
    holds. The runtime waits on the answers, nobody on the outcomes: the `started` go first and are answered
    before the outcomes are applied (those occurrences are still RUNNING then), and everything is applied."""
    earlier = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(3)]
    fresh = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(3)]
    group = f"barrier-{uuid.uuid4().hex[:8]}"
    old_tokens, new_tokens = [uuid.uuid4() for _ in earlier], [uuid.uuid4() for _ in fresh]
    start = [
        AttemptEvent.started(m.occurrence_id, 1, t, 30.0, group, "w", scheduled_for=m.scheduled_for)
        for m, t in zip(earlier + fresh, old_tokens + new_tokens, strict=True)
    ]
    processor = AttemptProcessor(pool, clock=clock, rng=random.Random(3), grants=_Answers())
    await processor.apply_events(start[:3])
    outcomes = [AttemptEvent.succeeded(m.occurrence_id, 1, t) for m, t in zip(earlier, old_tokens, strict=True)]
    key, value, headers = encode_group(outcomes + start[3:])
    record = ConsumerRecord(ATTEMPTS_TOPIC, 0, 0, 0, 0, key, value, None, len(key), len(value), headers)
    answers = _StatesAtAnswer(pool, [m.occurrence_id for m in earlier])
    config = AttemptProcessorConfig(max_poll_records=3)  # 6 events: two transactions
    processor = AttemptProcessor(pool, clock=clock, rng=random.Random(3), grants=answers, config=config)

    assert await processor.handle_records([record]) == {"accepted": 6}
    assert answers.forms == [(True, new_tokens)]
    assert answers.states == [["RUNNING"] * 3], "answered before the earlier batch's outcomes were applied"
    assert {(await occurrence_row(pool, m.occurrence_id))["state"] for m in earlier} == {"SUCCEEDED"}


async def test_a_batch_handler_gets_only_the_occurrences_the_engine_granted(
    engine_db, pool, clock, kafka_bootstrap, consumer_db, effects, target, acme
):
    """Two occurrences in one batch; one schedule was canceled before the consumer read it and its
    cancellation never left the engine (no relay). One wait for both answers: the canceled one is refused
    (its dedupe row rolled back, not reported), the other reaches the handler and is applied."""
    control = ControlPlane(pool, clock)
    live = await control.create_schedule("acme", {"kind": "rate", "expression": "1m", "target": target})
    doomed = await control.create_schedule("acme", {"kind": "rate", "expression": "1m", "target": target})
    clock.advance(timedelta(seconds=45))
    await Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock).run_once()
    raws = [r["message"] for r in await pool.fetch("SELECT message FROM outbox WHERE occurrence_id IS NOT NULL")]
    messages = {decode_occurrence(raw).schedule_id: decode_occurrence(raw) for raw in raws}
    assert len(messages) == 2
    await produce(kafka_bootstrap, occurrence_topic(target), raws)  # one key: one partition, one batch
    answer = await control.cancel_schedule("acme", doomed["schedule_id"])
    assert answer["canceled_occurrences"] == 1
    batches: list[list[uuid.UUID]] = []
    app = app_for(kafka_bootstrap, consumer_db)

    @app.handler(target, batch=10)
    async def apply(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
        batches.append([o.occurrence_id for o in occurrences])
        await conn.executemany(
            "INSERT INTO effects (occurrence_id) VALUES ($1)", [(o.occurrence_id,) for o in occurrences]
        )

    engine_without_relay = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER, Role.RELAY})
    async with services_running(engine_db, kafka_bootstrap, engine_without_relay, clock), Running(app):
        await wait_for(lambda: app.stats.applied + app.stats.refused >= 2, timeout=30)
        live_id = messages[uuid.UUID(str(live["schedule_id"]))].occurrence_id
        await wait_for(
            lambda: pool.fetchval("SELECT state = 'SUCCEEDED' FROM occurrences WHERE occurrence_id = $1", live_id),
            timeout=30,
        )
    doomed_id = messages[uuid.UUID(str(doomed["schedule_id"]))].occurrence_id
    assert batches == [[live_id]]
    assert (app.stats.applied, app.stats.refused) == (1, 1)
    assert await effects.fetch("SELECT occurrence_id FROM effects") == [(live_id,)]
    assert await effects.fetchval("SELECT array_agg(occurrence_id) FROM chronoq_consumer_dedupe") == [live_id]
    assert (await occurrence_row(pool, doomed_id))["state"] == "CANCELED"
    assert await attempt_rows(pool, doomed_id) == []

"""Authenticated attempt events (issue 10 item 5), on real PostgreSQL and, through the running engine, the
real broker: an event is applied only if it is signed by a valid credential of its occurrence's target.

Before this, anyone who could write ``chronoq.attempts`` marked any occurrence SUCCEEDED with one
``already_applied`` event, or DEAD with ``started`` + permanent ``failed``.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from functools import partial

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from engine.control import attempt_credentials as credentials
from engine.control.targets import register
from engine.control.tenants import create_tenant
from engine.loops.attempt_authentication import ReceivedEvent
from engine.loops.attempt_ledger import Verdict
from engine.loops.attempt_processor import AttemptProcessor
from schemas import observability as obs
from schemas.attempt_credentials import AttemptCredential, signed_by
from schemas.attempt_events import AttemptEvent as Ev
from schemas.attempt_events import encode_group
from schemas.errors import InvalidInput, NotFound
from schemas.topics import ATTEMPTS_TOPIC, create_missing_topics
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row
from tests.support.services import Running
from tests.support.waiting import wait_for

TTL = 30.0


@pytest.fixture
def processor(pool, clock, telemetry):
    return AttemptProcessor(pool, clock=clock, rng=random.Random(7), **telemetry.instruments("engine"))


async def owned_target(pool, clock, tenant: str) -> str:
    """A fresh target registered to ``tenant`` (created if needed)."""
    if await pool.fetchval("SELECT 1 FROM tenants WHERE tenant_id = $1", tenant) is None:
        await create_tenant(pool, tenant)
    target = f"test.{uuid.uuid4().hex[:10]}"
    await register(pool, target, tenant, clock)
    return target


def signed(credential: AttemptCredential, event: Ev) -> ReceivedEvent:
    """The event as the consumer runtime sends it with this credential."""
    key, value = event.key, event.encode()
    return ReceivedEvent(event, signed_by(credential.sign(key, value)), key, value)


def rejections(telemetry) -> dict[str, int]:
    """Rejected events by reason (the counter's points are per reason and event kind)."""
    by_reason: Counter[str] = Counter()
    for point in telemetry.points(obs.ATTEMPT_EVENTS_REJECTED):
        by_reason[dict(point.attributes)["reason"]] += point.value
    return dict(by_reason)


async def test_forged_events_for_another_tenants_occurrence_are_rejected_and_counted(pool, clock, processor, telemetry):
    victim_target = await owned_target(pool, clock, "acme")
    attacker_target = await owned_target(pool, clock, "evil")
    victim = (await credentials.issue(pool, victim_target, clock)).credential
    attacker = (await credentials.issue(pool, attacker_target, clock)).credential
    message = await due_occurrence(pool, "acme", victim_target, clock.now(), max_attempts=1)
    occ, token = message.occurrence_id, uuid.uuid4()
    applied = Ev.already_applied(occ, 1, None, "billing")
    # A genuine signature of the victim's, taken from another record (a heartbeat) and put on a forgery.
    genuine = signed(victim, Ev.heartbeat(occ, 1, token, TTL))
    forgeries = [
        ReceivedEvent(applied),  # unsigned
        signed(attacker, applied),  # the attacker's own, valid credential: another target's
        signed(attacker, Ev.started(occ, 1, token, TTL, "evil", "x")),
        signed(attacker, Ev.failed(occ, 1, token, "Boom", "forged", permanent=True)),
        signed(AttemptCredential.issue(), applied),  # a credential the engine never issued
        signed(AttemptCredential(victim.credential_id, attacker.secret), applied),  # the victim's id, a guess
        ReceivedEvent(applied, genuine.claim, applied.key, applied.encode()),  # a replayed signature
    ]

    assert await processor.apply_events(forgeries) == [Verdict.REJECTED] * len(forgeries)
    row = await occurrence_row(pool, occ)
    assert (row["state"], row["attempt_count"]) == ("SCHEDULED", 0)
    assert await attempt_rows(pool, occ) == []
    assert rejections(telemetry) == {
        "unsigned": 1,
        "wrong_target": 3,
        "unknown_credential": 1,
        "bad_signature": 2,
    }
    assert processor.stats[Verdict.REJECTED] == len(forgeries)

    # The victim's own consumer side still works.
    assert await processor.apply_events(
        [signed(victim, Ev.started(occ, 1, token, TTL, "billing", "w")), signed(victim, Ev.succeeded(occ, 1, token))]
    ) == [Verdict.ACCEPTED, Verdict.ACCEPTED]
    assert (await occurrence_row(pool, occ))["state"] == "SUCCEEDED"


async def test_rotation_keeps_the_previous_credential_valid_for_its_grace_then_rejects_it(
    pool, clock, processor, telemetry
):
    target = await owned_target(pool, clock, "acme")
    old = (await credentials.issue(pool, target, clock)).credential
    rotated = await credentials.rotate(pool, target, clock, grace=timedelta(seconds=60))
    assert rotated.expiring == (old.credential_id,)
    new = rotated.credential
    first = await due_occurrence(pool, "acme", target, clock.now())
    second = await due_occurrence(pool, "acme", target, clock.now() + timedelta(seconds=1))
    token = uuid.uuid4()

    clock.advance(59)  # an event the old process signed, still in flight: applied
    assert await processor.apply_events([signed(old, Ev.started(first.occurrence_id, 1, token, TTL))]) == [
        Verdict.ACCEPTED
    ]
    clock.advance(1)  # the grace is over
    assert await processor.apply_events(
        [
            signed(old, Ev.succeeded(first.occurrence_id, 1, token)),
            signed(new, Ev.succeeded(first.occurrence_id, 1, token)),
            signed(new, Ev.already_applied(second.occurrence_id, 1, None)),
        ]
    ) == [Verdict.REJECTED, Verdict.ACCEPTED, Verdict.ACCEPTED]
    assert rejections(telemetry) == {"expired_credential": 1}
    listed = {c.credential_id: c.valid_until for c in await credentials.list_credentials(pool, target)}
    assert listed == {new.credential_id: None, old.credential_id: rotated.info.created_at + timedelta(seconds=60)}


async def test_a_revoked_credential_is_rejected_at_once_and_unsigned_events_stay_rejected(
    pool, clock, processor, telemetry
):
    target = await owned_target(pool, clock, "acme")
    leaked = (await credentials.issue(pool, target, clock)).credential
    message = await due_occurrence(pool, "acme", target, clock.now())
    await credentials.revoke(pool, leaked.credential_id, clock)
    forged = Ev.already_applied(message.occurrence_id, 1, None)
    # With every credential of the target revoked, the target still requires signatures.
    assert await processor.apply_events([signed(leaked, forged), ReceivedEvent(forged)]) == [Verdict.REJECTED] * 2
    assert rejections(telemetry) == {"expired_credential": 1, "unsigned": 1}
    assert (await occurrence_row(pool, message.occurrence_id))["state"] == "SCHEDULED"
    with pytest.raises(NotFound):
        await credentials.revoke(pool, uuid.uuid4(), clock)


async def test_a_forged_instant_does_not_slip_an_event_past_the_check(pool, clock, processor, telemetry):
    """The check reads each event's occurrence in the day its scheduled_for names. An unsigned event for an
    enforced target that names the wrong day (or none) must still be found, and rejected: were it "not
    found", it would count as about no occurrence, pass unchecked, and the ledger (which falls back to the
    id alone) would apply it. A correctly signed event with a wrong day is still accepted."""
    target = await owned_target(pool, clock, "acme")
    credential = (await credentials.issue(pool, target, clock)).credential
    messages = [await due_occurrence(pool, "acme", target, clock.now() - timedelta(days=d)) for d in (0, 1, 2)]
    wrong_day = messages[0].scheduled_for + timedelta(days=3)
    forged = [
        Ev.already_applied(messages[0].occurrence_id, 1, None, scheduled_for=wrong_day),
        Ev.already_applied(messages[1].occurrence_id, 1, None),  # no instant: an older runtime's format
    ]
    honest = Ev.already_applied(messages[2].occurrence_id, 1, None, scheduled_for=wrong_day)
    verdicts = await processor.apply_events([ReceivedEvent(e) for e in forged] + [signed(credential, honest)])
    assert verdicts == [Verdict.REJECTED, Verdict.REJECTED, Verdict.ACCEPTED]
    assert rejections(telemetry) == {"unsigned": 2}
    states = [(await occurrence_row(pool, m.occurrence_id))["state"] for m in messages]
    assert states == ["SCHEDULED", "SCHEDULED", "SUCCEEDED"]


async def test_a_target_without_credentials_accepts_unsigned_events_but_no_other_targets_signature(
    pool, clock, processor, telemetry
):
    """Deployments from before credentials keep working; a signature, when present, must still be right."""
    open_target = await owned_target(pool, clock, "acme")
    other = (await credentials.issue(pool, await owned_target(pool, clock, "evil"), clock)).credential
    message = await due_occurrence(pool, "acme", open_target, clock.now())
    forged = Ev.already_applied(message.occurrence_id, 1, None)
    assert await processor.apply_events([signed(other, forged)]) == [Verdict.REJECTED]
    assert await processor.apply_events([forged]) == [Verdict.ACCEPTED]
    assert rejections(telemetry) == {"wrong_target": 1}


async def test_credentials_are_issued_only_for_registered_targets_with_a_bounded_grace(pool, clock):
    with pytest.raises(NotFound, match="target"):
        await credentials.issue(pool, "test.never-registered", clock)
    target = await owned_target(pool, clock, "acme")
    with pytest.raises(InvalidInput, match="grace"):
        await credentials.rotate(pool, target, clock, grace=timedelta(days=31))
    issued = await credentials.issue(pool, target, clock)
    assert issued.token.startswith("cqa_") and issued.token not in repr(issued)
    assert issued.credential.secret.hex() not in repr(issued.credential)


async def test_the_running_engine_applies_a_signing_consumer_apps_events_and_rejects_forged_records(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects
):
    """The legitimate path end to end (relay, broker, consumer app signing, attempt processor verifying), then
    forged records on the real attempts topic, each followed on its partition by a genuine one."""
    served = await owned_target(pool, clock, "acme")
    token = (await credentials.issue(pool, served, clock)).token
    app = ConsumerApp(
        ConsumerConfig(
            f"auth-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            attempt_credentials={served: token},
        )
    )

    @app.handler(served)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO effects (occurrence_id) VALUES ($1)", occurrence.occurrence_id)

    sent = await due_occurrence(pool, "acme", served, clock.now())
    async with Running(app):
        await wait_for(lambda: _state(pool, sent.occurrence_id, "SUCCEEDED"))
    assert await effects.fetchval("SELECT count(*) FROM effects") == 1

    # An occurrence of another target of acme's (no app runs it) that evil tries to finish.
    unserved = await owned_target(pool, clock, "acme")
    credential = (await credentials.issue(pool, unserved, clock)).credential
    evil = (await credentials.issue(pool, await owned_target(pool, clock, "evil"), clock)).credential
    victim = await due_occurrence(pool, "acme", unserved, clock.now())
    occ, lease = victim.occurrence_id, uuid.uuid4()
    forged = Ev.already_applied(occ, 1, None)
    genuine = Ev.started(occ, 1, lease, TTL, "billing", "w")
    await _produce(
        kafka_bootstrap,
        [
            (forged, []),
            (forged, evil.sign(forged.key, forged.encode())),
            (forged, [("chronoq-credential", None), ("chronoq-attempt-signature", b"00")]),  # garbled
            (genuine, credential.sign(genuine.key, genuine.encode())),
        ],
    )
    # One partition, in order: the genuine start is applied only after the forgeries were read. Had any
    # been applied, the occurrence would be SUCCEEDED and the start refused.
    await wait_for(lambda: _state(pool, occ, "RUNNING"))
    assert [a["lease_token"] for a in await attempt_rows(pool, occ)] == [lease]


async def test_a_batch_handlers_events_are_signed_like_a_single_handlers(
    engine, pool, clock, kafka_bootstrap, consumer_db, effects
):
    """A batch handler's started and succeeded events go out in Kafka batches (AttemptReporter.send_many);
    on a target that requires signatures they are applied only because they are signed too."""
    served = await owned_target(pool, clock, "acme")
    token = (await credentials.issue(pool, served, clock)).token
    app = ConsumerApp(
        ConsumerConfig(
            f"auth-batch-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            attempt_credentials={served: token},
        )
    )

    @app.handler(served, batch=50)
    async def apply(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
        await conn.executemany(
            "INSERT INTO effects (occurrence_id) VALUES ($1)", [(o.occurrence_id,) for o in occurrences]
        )

    sent = [await due_occurrence(pool, "acme", served, clock.now()) for _ in range(5)]
    async with Running(app):
        for occurrence in sent:
            await wait_for(partial(_state, pool, occurrence.occurrence_id, "SUCCEEDED"))
    assert await effects.fetchval("SELECT count(*) FROM effects") == len(sent)
    assert app.stats.applied == len(sent)


async def _state(pool, ident, expected: str) -> bool:
    return (await occurrence_row(pool, ident))["state"] == expected


async def _produce(bootstrap: str, records: list[tuple[Ev, Sequence[tuple[str, bytes | None]]]]) -> None:
    await create_missing_topics(bootstrap, [ATTEMPTS_TOPIC])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for event, extra in records:
            await producer.send_and_wait(
                ATTEMPTS_TOPIC, event.encode(), key=event.key, headers=[*event.headers(), *extra]
            )
    finally:
        await producer.stop()


def group_record(events: list[Ev], credential: AttemptCredential | None = None, offset: int = 0) -> ConsumerRecord:
    """A group record (format 2) as the consumer runtime produces it, signed once with ``credential``."""
    key, value, headers = encode_group(events)
    if credential is not None:
        headers.extend(credential.sign(key, value))
    return ConsumerRecord(ATTEMPTS_TOPIC, 0, offset, 0, 0, key, value, None, len(key), len(value), headers)


async def test_a_group_record_is_signed_once_and_each_of_its_events_still_judged_by_its_own_occurrence(
    pool, clock, processor, telemetry
):
    """One signature covers a whole group; it vouches for no occurrence of another target (the credential's
    target is checked per event), and a group changed after signing, or with garbled credential headers, has
    every one of its events rejected."""
    ours = await owned_target(pool, clock, "acme")
    theirs = await owned_target(pool, clock, "globex")
    credential = (await credentials.issue(pool, ours, clock)).credential
    await credentials.issue(pool, theirs, clock)
    mine = [await due_occurrence(pool, "acme", ours, clock.now()) for _ in range(3)]
    foreign = await due_occurrence(pool, "globex", theirs, clock.now())
    tokens = {m.occurrence_id: uuid.uuid4() for m in [*mine, foreign]}
    started = [Ev.started(o, 1, t, TTL, "billing", "w") for o, t in tokens.items()]

    tampered = group_record(started[:1], credential)
    tampered.value = tampered.value.replace(b'"w"', b'"x"')
    garbled = group_record(started[:1])
    garbled.headers = [*garbled.headers, ("chronoq-credential", b"not-a-uuid"), ("chronoq-attempt-signature", b"0")]
    counts = await processor.handle_records([tampered, garbled])
    assert counts == {"rejected": 2}
    assert rejections(telemetry) == {"bad_signature": 1, "malformed": 1}

    counts = await processor.handle_records([group_record(started, credential, offset=1)])
    assert counts == {"accepted": 3, "rejected": 1}
    assert rejections(telemetry)["wrong_target"] == 1
    assert {m.occurrence_id: (await occurrence_row(pool, m.occurrence_id))["state"] for m in mine} == {
        m.occurrence_id: "RUNNING" for m in mine
    }
    assert (await occurrence_row(pool, foreign.occurrence_id))["state"] == "SCHEDULED"


async def test_a_group_with_one_malformed_event_is_one_poison_record_and_changes_nothing(pool, clock, processor):
    target = await owned_target(pool, clock, "acme")
    message = await due_occurrence(pool, "acme", target, clock.now())
    good = Ev.started(message.occurrence_id, 1, uuid.uuid4(), TTL, "billing", "w")
    record = group_record([good, good])
    data = orjson.loads(record.value)
    data["events"][1]["lease_ttl"] = -1  # the second event only
    record.value = orjson.dumps(data)

    assert await processor.handle_records([record]) == {"poison": 1}
    assert (await occurrence_row(pool, message.occurrence_id))["state"] == "SCHEDULED"
    assert processor.stats.poison == 1

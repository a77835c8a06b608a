"""The cancel barrier's pure pieces: the grant format, its partition, the answer from state, the waiter."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.metrics import NoOpMeter

from consumers import ConsumerConfig
from consumers.attempt_grants import GrantWaiter
from engine.loops.attempt_authentication import ReceivedEvent
from engine.loops.attempt_processor import answers
from engine.rules import attempt_grants as rules
from engine.rules.attempt_decisions import Verdict
from schemas import attempt_grants as wire
from schemas.attempt_events import AttemptEvent
from schemas.attempt_grants import AttemptGrant, decode_attempt_grant, decode_attempt_grants, grant_partition
from schemas.errors import MalformedMessage

OCC, TOKEN, OTHER = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

groups = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), min_size=1, max_size=40)
grants = st.one_of(
    st.builds(AttemptGrant, st.uuids(), st.uuids(), groups, st.just(wire.GRANTED)),
    st.builds(
        AttemptGrant,
        st.uuids(),
        st.uuids(),
        groups,
        st.just(wire.REFUSED),
        st.sampled_from(wire.REFUSAL_REASONS),
    ),
)


@given(grants)
def test_a_grant_survives_encoding(grant: AttemptGrant) -> None:
    assert decode_attempt_grant(grant.encode()) == grant


def raw(**fields: object) -> bytes:
    base: dict[str, object] = {
        "format": 1,
        "occurrence_id": str(OCC),
        "lease_token": str(TOKEN),
        "consumer_group": "billing",
        "result": "granted",
    }
    base.update(fields)
    return orjson.dumps({k: v for k, v in base.items() if v is not ...})


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (None, "value"),
        (b"not json", "value"),
        (b"[1]", "value"),
        (raw(format=2), "format"),
        (raw(result="maybe"), "result"),
        (raw(result="refused"), "reason"),  # a refusal says why
        (raw(result="refused", reason="because"), "reason"),
        (raw(reason="canceled"), "reason"),  # a grant has no reason
        (raw(lease_token=...), "lease_token"),
        (raw(lease_token="x"), "lease_token"),
        (raw(occurrence_id=7), "occurrence_id"),
        (raw(consumer_group=""), "consumer_group"),
        (raw(consumer_group="g" * 300), "consumer_group"),
    ],
)
def test_a_malformed_grant_is_rejected_naming_the_field(value: bytes | None, field: str) -> None:
    with pytest.raises(MalformedMessage) as caught:
        decode_attempt_grant(value)
    assert caught.value.field == field


def test_a_grant_the_wire_cannot_carry_is_refused_when_made() -> None:
    with pytest.raises(MalformedMessage):
        AttemptGrant(OCC, TOKEN, "bill\x00ing", "granted")
    with pytest.raises(MalformedMessage):
        AttemptGrant(OCC, TOKEN, "bill\ud800ing", "granted")  # a lone surrogate: no UTF-8 for it
    with pytest.raises(MalformedMessage):
        AttemptGrant(OCC, TOKEN, "billing", "refused")  # no reason


def test_a_groups_partition_is_stable_and_in_range() -> None:
    # CRC-32, not Python's salted hash: every process (and the engine) computes the same partition.
    assert (grant_partition("billing", 8), grant_partition("billing", 16)) == (2, 10)  # pinned: a wire contract
    assert {grant_partition("billing", 8) for _ in range(3)} == {grant_partition("billing", 8)}
    assert all(0 <= grant_partition(f"g{i}", 8) < 8 for i in range(200))
    assert len({grant_partition(f"g{i}", 8) for i in range(200)}) == 8  # groups spread over the partitions
    assert grant_partition("anything", 1) == 0
    with pytest.raises(ValueError, match="no partitions"):
        grant_partition("billing", 0)


def test_the_rules_answer_with_the_wire_names() -> None:
    assert (rules.GRANTED, rules.REFUSED) == (wire.GRANTED, wire.REFUSED)
    assert {
        rules.CANCELED,
        rules.FENCED,
        rules.FINISHED,
        rules.UNKNOWN,
        rules.FOREIGN_GROUP,
        rules.NOT_AUTHENTICATED,
    } == set(wire.REFUSAL_REASONS)


@pytest.mark.parametrize(
    ("verdict", "state", "current", "answer"),
    [
        ("accepted", "RUNNING", TOKEN, ("granted", None)),
        ("duplicate", "RUNNING", TOKEN, ("granted", None)),  # re-read after a crash between commit and reply
        ("accepted", "SUCCEEDED", TOKEN, ("granted", None)),  # started and succeeded in one batch
        ("fenced", "CANCELED", None, ("refused", "canceled")),  # the cancel committed first
        ("foreign", "CANCELED", None, ("refused", "canceled")),  # an observer is stopped by a cancel too
        ("foreign", "RUNNING", OTHER, ("refused", "foreign_group")),
        ("fenced", "RUNNING", OTHER, ("refused", "fenced")),  # a later claim took the lease over
        ("accepted", "RUNNING", OTHER, ("refused", "fenced")),  # taken over later in the same batch
        ("duplicate", "RETRY_WAIT", None, ("refused", "fenced")),
        ("fenced", "DEAD", None, ("refused", "finished")),
        ("fenced", "SUCCEEDED", OTHER, ("refused", "finished")),
        ("unknown", None, None, ("refused", "unknown")),
        ("rejected", "RUNNING", TOKEN, ("refused", "not_authenticated")),  # never applied, whatever the state
    ],
)
def test_the_answer_follows_the_state_after_the_batch(verdict, state, current, answer) -> None:
    assert rules.grant_for(TOKEN, verdict, state, current) == answer


def test_the_processor_answers_every_started_that_names_its_group() -> None:
    started = AttemptEvent.started(OCC, 1, TOKEN, 30.0, "billing", "w")
    anonymous = AttemptEvent.started(OCC, 1, OTHER, 30.0)  # an older runtime: waits for nothing
    heartbeat = AttemptEvent.heartbeat(OCC, 1, TOKEN, 30.0)
    received = [ReceivedEvent(e, None, e.key, e.encode()) for e in (started, anonymous, heartbeat)]
    leases = {OCC: {"state": "RUNNING", "lease_token": TOKEN}}
    verdicts = [Verdict.ACCEPTED, Verdict.ACCEPTED, Verdict.ACCEPTED]
    assert answers(received, verdicts, leases) == [AttemptGrant(OCC, TOKEN, "billing", "granted")]
    assert answers(received[:1], [Verdict.REJECTED], leases) == [
        AttemptGrant(OCC, TOKEN, "billing", "refused", "not_authenticated")
    ]
    assert answers(received[:1], [Verdict.UNKNOWN], {}) == [AttemptGrant(OCC, TOKEN, "billing", "refused", "unknown")]


async def test_the_waiter_resolves_its_own_tokens_and_ignores_the_rest() -> None:
    waiter = GrantWaiter("billing", NoOpMeter("test"))
    waiter.expect([TOKEN, OTHER])
    waiter.receive(b"\x00garbage", partition=3, offset=9)  # logged and counted, never raised
    waiter.receive(AttemptGrant(OCC, TOKEN, "audit", "granted").encode())  # another group on the partition
    waiter.receive(AttemptGrant(uuid.uuid4(), uuid.uuid4(), "billing", "granted").encode())  # nobody waits
    waiter.receive(AttemptGrant(OCC, TOKEN, "billing", "refused", "canceled").encode())
    answered = await waiter.wait([TOKEN, OTHER], timeout=0.01)
    assert answered == {TOKEN: AttemptGrant(OCC, TOKEN, "billing", "refused", "canceled"), OTHER: None}
    assert waiter.malformed == 1
    # Forgotten after the wait: a late answer changes nothing.
    waiter.receive(AttemptGrant(OCC, OTHER, "billing", "granted").encode())
    assert await waiter.wait([OTHER], timeout=0) == {OTHER: None}


async def test_an_answer_that_comes_while_waiting_ends_the_wait() -> None:
    waiter = GrantWaiter("billing", NoOpMeter("test"))
    waiter.expect([TOKEN])
    loop = asyncio.get_running_loop()
    loop.call_soon(waiter.receive, AttemptGrant(OCC, TOKEN, "billing", "granted").encode())
    answer = (await waiter.wait([TOKEN], timeout=30))[TOKEN]  # returns at once, not after 30 s
    assert answer is not None and answer.granted


def config(**overrides: object) -> ConsumerConfig:
    return ConsumerConfig("g", "127.0.0.1:9092", "postgresql:///x", **overrides)  # type: ignore[arg-type]


def test_the_barrier_is_on_by_default_and_waits_at_most_a_lease() -> None:
    cfg = config()
    assert cfg.barrier and cfg.grant_timeout == cfg.lease_ttl
    assert not config(report_attempts=False).barrier  # nothing is asked of the engine
    assert not config(attempt_barrier=False).barrier
    # A short idle limit bounds the default wait: the transaction waits idle for the answer.
    assert config(lease_ttl=3.0, handler_timeout=1.0, transaction_idle_timeout=2.0).grant_timeout == 1.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"attempt_grant_timeout": 0.0}, "attempt_grant_timeout .* must be positive"),
        ({"attempt_grant_timeout": 400.0}, "must be below transaction_idle_timeout"),
    ],
)
def test_a_grant_timeout_that_cannot_work_is_rejected(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        config(**overrides).validate()
    config(attempt_barrier=False, attempt_grant_timeout=400.0).validate()  # no wait, nothing to bound


async def test_a_batch_wait_ends_when_its_last_token_is_answered_and_keeps_the_first_answer_of_each() -> None:
    waiter = GrantWaiter("billing", NoOpMeter("test"))
    tokens = [uuid.uuid4() for _ in range(500)]
    waiter.expect(tokens)
    loop = asyncio.get_running_loop()
    for token in tokens[:-1]:
        waiter.receive(AttemptGrant(OCC, token, "billing", "granted").encode())
    # A second answer for a token already answered changes nothing (the first one stands).
    waiter.receive(AttemptGrant(OCC, tokens[0], "billing", "refused", "fenced").encode())
    waiting = asyncio.ensure_future(waiter.wait(tokens, timeout=30))
    await asyncio.sleep(0)
    assert not waiting.done()  # one token still unanswered
    loop.call_soon(waiter.receive, AttemptGrant(OCC, tokens[-1], "billing", "refused", "canceled").encode())
    answers = await asyncio.wait_for(waiting, 5)  # returns at the last answer, not after 30 s
    assert all((grant := answers[t]) is not None and grant.granted for t in tokens[:-1])
    assert answers[tokens[-1]] == AttemptGrant(OCC, tokens[-1], "billing", "refused", "canceled")
    # Everything is forgotten: a later expect of other tokens starts clean.
    assert not waiter._waiting


async def test_forgetting_part_of_a_batch_leaves_the_rest_waiting_and_a_wait_on_nothing_returns_at_once() -> None:
    waiter = GrantWaiter("billing", NoOpMeter("test"))
    waiter.expect([TOKEN, OTHER])
    waiter.forget([OTHER])  # e.g. dropped before the wait
    waiter.receive(AttemptGrant(OCC, OTHER, "billing", "granted").encode())  # nobody waits for it any more
    loop = asyncio.get_running_loop()
    loop.call_soon(waiter.receive, AttemptGrant(OCC, TOKEN, "billing", "granted").encode())
    answers = await asyncio.wait_for(waiter.wait([TOKEN], timeout=30), 5)
    grant = answers[TOKEN]
    assert grant is not None and grant.granted
    waiter.expect([])
    assert await asyncio.wait_for(waiter.wait([], timeout=30), 5) == {}


@given(st.lists(grants, min_size=1, max_size=20))
def test_a_group_of_answers_survives_encoding_for_one_consumer_group(answers_of: list[AttemptGrant]) -> None:
    same_group = [
        AttemptGrant(g.occurrence_id, g.lease_token, answers_of[0].consumer_group, g.result, g.reason)
        for g in answers_of
    ]
    key, value, _ = wire.encode_grant_group(same_group)
    assert decode_attempt_grants(value) == same_group and key == same_group[0].key
    assert decode_attempt_grants(same_group[0].encode()) == same_group[:1]
    if len({g.consumer_group for g in answers_of}) > 1:
        with pytest.raises(ValueError):
            wire.encode_grant_group(answers_of)


def test_a_malformed_group_of_answers_is_rejected_whole() -> None:
    good = AttemptGrant(OCC, TOKEN, "billing", "granted")
    data = orjson.loads(wire.encode_grant_group([good, good])[1])
    data["grants"][1]["result"] = "maybe"
    with pytest.raises(MalformedMessage, match=r"grants\[1\]: field 'result'"):
        decode_attempt_grants(orjson.dumps(data))
    with pytest.raises(MalformedMessage, match="1 to 1000"):
        decode_attempt_grants(orjson.dumps({"format": 2, "consumer_group": "billing", "grants": []}))


async def test_the_waiter_takes_a_group_of_answers_at_once() -> None:
    waiter = GrantWaiter("billing", NoOpMeter("test"))
    tokens = [uuid.uuid4() for _ in range(3)]
    waiter.expect(tokens)
    answered = [AttemptGrant(OCC, token, "billing", "granted") for token in tokens[:2]]
    waiter.receive(wire.encode_grant_group([AttemptGrant(OCC, tokens[2], "audit", "granted")])[1])  # not ours
    waiter.receive(wire.encode_grant_group([*answered, AttemptGrant(OCC, OTHER, "billing", "granted")])[1])
    waiter.receive(AttemptGrant(OCC, tokens[2], "billing", "refused", "fenced").encode())  # a single one too
    assert await waiter.wait(tokens, timeout=1) == {
        tokens[0]: answered[0],
        tokens[1]: answered[1],
        tokens[2]: AttemptGrant(OCC, tokens[2], "billing", "refused", "fenced"),
    }

"""The engine side of attempts against real PostgreSQL: events, fencing, retries, the reaper, dead letters.

Events are applied directly (``AttemptProcessor.apply_events``), without
Kafka; the manual clock is the engine's clock, so leases and backoffs move
only when a test advances it.
"""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest

from engine.control.dead_letters import list_dead_letters, replay_dead_letter
from engine.control.quotas import TenantQuotas
from engine.control.tenants import create_tenant
from engine.loops.attempt_ledger import Verdict
from engine.loops.attempt_processor import AttemptProcessor
from engine.loops.reaper import Reaper
from schemas import observability as obs
from schemas.attempt_events import AttemptEvent as Ev
from schemas.dead_letter_messages import decode_dead_occurrence
from schemas.errors import Conflict, NotFound
from schemas.messages import decode_occurrence
from schemas.topics import DEAD_LETTER_TOPIC, occurrence_topic, schedule_key
from tests.support.rows import attempt_rows, due_occurrence, occurrence_row, outbox_rows

TTL = 30.0


@pytest.fixture
def processor(pool, clock, telemetry):
    return AttemptProcessor(pool, clock=clock, rng=random.Random(7), **telemetry.instruments("engine"))


@pytest.fixture
def reaper(pool, clock, telemetry):
    return Reaper(pool, clock=clock, rng=random.Random(7), **telemetry.instruments("engine"))


async def apply(processor, *events):
    return await processor.apply_events(list(events))


async def state(pool, message):
    return (await occurrence_row(pool, message.occurrence_id))["state"]


async def test_started_then_succeeded(pool, clock, target, processor):
    message = await due_occurrence(pool, "acme", target, clock.now())
    token = uuid.uuid4()

    assert await apply(processor, Ev.started(message.occurrence_id, 1, token, TTL, "billing", "host:1")) == [
        Verdict.ACCEPTED
    ]
    row = await occurrence_row(pool, message.occurrence_id)
    assert (row["state"], row["attempt_count"], row["lease_token"]) == ("RUNNING", 1, token)
    assert row["lease_expires_at"] == clock.now() + timedelta(seconds=TTL)  # the engine's clock
    assert row["enqueued_at"] == clock.now()  # the start overtook the relay's mark

    clock.advance(5)
    assert await apply(processor, Ev.succeeded(message.occurrence_id, 1, token)) == [Verdict.ACCEPTED]
    row = await occurrence_row(pool, message.occurrence_id)
    # the success's write leaves the lease's columns out of its recordset (nulls are not sent): they become NULL
    assert (row["state"], row["lease_token"], row["lease_expires_at"], row["finished_at"]) == (
        "SUCCEEDED",
        None,
        None,
        clock.now(),
    )
    (attempt,) = await attempt_rows(pool, message.occurrence_id)
    assert (
        attempt["attempt_number"],
        attempt["lease_token"],
        attempt["result"],
        attempt["worker"],
        attempt["consumer_group"],
    ) == (1, token, "succeeded", "host:1", "billing")


async def test_transient_failures_are_retried_with_backoff_until_max_attempts_then_dead(
    pool, clock, target, processor, telemetry
):
    message = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=3, base=2.0, cap=60.0)
    tokens = [uuid.uuid4() for _ in range(3)]
    for attempt, token in enumerate(tokens, start=1):
        await apply(
            processor,
            Ev.started(message.occurrence_id, attempt, token, TTL),
            Ev.failed(message.occurrence_id, attempt, token, "TimeoutError", f"slow #{attempt}"),
        )
        if attempt < 3:
            assert await state(pool, message) == "RETRY_WAIT"
            retry = (await outbox_rows(pool, message.occurrence_id))[-1]
            sent = decode_occurrence(retry["message"])
            # Same occurrence, next delivery number, due within the full-jitter window.
            assert (sent.occurrence_id, sent.attempt, retry["topic"]) == (
                message.occurrence_id,
                attempt + 1,
                occurrence_topic(target),
            )
            ceiling = timedelta(seconds=2.0 * 2 ** (attempt - 1))
            assert clock.now() <= retry["available_at"] <= clock.now() + ceiling
            assert sent.available_at == retry["available_at"] and sent.payload == message.payload
    row = await occurrence_row(pool, message.occurrence_id)
    assert (row["state"], row["dead_reason"], row["last_error_class"], row["attempt_count"]) == (
        "DEAD",
        "max_attempts",
        "TimeoutError",
        3,
    )
    attempts = await attempt_rows(pool, message.occurrence_id)
    assert [(a["attempt_number"], a["result"]) for a in attempts] == [(1, "failed"), (2, "failed"), (3, "failed")]
    assert len({a["lease_token"] for a in attempts}) == 3
    dead = [r for r in await outbox_rows(pool, message.occurrence_id) if r["topic"] == DEAD_LETTER_TOPIC]
    (record,) = [decode_dead_occurrence(r["message"]) for r in dead]
    assert (record.occurrence.occurrence_id, record.attempts, record.reason, record.error_message) == (
        message.occurrence_id,
        3,
        "max_attempts",
        "slow #3",
    )
    assert sum(p.value for p in telemetry.points(obs.RETRIES)) == 2
    assert {dict(p.attributes)["result"]: p.value for p in telemetry.points(obs.ATTEMPTS)} == {"failed": 3}


async def test_a_permanent_error_is_dead_after_one_attempt_listed_and_replayed_with_the_same_id(
    pool, clock, target, processor
):
    message = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=5)
    other = await due_occurrence(pool, "globex", target, clock.now(), max_attempts=5)
    for occ in (message, other):
        token = uuid.uuid4()
        await apply(
            processor,
            Ev.started(occ.occurrence_id, 1, token, TTL),
            Ev.failed(occ.occurrence_id, 1, token, "InvoiceRejected", "no such customer", permanent=True),
        )
    row = await occurrence_row(pool, message.occurrence_id)
    assert (row["state"], row["dead_reason"], row["attempt_count"]) == ("DEAD", "permanent_error", 1)

    page = await list_dead_letters(pool, "acme")
    assert [item["occurrence_id"] for item in page["items"]] == [str(message.occurrence_id)]
    assert page["items"][0] | {"died_at": None} == {
        "occurrence_id": str(message.occurrence_id),
        "schedule_id": str(message.schedule_id),
        "schedule_version": 1,
        "tenant_id": "acme",
        "target": target,
        "scheduled_for": "2026-11-29T10:00:00Z",
        "attempts": 1,
        "replays": 0,
        "reason": "permanent_error",
        "error_class": "InvoiceRejected",
        "error_message": "no such customer",
        "died_at": None,
    }
    assert len((await list_dead_letters(pool, None))["items"]) == 2  # operators see every tenant
    with pytest.raises(NotFound):
        await replay_dead_letter(pool, "globex", message.occurrence_id, clock)  # another tenant's

    clock.advance(60)
    replayed = await replay_dead_letter(pool, "acme", message.occurrence_id, clock)
    assert (replayed["occurrence_id"], replayed["state"], replayed["attempt"]) == (
        str(message.occurrence_id),
        "RETRY_WAIT",
        2,
    )
    resent = (await outbox_rows(pool, message.occurrence_id))[-1]
    resend = decode_occurrence(resent["message"])
    assert (resend.occurrence_id, resend.attempt, resend.available_at) == (message.occurrence_id, 2, clock.now())
    # Keyed like every message of its schedule: the replay lands on the schedule's partition, in its order.
    assert resent["message_key"] == schedule_key(message.schedule_id)
    assert (await list_dead_letters(pool, "acme"))["items"] == []
    with pytest.raises(Conflict):
        await replay_dead_letter(pool, "acme", message.occurrence_id, clock)  # not DEAD any more

    # The replay grants a fresh count of attempts: a transient failure now retries.
    token = uuid.uuid4()
    await apply(
        processor,
        Ev.started(message.occurrence_id, 2, token, TTL),
        Ev.failed(message.occurrence_id, 2, token, "TimeoutError", "slow"),
    )
    assert await state(pool, message) == "RETRY_WAIT"


async def test_paging_through_dead_letters(pool, clock, target, processor):
    for _ in range(5):
        occ = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=1)
        token = uuid.uuid4()
        await apply(
            processor, Ev.started(occ.occurrence_id, 1, token, TTL), Ev.failed(occ.occurrence_id, 1, token, "E", "x")
        )
        clock.advance(1)
    first = await list_dead_letters(pool, "acme", limit=3)
    second = await list_dead_letters(pool, "acme", limit=3, cursor=first["next_cursor"])
    assert len(first["items"]) == 3 and len(second["items"]) == 2 and second["next_cursor"] is None
    assert len({i["occurrence_id"] for i in first["items"] + second["items"]}) == 5


async def test_events_with_a_stale_lease_token_are_fenced_and_counted(
    pool, clock, target, processor, reaper, telemetry
):
    message = await due_occurrence(pool, "acme", target, clock.now())
    old, new = uuid.uuid4(), uuid.uuid4()
    await apply(processor, Ev.started(message.occurrence_id, 1, old, TTL))
    clock.advance(TTL + 1)
    assert await reaper.run_once() == 1  # the lease expired: retried
    assert await state(pool, message) == "RETRY_WAIT"

    late = await apply(
        processor,
        Ev.heartbeat(message.occurrence_id, 1, old, TTL),
        Ev.succeeded(message.occurrence_id, 1, old),
        Ev.failed(message.occurrence_id, 1, old, "E", "late"),
        Ev.started(message.occurrence_id, 1, uuid.uuid4(), TTL),
    )  # a start after the reaper moved on
    assert late == [Verdict.FENCED] * 4
    assert await state(pool, message) == "RETRY_WAIT"
    (first,) = await attempt_rows(pool, message.occurrence_id)
    assert (first["result"], first["error_class"]) == ("timed_out", "LeaseExpired")

    await apply(processor, Ev.started(message.occurrence_id, 2, new, TTL))
    assert await apply(processor, Ev.succeeded(message.occurrence_id, 1, old)) == [Verdict.FENCED]
    assert await apply(processor, Ev.succeeded(message.occurrence_id, 2, new)) == [Verdict.ACCEPTED]
    assert processor.stats[Verdict.FENCED] == 5
    assert {dict(p.attributes)["event"]: p.value for p in telemetry.points(obs.FENCED_EVENTS)} == {
        "heartbeat": 1,
        "succeeded": 2,
        "failed": 1,
        "started": 1,
    }


async def test_redelivered_events_are_harmless_duplicates(pool, clock, target, processor):
    message = await due_occurrence(pool, "acme", target, clock.now())
    token = uuid.uuid4()
    started = Ev.started(message.occurrence_id, 1, token, TTL)
    succeeded = Ev.succeeded(message.occurrence_id, 1, token)
    assert await apply(processor, started, started, succeeded, succeeded) == [
        Verdict.ACCEPTED,
        Verdict.DUPLICATE,
        Verdict.ACCEPTED,
        Verdict.DUPLICATE,
    ]
    assert len(await attempt_rows(pool, message.occurrence_id)) == 1
    assert processor.stats[Verdict.FENCED] == 0


async def test_a_redelivery_of_the_same_attempt_takes_the_lease_over(pool, clock, target, processor):
    """A consumer died before its offset commit; the next owner starts the same delivery with a new token."""
    message = await due_occurrence(pool, "acme", target, clock.now())
    dead_worker, next_owner = uuid.uuid4(), uuid.uuid4()
    await apply(processor, Ev.started(message.occurrence_id, 1, dead_worker, TTL))
    assert await apply(processor, Ev.started(message.occurrence_id, 1, next_owner, TTL)) == [Verdict.ACCEPTED]
    row = await occurrence_row(pool, message.occurrence_id)
    assert (row["state"], row["attempt_count"], row["lease_token"]) == ("RUNNING", 1, next_owner)
    assert await apply(processor, Ev.succeeded(message.occurrence_id, 1, dead_worker)) == [Verdict.FENCED]
    assert await apply(processor, Ev.succeeded(message.occurrence_id, 1, next_owner)) == [Verdict.ACCEPTED]
    attempts = await attempt_rows(pool, message.occurrence_id)
    assert [(a["lease_token"], a["result"]) for a in attempts] == [(dead_worker, "fenced"), (next_owner, "succeeded")]


async def test_already_applied_settles_the_occurrence_whatever_the_engine_thought(pool, clock, target, processor):
    running = await due_occurrence(pool, "acme", target, clock.now())
    waiting = await due_occurrence(pool, "acme", target, clock.now())
    dead = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=1)
    tokens = {occ.occurrence_id: uuid.uuid4() for occ in (running, waiting, dead)}
    await apply(processor, *[Ev.started(i, 1, t, TTL) for i, t in tokens.items()])
    await apply(
        processor,
        Ev.failed(waiting.occurrence_id, 1, tokens[waiting.occurrence_id], "E", "x"),
        Ev.failed(dead.occurrence_id, 1, tokens[dead.occurrence_id], "E", "x"),
    )

    # The worker that committed the effect died before reporting; the next delivery found its dedupe row.
    verdicts = await apply(processor, *[Ev.already_applied(i, 2, t) for i, t in tokens.items()])
    assert verdicts == [Verdict.ACCEPTED] * 3
    for occ in (running, waiting, dead):
        assert await state(pool, occ) == "SUCCEEDED"
    (attempt,) = await attempt_rows(pool, running.occurrence_id)
    assert attempt["result"] == "succeeded"  # the worker that applied it, by its token
    pending = [r for r in await outbox_rows(pool, waiting.occurrence_id) if r["sent_at"] is None]
    assert all(r["discarded_at"] is not None for r in pending)  # the waiting retry is not sent any more
    assert await apply(processor, Ev.already_applied(running.occurrence_id, 2, None)) == [Verdict.DUPLICATE]


async def test_skips_of_obsolete_versions_cancel_and_canceled_occurrences_stay_canceled(pool, clock, target, processor):
    obsolete = await due_occurrence(pool, "acme", target, clock.now())
    current = await due_occurrence(pool, "acme", target, clock.now())
    await pool.execute("UPDATE schedules SET version = 2 WHERE schedule_id = $1", obsolete.schedule_id)
    verdicts = await apply(
        processor,
        Ev.canceled(obsolete.occurrence_id, 1, "stale_version"),
        Ev.canceled(obsolete.occurrence_id, 1, "stale_version"),
        Ev.canceled(current.occurrence_id, 1, "stale_version"),
    )
    assert verdicts == [Verdict.ACCEPTED, Verdict.IGNORED, Verdict.IGNORED]
    assert await state(pool, obsolete) == "CANCELED"
    assert await state(pool, current) == "SCHEDULED"  # the engine does not agree: unchanged
    # Any event about an already CANCELED occurrence is handled without error.
    token = uuid.uuid4()
    assert await apply(
        processor,
        Ev.started(obsolete.occurrence_id, 1, token, TTL),
        Ev.succeeded(obsolete.occurrence_id, 1, token),
        Ev.already_applied(obsolete.occurrence_id, 1, token),
    ) == [Verdict.FENCED, Verdict.FENCED, Verdict.IGNORED]
    assert await state(pool, obsolete) == "CANCELED"


async def test_a_cooperatively_canceled_attempt_cancels_and_a_failure_after_an_update_does_not_retry(
    pool, clock, target, processor
):
    canceled, updated = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(2)]
    a, b = uuid.uuid4(), uuid.uuid4()
    await apply(processor, Ev.started(canceled.occurrence_id, 1, a, TTL), Ev.started(updated.occurrence_id, 1, b, TTL))
    await pool.execute(
        "UPDATE schedules SET version = 2, state = 'canceled' WHERE schedule_id = $1", canceled.schedule_id
    )
    await pool.execute("UPDATE schedules SET version = 2 WHERE schedule_id = $1", updated.schedule_id)
    await apply(
        processor,
        Ev.canceled(canceled.occurrence_id, 1, "cooperative", a),
        Ev.failed(updated.occurrence_id, 1, b, "E", "x"),
    )
    assert await state(pool, canceled) == "CANCELED"
    assert await state(pool, updated) == "CANCELED"  # its version is obsolete: no retry for consumers to skip
    assert [r["result"] for r in await attempt_rows(pool, canceled.occurrence_id)] == ["canceled"]


async def test_the_tenant_retry_budget_bounds_retries(pool, clock, target, processor):
    await create_tenant(pool, "frugal", TenantQuotas(retry_budget_per_hour=2))
    occurrences = [await due_occurrence(pool, "frugal", target, clock.now(), max_attempts=10) for _ in range(3)]
    for occ in occurrences:
        token = uuid.uuid4()
        await apply(
            processor, Ev.started(occ.occurrence_id, 1, token, TTL), Ev.failed(occ.occurrence_id, 1, token, "E", "x")
        )
    rows = [await occurrence_row(pool, o.occurrence_id) for o in occurrences]
    assert [(r["state"], r["dead_reason"]) for r in rows] == [
        ("RETRY_WAIT", None),
        ("RETRY_WAIT", None),
        ("DEAD", "retry_budget"),
    ]
    # The next clock hour has a fresh budget.
    clock.advance(timedelta(hours=1))
    late = await due_occurrence(pool, "frugal", target, clock.now(), max_attempts=10)
    token = uuid.uuid4()
    await apply(
        processor, Ev.started(late.occurrence_id, 1, token, TTL), Ev.failed(late.occurrence_id, 1, token, "E", "x")
    )
    assert await state(pool, late) == "RETRY_WAIT"


async def test_no_retry_after_the_occurrence_deadline(pool, clock, target, processor):
    message = await due_occurrence(
        pool, "acme", target, clock.now(), max_attempts=10, base=60.0, cap=60.0, deadline_s=30
    )
    token = uuid.uuid4()
    clock.advance(31)
    await apply(
        processor,
        Ev.started(message.occurrence_id, 1, token, TTL),
        Ev.failed(message.occurrence_id, 1, token, "E", "x"),
    )
    assert (await occurrence_row(pool, message.occurrence_id))["dead_reason"] == "deadline"


async def test_the_reaper_times_out_only_expired_leases_and_heartbeats_extend_them(
    pool, clock, target, processor, reaper, telemetry
):
    message = await due_occurrence(pool, "acme", target, clock.now(), max_attempts=2)
    token = uuid.uuid4()
    await apply(processor, Ev.started(message.occurrence_id, 1, token, TTL))
    clock.advance(TTL - 1)
    assert await reaper.run_once() == 0
    await apply(processor, Ev.heartbeat(message.occurrence_id, 1, token, TTL))
    clock.advance(TTL - 1)
    assert await reaper.run_once() == 0  # the heartbeat moved the lease
    clock.advance(2)
    assert await reaper.run_once() == 1
    assert await state(pool, message) == "RETRY_WAIT"

    second = uuid.uuid4()
    await apply(processor, Ev.started(message.occurrence_id, 2, second, TTL))
    clock.advance(TTL + 1)
    assert await reaper.run_once() == 1
    row = await occurrence_row(pool, message.occurrence_id)
    assert (row["state"], row["dead_reason"], row["last_error_class"]) == ("DEAD", "max_attempts", "LeaseExpired")
    assert [a["result"] for a in await attempt_rows(pool, message.occurrence_id)] == ["timed_out", "timed_out"]
    assert await reaper.housekeeping() == 1
    assert [p.value for p in telemetry.points(obs.DLQ_SIZE)] == [1]
    assert sum(p.value for p in telemetry.points(obs.LEASE_TIMEOUTS)) == 2


async def test_events_for_unknown_occurrences_are_ignored(processor):
    assert await apply(processor, Ev.succeeded(uuid.uuid4(), 1, uuid.uuid4())) == [Verdict.UNKNOWN]

"""One key's messages leave the outbox in the order they were written, with several relays and retries.

Compaction keeps a key's last record (docs/broker.md): if two relays published a
schedule's version 3 before its version 2, the cleaner would keep version 2 and
a consumer app started later would run a canceled schedule. So the outbox hands
out a message of no occurrence only when no older unsent message with the same
topic and key exists.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from relay.outbox import OutboxStore
from schemas.queries import QUERIES
from schemas.topics import SCHEDULE_STATES_TOPIC
from tests.support.rows import due_occurrence

TTL = timedelta(seconds=30)


async def queue(pool, key: bytes, message: bytes, clock) -> None:
    await pool.execute(
        *QUERIES.insert_topic_message(
            tenant_id="acme", topic=SCHEDULE_STATES_TOPIC, message_key=key, message=message, now=clock.now()
        )
    )


def messages(claim) -> set[bytes]:
    return {row.message for row in claim.rows}


async def test_two_relays_claim_one_keys_states_in_version_order(pool, clock):
    for version in (1, 2, 3):
        await queue(pool, b"schedule-a", f"a{version}".encode(), clock)
    await queue(pool, b"schedule-b", b"b1", clock)
    store = OutboxStore(pool, clock)

    first, second = await asyncio.gather(store.claim(100, TTL), store.claim(100, TTL))
    # Only each key's oldest unsent message is handed out, to one of the two relays.
    assert messages(first) | messages(second) == {b"a1", b"b1"}
    assert not messages(first) & messages(second)
    assert messages(await store.claim(100, TTL)) == set()  # a1 is claimed, not sent: a2 waits

    holder = first if b"a1" in messages(first) else second
    a1 = next(row.id for row in holder.rows if row.message == b"a1")
    await store.mark_sent(holder.token, [a1])
    retried = await store.claim(100, TTL)
    assert messages(retried) == {b"a2"}
    # A failed publish gives a2 back: the next claim retries a2, never a3 first.
    await store.release(retried.token, [row.id for row in retried.rows], "broker unavailable")
    again = await store.claim(100, TTL)
    assert messages(again) == {b"a2"}
    await store.mark_sent(again.token, [row.id for row in again.rows])
    assert messages(await store.claim(100, TTL)) == {b"a3"}


async def test_an_expired_claim_of_an_older_state_still_comes_first(pool, clock):
    for version in (1, 2):
        await queue(pool, b"schedule-c", f"c{version}".encode(), clock)
    store = OutboxStore(pool, clock)
    paused = await store.claim(100, TTL)  # a relay claims c1, then is paused past its claim
    assert messages(paused) == {b"c1"}
    clock.advance(TTL + timedelta(seconds=1))
    assert messages(await store.claim(100, TTL)) == {b"c1"}  # re-claimed by the next relay, c2 still waits


async def test_occurrence_deliveries_are_not_held_back_by_keyed_ordering(pool, clock, acme, target):
    await queue(pool, b"schedule-d", b"d1", clock)
    await queue(pool, b"schedule-d", b"d2", clock)
    await due_occurrence(pool, "acme", target, clock.now())
    await due_occurrence(pool, "acme", target, clock.now() + timedelta(seconds=1))
    clock.advance(timedelta(seconds=2))
    claim = await OutboxStore(pool, clock).claim(100, TTL)
    assert sum(row.occurrence_id is not None for row in claim.rows) == 2
    assert {row.message for row in claim.rows if row.occurrence_id is None} == {b"d1"}

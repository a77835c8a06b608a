"""The consumer runtime's target-binding view on a real broker: what it costs to say yes and to say no.

A consumer app checks every occurrence record against the view. Saying yes must
cost nothing (an unbound target used to cost a broker round trip per record);
saying no re-reads the topic only when no read to its end began after the
record was appended, and a grant published before that read turns the no into
a yes.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer

from consumers.target_bindings import TargetBindingView
from schemas.target_bindings import TargetBindingMessage
from schemas.topics import TARGET_BINDINGS_TOPIC, create_missing_topics
from tests.support.waiting import wait_for

NOW = datetime(2026, 12, 1, tzinfo=UTC)


async def publish(bootstrap: str, *bindings: TargetBindingMessage) -> None:
    await create_missing_topics(bootstrap, [TARGET_BINDINGS_TOPIC])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for binding in bindings:
            await producer.send_and_wait(TARGET_BINDINGS_TOPIC, binding.encode(), key=binding.key)
    finally:
        await producer.stop()


async def test_yes_costs_no_read_and_no_rereads_only_for_records_newer_than_the_last_read(kafka_bootstrap, target):
    await publish(kafka_bootstrap, TargetBindingMessage(target, ("acme",), 1, NOW))
    view = TargetBindingView(freshness_margin_ms=1_000)
    await view.start(kafka_bootstrap, catch_up_timeout=20)
    stop = asyncio.Event()
    follower = asyncio.create_task(view.follow(stop))
    try:
        assert view.verdict(target, "acme") is True
        unbound = f"{target}-unbound"
        assert all([await view.allows(unbound, "globex", wait=5) for _ in range(200)])
        assert all([await view.allows(target, "acme", wait=5) for _ in range(200)])
        assert view.catch_ups == 0

        # A backlog of refused records appended well before the view's last read: refused without a re-read.
        long_ago = int(time.time() * 1000) - 60_000
        refused = [await view.allows(target, "globex", wait=5, appended_at_ms=long_ago) for _ in range(200)]
        assert not any(refused) and view.catch_ups == 0
        # A record without an append time, or appended after the last read began, is re-checked first.
        assert not await view.allows(target, "globex", wait=5)
        assert view.catch_ups == 1

        # A grant on the topic before the refused record's re-read turns the no into a yes.
        await publish(kafka_bootstrap, TargetBindingMessage(target, ("acme", "globex"), 2, NOW))
        # (The follower may have read it already; either way the answer is yes.)
        just_now = int(time.time() * 1000)
        assert await view.allows(target, "globex", wait=10, appended_at_ms=just_now)
        # A revocation reaches the view through its follower (a yes is not re-checked; it is as fresh as
        # the follower), and from then on the tenant's records are refused again: the newest version wins.
        await publish(kafka_bootstrap, TargetBindingMessage(target, ("acme",), 3, NOW))
        await wait_for(lambda: view.verdict(target, "globex") is False, 10)
        assert not await view.allows(target, "globex", wait=10, appended_at_ms=long_ago)
    finally:
        stop.set()
        await follower
        await view.stop()


async def test_concurrent_refusals_share_one_read(kafka_bootstrap, target):
    await publish(kafka_bootstrap, TargetBindingMessage(target, ("acme",), 1, NOW))
    view = TargetBindingView()
    await view.start(kafka_bootstrap, catch_up_timeout=20)
    stop = asyncio.Event()
    follower = asyncio.create_task(view.follow(stop))
    try:
        answers = await asyncio.gather(*(view.allows(target, "globex", wait=5) for _ in range(50)))
        assert not any(answers)
        assert view.catch_ups == 1
    finally:
        stop.set()
        await follower
        await view.stop()

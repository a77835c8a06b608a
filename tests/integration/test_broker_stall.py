"""The broker stops answering in the middle of a page (SIGSTOP past the publisher's acknowledgement timeout).

TESTING.md: "Broker connection cut or slowed mid-produce: treat a timeout as 'unknown outcome', keep the row
unsent, retry." The ahead-lane relay hands a page of a burst to librdkafka, the broker (a tansu of this test's
own, so pausing it stalls no other test) is stopped right then and resumed past ``ack_timeout``: the page's
records time out, outcome unknown. The relay must neither move its cursors past them nor log them, and
publish them again once the broker is back: every occurrence reaches the topic (a copy more is allowed, a
loss is not), and every one is logged and settled ENQUEUED exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from engine.cli.embedded.tansu import EmbeddedKafka
from engine.loops.dispatch_settler import DispatchSettler
from engine.loops.materializer import Materializer, MaterializerConfig
from relay.ahead_relay import AheadRelayHooks
from relay.librdkafka_publisher import LibrdkafkaConfig, LibrdkafkaPublisher
from schemas.messages import decode_occurrence
from schemas.topics import occurrence_topic
from tests.integration.test_data_plane import AT, create_once, owning, relay_of
from tests.support.kafka import read_topic

BURST = 40
ACK_TIMEOUT = 2.0
STALL = 5.0  # past ACK_TIMEOUT: every record of the stalled page times out


@pytest.mark.on_broker("tansu")
async def test_a_broker_stalled_past_the_ack_timeout_mid_page_loses_nothing_and_logs_each_row_once(
    pool, clock, target, acme, tmp_path
):
    kafka = EmbeddedKafka(tmp_path / "tansu.log")
    bootstrap = await asyncio.to_thread(kafka.start)
    publisher = LibrdkafkaPublisher(LibrdkafkaConfig(bootstrap, partitions=4, ack_timeout=ACK_TIMEOUT))
    await publisher.start()
    try:
        await publisher.ensure_topics([occurrence_topic(target)])  # a stall must hit the produce, not the create
        for _ in range(BURST):
            await create_once(pool, clock, target)
        _, ownership = await owning(pool, clock)
        assert (await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()).ahead == BURST
        stalled: list[float] = []

        async def stall_the_broker() -> None:  # the page is read, nothing of it published yet
            if not stalled:
                assert kafka.pid is not None
                os.kill(kafka.pid, signal.SIGSTOP)
                stalled.append(asyncio.get_running_loop().time())
                asyncio.get_running_loop().call_later(STALL, os.kill, kafka.pid, signal.SIGCONT)

        relay = relay_of(pool, publisher, ownership, clock, hooks=AheadRelayHooks(after_read=stall_the_broker))
        clock.set(AT)
        first = await asyncio.wait_for(relay.run_once(), 30)
        assert stalled and first.failed > 0 and first.published < BURST  # the stalled records timed out
        assert await pool.fetchval("SELECT coalesce(sum(rows), 0) FROM dispatch_log") == first.published
        published = first.published
        for _ in range(20):  # the relay's loop: retry from the cursor until the broker takes them
            if published >= BURST:
                break
            await asyncio.sleep(1.0)
            published += (await asyncio.wait_for(relay.run_once(), 30)).published
        assert published == BURST
        records = await read_topic(bootstrap, occurrence_topic(target), expected=BURST)
        seen = [decode_occurrence(r.value).occurrence_id for r in records]
        expected = {r["occurrence_id"] for r in await pool.fetch("SELECT occurrence_id FROM occurrences")}
        assert set(seen) == expected  # nothing lost (a copy more than once would be allowed)
        assert await pool.fetchval("SELECT sum(rows) FROM dispatch_log") == BURST  # each row logged once
        settled = await DispatchSettler(pool, clock=clock).run_once()
        assert settled.occurrences == BURST
        assert await pool.fetchval("SELECT count(*) FROM occurrences WHERE state = 'ENQUEUED'") == BURST
        assert await pool.fetchval("SELECT count(*) FROM dispatch_queue") == 0
    finally:
        if kafka.pid is not None:
            os.kill(kafka.pid, signal.SIGCONT)
        await publisher.stop()
        await asyncio.to_thread(kafka.stop)

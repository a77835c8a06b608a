"""Offset commits racing a rebalance: the app never crashes and never commits for a partition it gave up.

Found by the fault-injection run of issue 13: a consumer app paused past its session timeout crashed with
``KeyError`` in the offset commit on the rebalance that followed, because the partition was revoked while
the commit was awaited. The race, exactly: the group coordinator revokes the partitions (the listener
commits what finished, then drops the lanes) while the fetch loop's own commit of the same partitions is
waiting behind it.

These tests drive that interleaving with the app's real commit and revoke paths against the real broker.
"""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import TopicPartition

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from tests.support.waiting import wait_for


def idle_app(consumer_db: str, kafka_bootstrap: str, target: str) -> ConsumerApp:
    app = ConsumerApp(
        ConsumerConfig(
            f"rebalance-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            attempt_barrier=False,  # no attempt processor runs here: nobody answers started
            session_timeout=2.0,
            heartbeat_interval=0.4,
            state_catch_up_timeout=2.0,
        )
    )

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn) -> None:  # never called: nothing is produced
        raise AssertionError("no occurrence was produced")

    return app


def finished_up_to(app: ConsumerApp, tp: TopicPartition, offset: int) -> None:
    """As if the messages below ``offset`` had been fetched and finished (applied and reported)."""
    lane = app._lanes[tp]
    for n in range(offset):
        lane.offsets.add(n)
        lane.offsets.finish(n)


async def test_a_commit_waiting_behind_a_revocation_neither_crashes_nor_commits_the_revoked_partition(
    consumer_db, kafka_bootstrap, target
):
    app = idle_app(consumer_db, kafka_bootstrap, target)
    await app.start()
    try:
        await wait_for(lambda: app._lanes, timeout=20)  # the group assigned our partitions
        assert app._consumer is not None
        tp = sorted(app._lanes, key=lambda t: t.partition)[0]
        finished_up_to(app, tp, 1)

        async def fetch_loop_commit() -> None:
            # The fetch loop finishes one more message and commits while the revocation is under way.
            finished_up_to(app, tp, 2)
            await app._commit()

        await asyncio.gather(app._revoke(list(app._lanes)), fetch_loop_commit())

        # The revocation committed what had finished while the partition was ours; nothing after it.
        assert await app._consumer.committed(tp) == 1
        assert tp not in app._lanes
    finally:
        await app.stop()

"""`chronoq status` against a real database and broker."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaProducer, TopicPartition

from engine.control.consumer_lag import read_consumer_lag
from engine.control.schedules import ControlPlane
from engine.control.status import engine_status, status_lines
from engine.loops.materializer import Materializer, MaterializerConfig
from schemas.topics import create_missing_topics
from tests.support.kafka import commit_offsets

UTC = UTC


async def test_status_reports_backlogs_in_flight_and_the_last_reconcile(pool, acme, clock, target, kafka_bootstrap):
    from engine.control.reconciler import Window, reconcile

    control = ControlPlane(pool, clock)
    for _ in range(3):
        await control.create_schedule("acme", {"kind": "cron", "expression": "* * * * *", "target": target})
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    clock.advance(timedelta(seconds=45))
    await materializer.run_once()  # 10:01 materialized for all three
    clock.advance(timedelta(minutes=3))  # then the engine stops: cursors fall behind
    await pool.execute(
        "UPDATE occurrences SET state = 'DEAD' WHERE occurrence_id = (SELECT occurrence_id FROM occurrences LIMIT 1)"
    )
    status = await engine_status(pool, None, clock=clock)
    assert status["as_of"] == "2026-11-29T10:03:45Z"
    assert status["shards"] == {"leases": 256, "unowned": 256, "expired": 0, "owners": []}
    assert status["schedules"] == {"active": 3}
    assert status["materialization"]["due_by_age"] == {"over_1h": 0, "5m_to_1h": 0, "1m_to_5m": 3, "under_1m": 0}
    assert status["materialization"]["lag_s"] == 105.0  # cursor 10:02:00, now 10:03:45
    # Three occurrences (10:01), the three schedules' state messages and the target's binding announcement
    # (10:00, the first schedule registered the target to acme), all unsent: no relay ran.
    assert status["outbox"]["backlog"] == 7 and status["outbox"]["oldest_due_age_s"] == 225.0
    assert status["relay"]["sent_60s"] == 0
    assert status["dlq"] == {"size": 1}
    assert status["last_reconcile"] is None
    assert status["consumers"] == {"note": "no broker configured"}

    report = await reconcile(
        pool, Window(datetime(2026, 11, 29, 10, tzinfo=UTC), datetime(2026, 11, 29, 10, 3, tzinfo=UTC)), clock=clock
    )
    status = await engine_status(pool, None, clock=clock)
    assert status["last_reconcile"]["run_id"] == report.run_id
    assert status["last_reconcile"]["clean"] is True
    assert status["last_reconcile"]["counts"]["pending"] == 3  # 10:01 exists, 10:02 not yet (10:03 is outside)
    text = "\n".join(status_lines(status))
    assert "256 leases, 256 unowned" in text and "last reconcile #" in text and "CLEAN" in text


async def test_shard_leases_and_nodes_are_reported(pool, clock):
    now = clock.now()
    await pool.execute(
        "INSERT INTO engine_nodes (node_id, started_at, heartbeat_at, expires_at)"
        " VALUES ('node-a', $1, $2, $3), ('node-b', $1, $4, $5)",
        now - timedelta(minutes=5),
        now - timedelta(seconds=1),
        now + timedelta(seconds=9),
        now - timedelta(seconds=30),
        now - timedelta(seconds=20),
    )
    # Of the 256 leases: node-a holds shards 0-2 (epoch 7), the rest were never owned (expiry -infinity).
    await pool.executemany(
        "UPDATE shard_leases SET owner = $2, epoch = 7, expires_at = $3 WHERE shard = $1",
        [(s, "node-a", now + timedelta(seconds=s + 1)) for s in range(3)],
    )
    status = await engine_status(pool, None, clock=clock)
    assert status["nodes"]["nodes"] == [
        {"node": "node-a", "heartbeat_age_s": 1.0, "expires_in_s": 9.0, "live": True},
        {"node": "node-b", "heartbeat_age_s": 30.0, "expires_in_s": -20.0, "live": False},
    ]
    assert status["shards"] == {
        "leases": 256,
        "unowned": 253,
        "expired": 0,
        "owners": [{"owner": "node-a", "shards": 3, "soonest_expiry_in_s": 1.0, "max_epoch": 7}],
    }


async def test_consumer_lag_per_group_from_committed_offsets(kafka_bootstrap, pool):
    topic = f"test.lag.{uuid.uuid4().hex[:8]}"
    group = f"lag-{uuid.uuid4().hex[:8]}"
    await create_missing_topics(kafka_bootstrap, [topic], partitions=2)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for n in range(10):
            await producer.send_and_wait(topic, b"x", partition=n % 2)
    finally:
        await producer.stop()
    await commit_offsets(kafka_bootstrap, group, {TopicPartition(topic, 0): 2, TopicPartition(topic, 1): 5})
    lags = [lag for lag in await read_consumer_lag(kafka_bootstrap, [group]) if lag.topic == topic]
    assert [(lag.group, lag.partitions, lag.lag) for lag in lags] == [(group, 2, 3 + 0)]  # 5-2 and 5-5
    # Every group of the suite's shared broker is read: under load that takes longer than the CLI's 5 s.
    status = await engine_status(pool, kafka_bootstrap, kafka_timeout=60.0)
    assert "error" not in status["consumers"], status["consumers"]
    assert {"group": group, "topic": topic, "partitions": 2, "lag": 3} in status["consumers"]["groups"]

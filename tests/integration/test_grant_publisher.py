"""The engine's answers to ``started`` (engine/loops/attempt_grants.py) go as Kafka batches: however many
there are, every answer reaches its consumer group's partition exactly once, in the order it was given."""

from __future__ import annotations

import uuid

from opentelemetry.metrics import NoOpMeter

from engine.loops.attempt_grants import GrantPublisher
from schemas.attempt_grants import AttemptGrant, decode_attempt_grant, grant_partition
from schemas.topics import ATTEMPT_GRANTS_TOPIC, create_missing_topics, topic_partitions
from tests.support.kafka import read_to_end


async def test_many_answers_for_two_groups_arrive_once_each_in_order_on_their_groups_partitions(kafka_bootstrap):
    await create_missing_topics(kafka_bootstrap, [ATTEMPT_GRANTS_TOPIC])
    partitions = len(await topic_partitions(kafka_bootstrap, ATTEMPT_GRANTS_TOPIC))
    run = uuid.uuid4().hex[:8]
    groups = [f"answers-{run}-a", f"answers-{run}-b"]
    # Far more than one producer batch holds (16 kB, about 60 answers), with refusals among them.
    grants = [
        AttemptGrant(uuid.uuid4(), uuid.uuid4(), groups[i % 2], "granted")
        if i % 7
        else AttemptGrant(uuid.uuid4(), uuid.uuid4(), groups[i % 2], "refused", "canceled")
        for i in range(900)
    ]
    publisher = GrantPublisher(kafka_bootstrap, NoOpMeter("test"))
    await publisher.start()
    try:
        await publisher.send(grants[:450])
        await publisher.send(grants[450:])
    finally:
        await publisher.stop()
    assert publisher.sent == 900
    records = [r for r in await read_to_end(kafka_bootstrap, ATTEMPT_GRANTS_TOPIC) if run.encode() in (r.value or b"")]
    for group in groups:
        mine = [r for r in records if decode_attempt_grant(r.value).consumer_group == group]
        assert {r.partition for r in mine} == {grant_partition(group, partitions)}
        assert [decode_attempt_grant(r.value) for r in sorted(mine, key=lambda r: r.offset)] == [
            g for g in grants if g.consumer_group == group
        ]
        assert all(r.key == str(decode_attempt_grant(r.value).occurrence_id).encode() for r in mine)

"""The attempt processor when its database backend dies mid-transaction: every fetched event is applied.

Found by the fault-injection run of issue 13: when one partition's batch failed (its backend was
terminated in the middle of the transaction), the loop discarded the records already fetched for the
other partitions and rewound only the failing one. The fetch position had moved past the discarded
records, so they were never applied and their occurrences stayed ENQUEUED for good.

The fault here is real: a trigger on ``attempts`` terminates its own backend (``pg_terminate_backend``)
the first time an attempt is recorded, in the middle of the processor's transaction. A sequence, not a
table, remembers that it fired: sequences are not rolled back with the transaction.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from engine.loops.attempt_processor import AttemptProcessor, AttemptProcessorConfig
from schemas import observability as obs
from schemas.attempt_events import AttemptEvent, encode_group
from schemas.connections import create_pool
from schemas.error_classification import is_transient
from schemas.topics import ATTEMPTS_TOPIC, create_missing_topics
from tests.support.rows import due_occurrence
from tests.support.telemetry import Telemetry
from tests.support.waiting import wait_for

TERMINATE_ONCE = """
CREATE SEQUENCE fault_fired;
CREATE FUNCTION terminate_own_backend_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('fault_fired') = 1 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(5);   -- the termination interrupts this
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER terminate_once BEFORE INSERT ON attempts FOR EACH ROW EXECUTE FUNCTION terminate_own_backend_once();
"""


async def produce_events(bootstrap: str, events: list[AttemptEvent]) -> None:
    """As the consumer runtime does: keyed by occurrence, so the events spread over the partitions."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        futures = [await producer.send(ATTEMPTS_TOPIC, e.encode(), key=e.key) for e in events]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


@pytest.mark.parametrize("merge_records", [0, 256], ids=["unit-per-partition", "partitions-merged"])
async def test_a_batch_whose_backend_is_terminated_mid_transaction_drops_no_event_of_any_partition(
    pool, clock, target, kafka_bootstrap, merge_records
):
    """With partitions merged, the 96 events of the fetch (a dozen per partition) are one transaction: the
    termination rewinds every partition of it; without, only the partition whose batch it hit."""
    occurrences = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(48)]
    await pool.execute(TERMINATE_ONCE)
    events = []
    for occurrence in occurrences:
        token = uuid.uuid4()
        events += [
            AttemptEvent.started(occurrence.occurrence_id, 1, token, 30.0, "billing", "host:1"),
            AttemptEvent.succeeded(occurrence.occurrence_id, 1, token),
        ]
    await create_missing_topics(kafka_bootstrap, [ATTEMPTS_TOPIC])
    # Every event is in the topic before the processor's first fetch, so one fetch holds several partitions.
    await produce_events(kafka_bootstrap, events)
    processor = AttemptProcessor(
        pool,
        kafka_bootstrap,
        AttemptProcessorConfig(
            session_timeout=2.0,
            heartbeat_interval=0.4,
            max_poll_records=100_000,
            error_backoff=0.05,
            merge_records=merge_records,
        ),
        clock=clock,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))
    ids = [o.occurrence_id for o in occurrences]

    async def all_succeeded() -> bool:
        if task.done():
            task.result()  # a crashed processor fails the test with its own error
        states = await pool.fetch("SELECT state FROM occurrences WHERE occurrence_id = ANY($1)", ids)
        return all(r["state"] == "SUCCEEDED" for r in states)

    try:
        await wait_for(all_succeeded, timeout=30)
    finally:
        stop.set()
        await task
    assert await pool.fetchval("SELECT last_value FROM fault_fired") >= 1, "the fault was injected"
    assert await pool.fetchval(
        "SELECT count(*) FROM attempts WHERE occurrence_id = ANY($1) AND result = 'succeeded'", ids
    ) == len(ids)


async def test_a_unit_of_heavy_partitions_is_applied_side_by_side_and_a_lane_that_dies_loses_nothing(
    pool, clock, target, telemetry: Telemetry
):
    """One unit of group records (one per partition, as a batch handler's reports come): each partition's
    events are a lane of their own transactions, the lanes open at once. The first attempt insert of the
    unit terminates its backend: that lane fails, the others run to their end, the unit raises its transient
    error (the loop re-reads it), and reading it again applies every event, the others' as duplicates."""
    partitions, per_partition = 4, 6
    occurrences = [await due_occurrence(pool, "acme", target, clock.now()) for _ in range(partitions * per_partition)]
    records = []
    for partition in range(partitions):
        mine = occurrences[partition * per_partition : (partition + 1) * per_partition]
        key, value, headers = encode_group(
            [AttemptEvent.started(o.occurrence_id, 1, uuid.uuid4(), 30.0, "billing", "host:1") for o in mine]
        )
        records.append(ConsumerRecord(ATTEMPTS_TOPIC, partition, 0, 0, 0, key, value, None, 0, len(value), headers))
    config = AttemptProcessorConfig(merge_records=per_partition - 1, parallel_partitions=partitions)
    processor = AttemptProcessor(pool, config=config, clock=clock, **telemetry.instruments("engine"))
    await pool.execute(TERMINATE_ONCE)

    with pytest.raises(Exception) as failure:
        await processor.handle_records(records)
    assert is_transient(failure.value), failure.value
    running = await pool.fetchval(
        "SELECT count(*) FROM occurrences WHERE occurrence_id = ANY($1) AND state = 'RUNNING'",
        [o.occurrence_id for o in occurrences],
    )
    assert running == (partitions - 1) * per_partition, "every other lane ran to its end"
    spans = telemetry.spans(obs.SPAN_ATTEMPT_EVENTS)
    assert [(span.attributes or {}).get("chronoq.partitions") for span in spans] == [1] * partitions
    starts, ends = [span.start_time or 0 for span in spans], [span.end_time or 0 for span in spans]
    assert max(starts) < min(ends), "all open at once"

    assert await processor.handle_records(records) == {
        "accepted": per_partition,
        "duplicate": (partitions - 1) * per_partition,
    }
    assert await pool.fetchval(
        "SELECT count(*) FROM attempts WHERE occurrence_id = ANY($1)", [o.occurrence_id for o in occurrences]
    ) == len(occurrences)


# The engine's first query of a Kafka loop names its consumer group after the database. This shadows
# current_database() (public before pg_catalog on the search path of new connections) with one that
# terminates its own backend the first time it is called.
TERMINATE_FIRST_NAME_LOOKUP = """
CREATE SEQUENCE name_lookup_fault_fired;
CREATE FUNCTION public.current_database() RETURNS name LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('name_lookup_fault_fired') = 1 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(5);   -- the termination interrupts this
    END IF;
    RETURN pg_catalog.current_database();
END $$;
"""


async def test_a_processor_whose_first_query_loses_its_backend_starts_anyway(
    pool, engine_db, clock, target, kafka_bootstrap
):
    """Found by the chaos run: a backend terminated during the attempt processor's start-up query (the group
    name) ended the engine process; the start-up now retries transient errors like every later pass."""
    await pool.execute(TERMINATE_FIRST_NAME_LOOKUP)
    database = await pool.fetchval("SELECT pg_catalog.current_database()")
    await pool.execute(f'ALTER DATABASE "{database}" SET search_path = public, pg_catalog')
    fresh = await create_pool(engine_db, min_size=1, max_size=4)  # connections with that search path
    occurrence = await due_occurrence(pool, "acme", target, clock.now())
    token = uuid.uuid4()
    await create_missing_topics(kafka_bootstrap, [ATTEMPTS_TOPIC])
    await produce_events(
        kafka_bootstrap,
        [
            AttemptEvent.started(occurrence.occurrence_id, 1, token, 30.0, "billing", "host:1"),
            AttemptEvent.succeeded(occurrence.occurrence_id, 1, token),
        ],
    )
    processor = AttemptProcessor(
        fresh,
        kafka_bootstrap,
        AttemptProcessorConfig(session_timeout=2.0, heartbeat_interval=0.4, error_backoff=0.05),
        clock=clock,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(processor.run(stop))

    async def succeeded() -> bool:
        if task.done():
            task.result()  # a processor that ended fails the test with its own error
        state = await pool.fetchval("SELECT state FROM occurrences WHERE occurrence_id = $1", occurrence.occurrence_id)
        return state == "SUCCEEDED"

    try:
        await wait_for(succeeded, timeout=30)
    finally:
        stop.set()
        await task
        await fresh.close()
    assert await pool.fetchval("SELECT last_value FROM name_lookup_fault_fired") >= 2, "the fault was injected"

"""The raw floor that ``load_tests.hour_top`` divides chronoq's dispatch rate by: measured in a process of its
own against the run's server and broker, every figure there, and nothing of it left behind in either."""

from __future__ import annotations

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from load_tests.raw_floor import (
    FLOOR_CURSOR_TABLE,
    FLOOR_TABLE,
    FLOOR_TOPIC_PREFIX,
    fastest_pipeline,
    measure_floor_apart,
)

FIGURES = (
    "copy_rows_per_s", "range_read_rows_per_s", "aiokafka_msgs_per_s", "confluent_msgs_per_s",
    "confluent_lz4_msgs_per_s", "pipeline_rows_per_s", "pipeline_lz4_rows_per_s",
)  # fmt: skip


async def test_the_floor_runs_apart_and_leaves_no_table_or_topic_behind(engine_db: str, kafka_bootstrap: str):
    figures = await measure_floor_apart(engine_db, kafka_bootstrap, rows=3000, partitions=2)

    assert figures["rows"] == 3000
    assert all(figures[name] > 0 for name in FIGURES), figures
    assert fastest_pipeline(figures) == max(figures["pipeline_rows_per_s"], figures["pipeline_lz4_rows_per_s"])
    conn = await asyncpg.connect(engine_db)
    try:
        left = await conn.fetchval(
            "SELECT array_remove(ARRAY[to_regclass($1)::text, to_regclass($2)::text], NULL)",
            FLOOR_TABLE,
            FLOOR_CURSOR_TABLE,
        )
    finally:
        await conn.close()
    assert left == []
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        topics = await admin.list_topics()
    finally:
        await admin.close()
    assert [t for t in topics if t.startswith(FLOOR_TOPIC_PREFIX)] == []

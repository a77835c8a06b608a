"""Every named query prepares on the real PostgreSQL, with the parameters its names promise."""

from __future__ import annotations

import asyncpg

from engine.control.reconciler.slots import create_run_tables
from schemas.connections import connect
from schemas.migrations import apply_migrations
from schemas.queries import CONSUMER_QUERIES, QUERIES, QuerySet


async def prepare_all(conn: asyncpg.Connection, registry: QuerySet) -> dict[str, str]:
    problems: dict[str, str] = {}
    for name, query in registry.items():
        try:
            async with conn.transaction():  # a savepoint: one failure does not abort the others
                statement = await conn.prepare(query.sql)
        except asyncpg.PostgresError as err:
            problems[name] = repr(err)
            continue
        if len(statement.get_parameters()) != len(query.params):
            problems[name] = f"PostgreSQL sees {len(statement.get_parameters())} parameters, names {query.params}"
    return problems


async def test_every_engine_query_prepares_on_the_migrated_engine_database(engine_db):
    conn = await connect(engine_db)
    try:
        async with conn.transaction():
            await create_run_tables(conn)  # the reconciler's queries read the temporary tables of its run
            # materialize_staged reads the session's staging table, which the materializer creates first.
            await conn.execute(*QUERIES.create_staging())
            assert await prepare_all(conn, QUERIES) == {}
    finally:
        await conn.close()


async def test_every_consumer_query_prepares_on_a_migrated_consumer_database(consumer_db):
    conn = await connect(consumer_db)
    try:
        await apply_migrations(conn, "consumer")
        assert await prepare_all(conn, CONSUMER_QUERIES) == {}
    finally:
        await conn.close()

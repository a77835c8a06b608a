"""The consumer app of the chaos run: applies every occurrence of its targets as one row in ``chaos_effects``.

    python -m load_tests.chaos_consumer --bootstrap HOST:PORT --database-url URL --targets T1,T2 [--name N]
                                        [--batch N]

``chaos_effects`` has no unique key, so an effect applied twice shows as two
rows. The handler holds its transaction open for a few milliseconds after
the insert (half of it inside a ``pg_sleep`` statement), so database faults
can land inside it, mid-statement and between statements. With ``--batch N`` the
handlers are batch handlers of up to N occurrences (their attempt events go
as group records). A public consumer app in every respect: only
``consumers`` and its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random

import asyncpg

from consumers import ConsumerApp, ConsumerConfig, Occurrence


def build_app(args: argparse.Namespace) -> ConsumerApp:
    config = ConsumerConfig(
        args.group,
        args.bootstrap,
        args.database_url,
        session_timeout=args.session_timeout,
        heartbeat_interval=args.session_timeout / 4,
        lease_ttl=args.lease_ttl,
        redelivery_backoff=0.1,
        shutdown_grace=2.0,
        worker=args.name,
    )
    app = ConsumerApp(config)
    rng = random.Random()

    async def apply_batch(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
        await conn.executemany(
            "INSERT INTO chaos_effects (occurrence_id, schedule_id, scheduled_for, attempt, worker)"
            " VALUES ($1, $2, $3, $4, $5)",
            [(o.occurrence_id, o.schedule_id, o.scheduled_for, o.attempt, args.name) for o in occurrences],
        )
        # Still inside the effects' transaction: half of the hold in a statement (its backend "active"), half
        # between statements ("idle in transaction"), so database faults land in both. The insert alone lasts
        # well under a millisecond: polling pg_stat_activity once missed it in nine 5 s windows.
        hold = rng.uniform(0.005, args.hold)
        await conn.execute("SELECT pg_sleep($1)", hold / 2)
        await asyncio.sleep(hold / 2)

    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await apply_batch([occurrence], conn)

    for target in args.targets.split(","):
        if args.batch:
            app.handler(target, batch=args.batch, concurrency=4)(apply_batch)
        else:
            app.handler(target, concurrency=8)(apply)
    return app


async def main(args: argparse.Namespace) -> None:
    await build_app(args).run()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--targets", required=True, help="comma-separated targets")
    parser.add_argument("--group", default="chaos")
    parser.add_argument("--name", default=f"consumer-{os.getpid()}")
    parser.add_argument("--session-timeout", type=float, default=4.0)
    parser.add_argument("--lease-ttl", type=float, default=6.0)
    parser.add_argument("--hold", type=float, default=0.05, help="longest wait inside the transaction (s)")
    parser.add_argument("--batch", type=int, default=0, help="batch handlers of up to N occurrences (0: single)")
    # The engine's key=value lines: a poison verdict's reason, a refusal's, are in the extras.
    from engine.cli.log_format import configure_logging

    configure_logging(logging.WARNING)
    asyncio.run(main(parser.parse_args()))

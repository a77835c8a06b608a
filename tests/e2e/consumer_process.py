"""A consumer app in its own process, for tests that kill (SIGKILL), pause (SIGSTOP) or stop (SIGTERM) it.

    python -m tests.e2e.consumer_process --bootstrap HOST:PORT --database-url URL --group G --target T \
        [--pause-at after_started|before_commit|after_commit|after_report] [--handler-seconds S] ...

The handler inserts one row into ``effects`` (no unique key: a second
application of one occurrence would show as a second row). At every handoff
the process prints ``AT <point> <occurrence_id> <lease_token>`` on stdout; at
the ``--pause-at`` point it then waits for a line on stdin before going on,
so a test can kill or stop it exactly there. ``RESULT <outcome>`` lines and
the exit status tell how it ended. With ``--batch N`` the handler is a batch
handler (it prints ``BATCH <n> <ids...>``); the hooks still run per
occurrence, so the process stops at the batch's first occurrence, with the
whole batch at that point. SIGTERM/SIGINT are the runtime's own: the first
drains, the second aborts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import asyncpg

from consumers import ConsumerApp, ConsumerConfig, ConsumerHooks, Occurrence

POINTS = ("after_started", "before_commit", "after_commit", "after_report")


def say(*words: object) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def hooks(pause_at: str | None) -> ConsumerHooks:
    def at(point: str):
        async def hook(occurrence: Occurrence) -> None:
            say("AT", point, occurrence.occurrence_id, occurrence.lease_token)
            if point == pause_at:
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
                say("RESUMED", point, occurrence.occurrence_id)

        return hook

    return ConsumerHooks(**{point: at(point) for point in POINTS})


async def main(args: argparse.Namespace) -> int:
    config = ConsumerConfig(
        args.group,
        args.bootstrap,
        args.database_url,
        session_timeout=args.session_timeout,
        heartbeat_interval=args.session_timeout / 5,
        lease_ttl=args.lease_ttl,
        handler_timeout=args.handler_timeout,
        transaction_idle_timeout=args.idle_timeout,
        dedupe_lock_timeout=args.lock_timeout,
        shutdown_grace=args.shutdown_grace,
        redelivery_backoff=0.1,
        state_catch_up_timeout=5.0,
    )
    app = ConsumerApp(config, hooks=hooks(args.pause_at))

    if args.batch:

        @app.handler(args.target, batch=args.batch)
        async def apply_batch(occurrences: list[Occurrence], conn: asyncpg.Connection) -> None:
            say("BATCH", len(occurrences), *(o.occurrence_id for o in occurrences))
            await conn.executemany(
                "INSERT INTO effects (occurrence_id, attempt, lease_token) VALUES ($1, $2, $3)",
                [(o.occurrence_id, o.attempt, o.lease_token) for o in occurrences],
            )
            say("BATCH_DONE", len(occurrences))

        applied = await app.run()
        say("RESULT", f"applied={applied}", *(f"{o[0]}:{o[1]}:{o[2]}" for o in app.stats.outcomes))
        return 0

    @app.handler(args.target, concurrency=4)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        say("HANDLER", occurrence.occurrence_id, occurrence.attempt)
        await conn.execute(
            "INSERT INTO effects (occurrence_id, attempt, lease_token) VALUES ($1, $2, $3)",
            occurrence.occurrence_id,
            occurrence.attempt,
            occurrence.lease_token,
        )
        if args.handler_seconds:
            await asyncio.sleep(args.handler_seconds)
        say("HANDLER_DONE", occurrence.occurrence_id)

    applied = await app.run()
    say("RESULT", f"applied={applied}", *(f"{o[0]}:{o[1]}:{o[2]}" for o in app.stats.outcomes))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--pause-at", choices=POINTS)
    parser.add_argument("--handler-seconds", type=float, default=0.0)
    parser.add_argument("--batch", type=int, help="a batch handler taking up to this many occurrences per call")
    parser.add_argument("--session-timeout", type=float, default=2.0)
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    parser.add_argument("--handler-timeout", type=float, default=300.0)
    parser.add_argument("--idle-timeout", type=float)
    parser.add_argument("--lock-timeout", type=float)
    parser.add_argument("--shutdown-grace", type=float, default=30.0)
    sys.exit(asyncio.run(main(parser.parse_args())))

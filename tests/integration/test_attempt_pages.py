"""Attempt rows keep room on their page for their second version (migration 0030): a burst's outcomes update
their attempts in place (HOT: the same page, no index entry), in a day partition the engine creates later as
in the default one."""

from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg

from engine.loops.attempt_ledger import Verdict
from engine.loops.attempt_processor import AttemptProcessor
from schemas.attempt_events import AttemptEvent as Ev
from schemas.queries import QUERIES
from tests.support.rows import due_occurrence

TTL = 30.0
#: Each attempt's partition and page (its ctid's block number).
PLACES = (
    "SELECT attempt_id, tableoid::regclass::text AS partition, (ctid::text::point)[0]::bigint AS page"
    " FROM attempts WHERE occurrence_id = ANY($1)"
)


async def half_filled(pool: asyncpg.Pool) -> dict[str, bool]:
    rows = await pool.fetch(
        "SELECT i.inhrelid::regclass::text AS partition,"
        " coalesce(c.reloptions @> ARRAY['fillfactor=50'], false) AS half"
        " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'attempts'::regclass"
    )
    return {r["partition"]: r["half"] for r in rows}


async def test_every_attempts_partition_keeps_half_of_its_pages_free(pool, clock):
    day = clock.now().date()
    assert (await half_filled(pool)) == {"attempts_default": True}
    await pool.fetchval(*QUERIES.ensure_day_partitions(from_day=day, to_day=day))

    assert await half_filled(pool) == {"attempts_default": True, f"attempts_p{day:%Y%m%d}": True}
    # the occurrences' own partitions are left as they were: their updates can never be HOT
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'occurrences'::regclass AND c.reloptions IS NOT NULL"
        )
        == 0
    )


async def test_a_burst_s_outcomes_update_their_attempts_on_their_own_page(pool, clock, target):
    day = clock.now().date()
    await pool.fetchval(*QUERIES.ensure_day_partitions(from_day=day, to_day=day))
    occurrences = [(await due_occurrence(pool, "acme", target, clock.now())).occurrence_id for _ in range(300)]
    tokens = {ident: uuid.uuid4() for ident in occurrences}
    processor = AttemptProcessor(pool, clock=clock)

    started = await processor.apply_events([Ev.started(o, 1, tokens[o], TTL) for o in occurrences])
    before = {r["attempt_id"]: (r["partition"], r["page"]) for r in await pool.fetch(PLACES, occurrences)}
    succeeded = await processor.apply_events([Ev.succeeded(o, 1, tokens[o]) for o in occurrences])
    after = {r["attempt_id"]: (r["partition"], r["page"]) for r in await pool.fetch(PLACES, occurrences)}

    assert started == succeeded == [Verdict.ACCEPTED] * 300
    assert {partition for partition, _ in before.values()} == {f"attempts_p{day:%Y%m%d}"}
    pages = {page for _, page in before.values()}
    assert len(pages) >= 4, pages  # the burst's rows fill several pages: a page of its own would prove nothing
    in_place = sum(after[attempt] == place for attempt, place in before.items())
    # At the default fillfactor the full pages send nearly every row elsewhere (3 of 300 stayed, checked).
    assert in_place >= 0.75 * len(before), (in_place, len(before))


async def test_a_batch_s_attempts_each_land_in_their_occurrence_s_day(pool, clock, target):
    """One batch of ``started`` events for occurrences of three days: each attempt is written with its own
    occurrence's instant (the key of its day partition), not with another of the batch's days."""
    now = clock.now()
    instants = [now - timedelta(days=1, minutes=3), now, now + timedelta(minutes=7)]
    await pool.fetchval(*QUERIES.ensure_day_partitions(from_day=instants[0].date(), to_day=instants[-1].date()))
    occurrences = [(await due_occurrence(pool, "acme", target, at)).occurrence_id for at in instants * 2]
    events = [Ev.started(o, 1, uuid.uuid4(), TTL) for o in reversed(occurrences)]

    assert await AttemptProcessor(pool, clock=clock).apply_events(events) == [Verdict.ACCEPTED] * 6
    rows = await pool.fetch(
        "SELECT a.scheduled_for AS attempt_at, o.scheduled_for, a.tableoid::regclass::text AS partition"
        " FROM attempts a JOIN occurrences o USING (occurrence_id) WHERE o.occurrence_id = ANY($1)",
        occurrences,
    )
    assert sorted((r["attempt_at"], r["partition"]) for r in rows) == sorted(
        (r["scheduled_for"], f"attempts_p{r['scheduled_for']:%Y%m%d}") for r in rows
    )
    assert {r["attempt_at"] for r in rows} == set(instants)

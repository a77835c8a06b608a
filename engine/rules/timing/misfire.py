"""Misfires: what happens to fire instants that are late (an outage, a pause, a slow materializer or relay).

Nothing is silently dropped: every instant from the durable cursor up to now +
horizon is either enqueued or recorded MISSED (listed, or summarised as one
range), with bounded work however long the outage was and however large the
schedule's ``max_lateness``:

* an instant is **on time** when it is at most ``max_lateness`` late — and
  never more than the engine's ``on_time_limit`` (when given): a schedule
  whose ``max_lateness`` is days cannot turn an outage's backlog into
  unbounded "on-time" work;
* late instants follow the policy: ``skip`` enqueues none, ``fire_once`` the
  most recent one, ``catch_up:K`` the K most recent — the **catch-up**
  instants, which the dispatcher releases at the tenant's
  ``catch_up_per_minute`` (``engine.rules.token_bucket``) in capacity of their
  own, apart from on-time work;
* the others are MISSED: the oldest ``record_limit`` listed, the rest counted
  and summarised as one :class:`MissedRange`.

:func:`decide_dispatch` (in ``schemas.dispatch_lateness``, where the relays
can import it; re-exported here) applies the same rule again when an on-time
occurrence reaches the dispatcher late (the relay or the broker was down):
it is published only if the policy still allows, else recorded MISSED.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import islice

from engine.rules.timing.durations import MAX_DURATION, parse_duration
from engine.rules.timing.exclusions import exclusions_of
from engine.rules.timing.fires import next_fire_after
from engine.rules.timing.instants import MICROSECOND, UTC, naive_utc
from engine.rules.timing.sources import backward_fires, count_fires, forward_fires
from engine.rules.timing.spec import TimeSpec
from schemas.dispatch_lateness import DispatchDecision, MisfirePolicy, decide_dispatch, late_threshold
from schemas.errors import InvalidInput

__all__ = [
    "MISFIRE_KINDS",
    "MAX_CATCH_UP",
    "MisfirePolicy",
    "MissedRange",
    "MisfireDecision",
    "DispatchDecision",
    "parse_misfire_policy",
    "late_threshold",
    "decide_misfire",
    "decide_dispatch",
]

MISFIRE_KINDS: tuple[str, ...] = ("skip", "fire_once", "catch_up")
MAX_CATCH_UP = 1000


@dataclass(frozen=True)
class MissedRange:
    """Missed instants summarised instead of listed: every fire from ``first`` to ``last`` (inclusive)."""

    first: datetime
    last: datetime
    count: int | None  # how many (None: more than can be counted, cron over ten years)


@dataclass(frozen=True)
class MisfireDecision:
    """What a materializer does with the fire instants from the durable cursor up to now + horizon."""

    enqueue: list[datetime]  # scheduled_for instants to materialize as occurrences (oldest first)
    missed: list[datetime]  # instants to record as MISSED (at most record_limit of them, oldest first)
    missed_unlisted: int | None  # how many further missed instants were not listed (None = more, count unknown)
    next_run_at: datetime | None  # the durable cursor after this decision: first fire strictly after `until`
    excluded: int | None = 0  # slots the exclusion calendar removed from the decided range (None = unknown)
    runs_exhausted: bool = False  # next_run_at is None because the last run allowed by max_runs was enqueued
    catch_up: list[datetime] = field(default_factory=list)  # the late ones among `enqueue` (oldest first)
    missed_range: MissedRange | None = None  # the unlisted missed instants, as one range

    @property
    def on_time(self) -> list[datetime]:
        """The instants of ``enqueue`` that are not catch-up."""
        late = set(self.catch_up)
        return [instant for instant in self.enqueue if instant not in late]


def parse_misfire_policy(text: str, max_lateness: object = None) -> MisfirePolicy:
    """Parse ``"skip"``, ``"fire_once"`` or ``"catch_up:K"`` (K from 1 to 1000) and the lateness threshold.

    ``max_lateness`` defaults to one minute; ``"0s"`` makes every instant that is
    not exactly on time late.
    """
    example = "catch_up:3"
    if not isinstance(text, str):
        raise InvalidInput(
            "misfire_policy", f"must be skip, fire_once or catch_up:K, got {type(text).__name__}", example
        )
    raw = text.strip().lower()
    if raw in ("skip", "fire_once"):
        kind, limit = raw, 0
    elif raw.startswith("catch_up"):
        match = re.fullmatch(r"catch_up:(\d{1,7})", raw)
        if match is None:
            raise InvalidInput(
                "misfire_policy",
                f"{text.strip()[:30]!r}: catch_up needs a bound K, written catch_up:K with K from 1 to {MAX_CATCH_UP}",
                example,
            )
        kind, limit = "catch_up", int(match.group(1))
        if not 1 <= limit <= MAX_CATCH_UP:
            raise InvalidInput("misfire_policy", f"catch_up bound {limit} must be from 1 to {MAX_CATCH_UP}", example)
    else:
        raise InvalidInput(
            "misfire_policy", f"{text.strip()[:30]!r} is not a policy; use skip, fire_once or catch_up:K", example
        )
    if max_lateness is None:
        lateness = timedelta(minutes=1)
    elif isinstance(max_lateness, timedelta):
        if max_lateness < timedelta(0):
            raise InvalidInput("max_lateness", "must not be negative", "5m")
        if max_lateness > MAX_DURATION:
            raise InvalidInput("max_lateness", f"must be at most {MAX_DURATION.days}d", "5m")
        lateness = max_lateness
    else:
        lateness = parse_duration(max_lateness, "max_lateness")
    return MisfirePolicy(kind, limit, lateness)  # type: ignore[arg-type]


def decide_misfire(
    spec: TimeSpec,
    next_fire: datetime,
    now: datetime,
    policy: MisfirePolicy,
    horizon: timedelta = timedelta(0),
    record_limit: int = 1000,
    remaining_runs: int | None = None,
    *,
    on_time_limit: timedelta | None = None,
) -> MisfireDecision:
    """Decide every fire instant t with next_fire <= t <= now + horizon; nothing is silently dropped.

    An instant is late when ``now - t`` exceeds :func:`late_threshold`
    (``max_lateness``, capped by ``on_time_limit`` when given; exactly at the
    threshold is on time). On-time instants, including future ones within the
    horizon, are enqueued. Late ones: ``skip`` records them all MISSED;
    ``catch_up:K`` enqueues the K most recent and records the older ones
    MISSED; ``fire_once`` enqueues the most recent late one, unless an on-time
    instant at or before ``now`` exists (the schedule is already running on
    time, so a catch-up run would be a second run for the same outage), and
    records the rest MISSED. The late instants enqueued are also listed in
    ``catch_up``: never more than K (1 for fire_once, 0 for skip).

    ``missed`` lists the oldest missed instants, at most ``record_limit``;
    ``missed_unlisted`` counts the others exactly (rate, once, and cron over
    spans up to ten years; None beyond) and ``missed_range`` names their first
    and last instant. Work is O(record_limit + K + on-time instants + days of
    outage for cron), never O(missed instants); with ``on_time_limit`` the
    on-time instants are bounded too (those within ``on_time_limit`` before now
    and the horizon after).

    Fires the spec's exclusion calendar removes are neither enqueued nor
    missed, but ``next_run_at`` walks the slots of the spec without its
    calendar: a calendar changed later applies to every slot not yet
    materialized. ``remaining_runs`` (the schedule's ``max_runs`` minus its
    runs) enqueues at most that many, oldest first; when the last one is
    enqueued ``next_run_at`` is None (the schedule completes). With no run
    left nothing is decided.
    """
    if record_limit < 0:
        raise ValueError("record_limit must not be negative")
    if remaining_runs is not None and remaining_runs <= 0:
        if remaining_runs < 0:
            raise ValueError("remaining_runs must not be negative")
        return MisfireDecision(enqueue=[], missed=[], missed_unlisted=0, next_run_at=None, runs_exhausted=True)
    if horizon < timedelta(0):
        raise ValueError("horizon must not be negative")
    cursor = naive_utc(next_fire, "next_fire")
    current = naive_utc(now, "now")
    until = current + horizon
    late_before = current - late_threshold(policy, on_time_limit)  # t < late_before  <=>  t is late

    on_time = list(forward_fires(spec, max(cursor, late_before) - MICROSECOND, until))
    late_enqueue: list[datetime] = []
    if cursor < late_before:
        if policy.kind == "catch_up":
            late_enqueue = list(islice(backward_fires(spec, late_before, cursor), policy.catch_up_limit))
        elif policy.kind == "fire_once" and not (on_time and on_time[0] <= current):
            late_enqueue = list(islice(backward_fires(spec, late_before, cursor), 1))
        late_enqueue.reverse()
    missed_before = late_enqueue[0] if late_enqueue else late_before
    missed: list[datetime] = []
    unlisted: int | None = 0
    summary: MissedRange | None = None
    if cursor < missed_before:
        for instant in forward_fires(spec, cursor - MICROSECOND, missed_before - MICROSECOND):
            if len(missed) == record_limit:
                unlisted = count_fires(spec, missed[-1] if missed else cursor - MICROSECOND, missed_before)
                last = next(backward_fires(spec, missed_before, cursor), instant)
                summary = MissedRange(instant.replace(tzinfo=UTC), last.replace(tzinfo=UTC), unlisted)
                break
            missed.append(instant)
    enqueue = late_enqueue + on_time
    slots = dataclasses.replace(spec, calendar=None) if spec.calendar is not None else spec
    exhausted = remaining_runs is not None and len(enqueue) >= remaining_runs
    if exhausted:
        enqueue = enqueue[:remaining_runs]
        following = None  # the last run: the schedule completes
    else:
        following = next_fire_after(slots, max(until, cursor - MICROSECOND).replace(tzinfo=UTC))
    excluded = _excluded_count(spec, slots, cursor, until)
    return MisfireDecision(
        enqueue=[instant.replace(tzinfo=UTC) for instant in enqueue],
        missed=[instant.replace(tzinfo=UTC) for instant in missed],
        missed_unlisted=unlisted,
        next_run_at=following,
        excluded=excluded,
        runs_exhausted=exhausted,
        catch_up=[instant.replace(tzinfo=UTC) for instant in late_enqueue if instant in enqueue],
        missed_range=summary,
    )


def _excluded_count(spec: TimeSpec, slots: TimeSpec, cursor: datetime, until: datetime) -> int | None:
    """Slots in [cursor, until] that the spec's calendar removes: the slots minus the fires left.

    O(days + calendar intervals), like the missed count; None when a count is unknown.
    """
    exclusions = exclusions_of(spec)
    if exclusions is None or cursor > until or not exclusions.overlapping(cursor - MICROSECOND, until + MICROSECOND):
        return 0  # the common case: no listed date in the range, nothing to count
    every = count_fires(slots, cursor - MICROSECOND, until + MICROSECOND)
    kept = count_fires(spec, cursor - MICROSECOND, until + MICROSECOND)
    return every - kept if every is not None and kept is not None else None

"""Cohort rules (engine/rules/cohorts.py): schedules with one key are judged alike at any cursor and any
instant, schedules judged per schedule get no key, and only plain on-time decisions keep a cohort."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.rules import timing
from engine.rules.cohorts import cohort_spec, plain_on_time

EXPRESSIONS = {"cron": ["* * * * *", "0 * * * *", "30 2 * * *", "*/7 * * * *"], "rate": ["1m", "15m", "1h"]}
ZONES = ["UTC", "Europe/Berlin", "America/New_York"]
POLICIES = ["skip", "fire_once", "catch_up:2"]
BASE = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)  # a DST change in Berlin the next night, New York's weeks before


@st.composite
def schedules(draw):
    kind = draw(st.sampled_from(["cron", "rate"]))
    return {
        "kind": kind,
        "expression": draw(st.sampled_from(EXPRESSIONS[kind])),
        "time_zone": draw(st.sampled_from(ZONES)),
        "dst_repeat": draw(st.sampled_from(["first", "both"])),
        "dst_gap": draw(st.sampled_from(["skip", "shift"])),
        "anchor": BASE + timedelta(minutes=draw(st.integers(0, 2))) if kind == "rate" else None,
        "misfire_policy": draw(st.sampled_from(POLICIES)),
        "max_lateness_s": draw(st.sampled_from([0, 60])),
        "start_at": BASE - timedelta(hours=draw(st.integers(1, 48))),  # before any cursor: not in the key
        "end_at": None,
        "calendar_id": None,
        "max_runs": None,
        "overlap_policy": "allow",
    }


def key(schedule: dict) -> str | None:
    spec = cohort_spec(**{k: v for k, v in schedule.items() if k != "start_at"})
    return spec.key if spec is not None else None


def decide(schedule: dict, cursor: datetime, now: datetime) -> timing.MisfireDecision:
    spec = timing.TimeSpec(
        schedule["kind"], schedule["expression"], schedule["time_zone"], schedule["dst_repeat"],
        schedule["dst_gap"], schedule["anchor"], schedule["start_at"], None,
    )  # fmt: skip
    policy = timing.parse_misfire_policy(schedule["misfire_policy"], timedelta(seconds=schedule["max_lateness_s"]))
    return timing.decide_misfire(
        spec, cursor, now, policy, timedelta(seconds=30), 50, on_time_limit=timedelta(minutes=5)
    )


def first_fire(schedule: dict, after: datetime) -> datetime:
    spec = timing.TimeSpec(
        schedule["kind"], schedule["expression"], schedule["time_zone"], schedule["dst_repeat"],
        schedule["dst_gap"], schedule["anchor"], schedule["start_at"], None,
    )  # fmt: skip
    fire = timing.next_fire_after(spec, after)
    assert fire is not None
    return fire


@settings(max_examples=300, deadline=None)
@given(schedules(), st.integers(1, 48), st.integers(0, 36 * 60), st.integers(-5, 24 * 60))
def test_schedules_with_one_key_get_one_decision_at_any_cursor_and_instant(a, other_start_h, cursor_min, late_min):
    # Everything but the key's fields (here the start, before any common cursor) may differ between members.
    b = {**a, "start_at": BASE - timedelta(hours=other_start_h)}
    assert key(a) == key(b)
    cursor = first_fire(a, BASE + timedelta(minutes=cursor_min))
    assert first_fire(b, BASE + timedelta(minutes=cursor_min)) == cursor
    now = cursor + timedelta(minutes=late_min)
    assert decide(a, cursor, now) == decide(b, cursor, now)


@given(schedules(), schedules())
def test_a_difference_in_any_keyed_field_is_a_different_key(a, b):
    fields = ("kind", "expression", "time_zone", "dst_repeat", "dst_gap", "anchor", "misfire_policy", "max_lateness_s")
    assert (key(a) == key(b)) == all(a[f] == b[f] for f in fields)


@given(schedules(), st.sampled_from(["end_at", "calendar_id", "max_runs", "overlap_policy", "once"]))
def test_a_schedule_judged_on_its_own_gets_no_key(schedule, rule):
    assert key(schedule) is not None
    changed = dict(schedule)
    if rule == "end_at":
        changed["end_at"] = BASE + timedelta(days=3)
    elif rule == "calendar_id":
        changed["calendar_id"] = uuid.uuid4()
    elif rule == "max_runs":
        changed["max_runs"] = 10
    elif rule == "overlap_policy":
        changed["overlap_policy"] = "skip_if_running"
    else:
        changed["kind"], changed["expression"] = "once", "2026-03-30T00:00:00Z"
    assert key(changed) is None


def test_an_anchor_is_keyed_by_its_instant_not_its_zone():
    from zoneinfo import ZoneInfo

    berlin = BASE.astimezone(ZoneInfo("Europe/Berlin"))
    keys = [
        key({"kind": "rate", "expression": "15m", "time_zone": "UTC", "dst_repeat": "first", "dst_gap": "skip",
             "anchor": anchor, "misfire_policy": "skip", "max_lateness_s": 60, "end_at": None, "calendar_id": None,
             "max_runs": None, "overlap_policy": "allow"})
        for anchor in (BASE, berlin)
    ]  # fmt: skip
    assert keys[0] == keys[1] is not None


@settings(max_examples=200, deadline=None)
@given(schedules(), st.integers(0, 36 * 60), st.integers(-5, 24 * 60))
def test_only_on_time_work_with_a_next_cursor_is_plain(schedule, cursor_min, late_min):
    first = first_fire(schedule, BASE + timedelta(minutes=cursor_min))
    decision = decide(schedule, first, first + timedelta(minutes=late_min))
    expected = (
        bool(decision.enqueue)
        and decision.next_run_at is not None
        and not decision.missed
        and not decision.catch_up
        and not decision.missed_unlisted
    )
    assert plain_on_time(decision) == expected
    if plain_on_time(decision):  # every instant enqueued is on time (not later than max_lateness at `now`)
        assert decision.on_time == decision.enqueue

"""Bad input: every rejection names the API field and shows a valid example."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from engine.control.schedule_requests import build_time_spec
from engine.rules.timing import (
    MisfirePolicy,
    TimeSpec,
    parse_duration,
    parse_misfire_policy,
)
from schemas.errors import InvalidInput

UTC = UTC


def rejects(
    field: str, call: Callable[..., object], *args: object, match: str | None = None, **kwargs: object
) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        call(*args, **kwargs)
    error = caught.value
    assert error.field == field, f"{error} names {error.field!r}, expected {field!r}"
    assert error.example, f"{error} has no example of a valid value"
    assert "example of a valid value" in str(error)
    if match is not None:
        assert match.lower() in str(error).lower(), str(error)
    return error


@pytest.mark.parametrize(
    ("expression", "match"),
    [
        ("0 0 * * * *", "6 fields"),
        ("0 0 0 * * * 2027", "7 fields"),
        ("0 0 *", "3 fields"),
        ("@reboot", "not a time"),
        ("@fortnightly", "unknown alias"),
        ("H * * * *", "Jenkins"),
        ("H(0-29) * * * *", "Jenkins"),
        ("0 H * * *", "Jenkins"),
        ("CRON_TZ=Europe/Berlin 0 9 * * *", "time_zone"),
        ("TZ=UTC 0 9 * * *", "time_zone"),
        ("0 0 ? * MON", "Quartz"),
        # L, W and # are accepted in the day fields (test_cron_extensions.py); these misuse them.
        ("0 0 L * FRI", "ambiguous"),
        ("0 0 31W 2 *", "never fire"),
        ("0 L * * *", "only in the day-of-month and day-of-week fields"),
        ("0 0 30 2 *", "never fire"),
        ("0 0 31 4 *", "never fire"),
        ("0 0 31 4,6,9,11 *", "never fire"),
        ("0 0 30,31 2 */2", "never fire"),
        ("60 * * * *", "out of range"),
        ("* 24 * * *", "out of range"),
        ("* * 0 * *", "out of range"),
        ("* * 32 * *", "out of range"),
        ("* * * 13 *", "out of range"),
        ("* * * * 8", "out of range"),
        ("*/0 * * * *", "step 0"),
        ("*/90 * * * *", "rate"),
        ("0 22-2 * * *", "backwards"),
        ("0 9 * * FRI-MON", "backwards"),
        ("0 9 * * FUN", "not a valid"),
        ("0 9 * FOO *", "not a valid"),
        ("0 9,, * * *", "not valid"),
        ("0 9 * * 1-", "not valid"),
        ("-5 * * * *", "not valid"),
        ("", "empty"),
        ("   ", "empty"),
    ],
)
def test_bad_cron_expressions(expression: str, match: str) -> None:
    rejects("expression", build_time_spec, "cron", expression, match=match)


def test_never_firing_check_respects_leap_years_and_the_or_rule() -> None:
    build_time_spec("cron", "0 0 29 2 *")  # leap years
    build_time_spec("cron", "0 0 30 2 1")  # every Monday of February (OR rule)
    build_time_spec("cron", "0 0 31 * *")  # some months have 31 days


def test_expression_length_is_capped_before_parsing() -> None:
    long_expression = "0 " + ",".join(["1"] * 30_000) + " * * *"
    started = time.perf_counter()
    error = rejects("expression", build_time_spec, "cron", long_expression, match="limit is 200")
    assert time.perf_counter() - started < 0.05
    assert f"{len(long_expression)} characters" in str(error)
    build_time_spec("cron", "0 " + ",".join(str(h) for h in range(24)) + " * * *")  # long but under the cap


@pytest.mark.parametrize(
    ("zone", "match"),
    [
        ("Mars/Olympus_Mons", "not a known IANA zone"),
        ("america/new_york", "did you mean 'America/New_York'"),
        ("../etc/passwd", "not an IANA zone name"),
        ("/etc/localtime", "not an IANA zone name"),
        ("Europe/../../etc/passwd", "not an IANA zone name"),
        ("localtime", "not a known IANA zone"),
        ("Factory", "not a known IANA zone"),
        ("", "empty"),
        ("Europe/Berlin\x00", "not an IANA zone name"),
        ("E" * 300, "not an IANA zone name"),
    ],
)
def test_bad_zones(zone: str, match: str) -> None:
    rejects("time_zone", build_time_spec, "cron", "0 9 * * *", zone, match=match)


def test_good_zones_are_normalized() -> None:
    assert build_time_spec("cron", "0 9 * * *", " Europe/Berlin ").time_zone == "Europe/Berlin"
    assert build_time_spec("cron", "0 9 * * *").time_zone == "UTC"
    assert build_time_spec("cron", "0 9 * * *", "Etc/GMT+5").time_zone == "Etc/GMT+5"


def test_kind() -> None:
    rejects("kind", build_time_spec, "interval", "5m", match="once, cron or rate")
    rejects("kind", build_time_spec, None, "5m")


def test_once_needs_an_offset() -> None:
    rejects("expression", build_time_spec, "once", "2027-03-01T09:00:00", match="add an offset or Z")
    rejects("expression", build_time_spec, "once", "2027-03-01", match="add an offset or Z")
    rejects("expression", build_time_spec, "once", "next tuesday", match="ISO-8601")
    rejects("expression", build_time_spec, "once", "0001-01-01T00:00:00Z", match="year")
    spec = build_time_spec("once", " 2027-03-01T09:00:00+01:00 ")
    assert spec.expression == "2027-03-01T09:00:00+01:00"


def test_once_in_the_past_is_accepted_here() -> None:
    build_time_spec("once", "2001-01-01T00:00:00Z")  # the control plane decides with its clock


@pytest.mark.parametrize(
    ("expression", "match"),
    [
        ("0s", "at least 1s"),
        ("0m0s", "at least 1s"),
        ("-5m", "negative"),
        ("500ms", "below one second"),
        ("1.5s", "fractional"),
        ("90", "no unit"),
        ("5 minutes", "not a duration"),
        ("m5", "not a duration"),
        ("30m1h", "not a duration"),
        ("99999999d", "not a duration"),
        ("4000d", "limit"),
    ],
)
def test_bad_rates(expression: str, match: str) -> None:
    rejects("expression", build_time_spec, "rate", expression, match=match)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("1h", timedelta(hours=1)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(minutes=90)),
        ("2d12h", timedelta(hours=60)),
        (" 1H 30M ", timedelta(minutes=90)),
        ("0s", timedelta(0)),
        ("1d2h3m4s", timedelta(days=1, seconds=7384)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_parse_duration_names_its_field() -> None:
    rejects("flexible_window", parse_duration, "soon", "flexible_window")
    rejects("max_lateness", parse_duration, 5, "max_lateness")


def test_dst_options() -> None:
    rejects("dst_repeat", build_time_spec, "cron", "0 1 * * *", "Europe/Berlin", dst_repeat="twice")
    rejects("dst_gap", build_time_spec, "cron", "0 2 * * *", "Europe/Berlin", dst_gap="later")
    rejects("dst_repeat", build_time_spec, "rate", "5m", dst_repeat="both", match="only to kind cron")
    rejects("dst_gap", build_time_spec, "once", "2027-01-01T00:00:00Z", dst_gap="shift", match="only to kind cron")
    spec = build_time_spec("rate", "5m", dst_repeat="first", dst_gap="skip")  # defaults are fine anywhere
    assert (spec.dst_repeat, spec.dst_gap) == ("first", "skip")


def test_anchor_and_bounds() -> None:
    rejects("anchor", build_time_spec, "cron", "0 9 * * *", anchor="2027-01-01T00:00:00Z", match="only to kind rate")
    rejects("anchor", build_time_spec, "rate", "5m", anchor="2027-01-01T00:00:00", match="add an offset or Z")
    rejects("anchor", build_time_spec, "rate", "5m", anchor=datetime(2027, 1, 1), match="add an offset or Z")
    rejects("start_at", build_time_spec, "cron", "0 9 * * *", start_at="yesterday")
    rejects(
        "end_at",
        build_time_spec,
        "cron",
        "0 9 * * *",
        start_at="2027-01-02T00:00:00Z",
        end_at="2027-01-01T00:00:00Z",
        match="before start_at",
    )
    rejects(
        "end_at",
        build_time_spec,
        "cron",
        "0 9 * * *",
        "UTC",
        start_at="2027-01-01T10:00:00Z",
        end_at="2027-01-02T08:00:00Z",
        match="no fire time",
    )
    rejects("end_at", build_time_spec, "once", "2027-01-05T00:00:00Z", end_at="2027-01-01T00:00:00Z")
    rejects("start_at", build_time_spec, "once", "2027-01-05T00:00:00Z", start_at="2027-02-01T00:00:00Z")
    spec = build_time_spec(
        "cron",
        "0 9 * * *",
        "Asia/Tokyo",
        start_at="2027-01-01T09:00:00+09:00",
        end_at=datetime(2027, 1, 1, 0, 0, tzinfo=UTC),
    )
    assert spec.start_at == spec.end_at == datetime(2027, 1, 1, 0, 0, tzinfo=UTC)
    assert spec.start_at is not None and spec.start_at.tzinfo is UTC


def test_specs_are_hashable_and_normalized() -> None:
    a = build_time_spec("cron", "  0   9 * *  MON-FRI ", "Europe/Berlin")
    b = build_time_spec("cron", "0 9 * * MON-FRI", "Europe/Berlin")
    assert a == b and hash(a) == hash(b) and a.expression == "0 9 * * MON-FRI"
    assert build_time_spec("cron", "@Daily").expression == "@daily"
    assert {a: 1}[b] == 1
    assert isinstance(a, TimeSpec)


@pytest.mark.parametrize(
    ("text", "lateness", "expected"),
    [
        ("skip", None, MisfirePolicy("skip", 0, timedelta(minutes=1))),
        (" fire_once ", "5m", MisfirePolicy("fire_once", 0, timedelta(minutes=5))),
        ("catch_up:3", timedelta(seconds=30), MisfirePolicy("catch_up", 3, timedelta(seconds=30))),
        ("catch_up:1000", "0s", MisfirePolicy("catch_up", 1000, timedelta(0))),
    ],
)
def test_parse_misfire_policy(text: str, lateness: str | timedelta | None, expected: MisfirePolicy) -> None:
    assert parse_misfire_policy(text, lateness) == expected


@pytest.mark.parametrize(
    "text", ["", "later", "catch_up", "catch_up:0", "catch_up:1001", "catch_up:-1", "catch_up:x", "catch_up:99999999"]
)
def test_bad_misfire_policies(text: str) -> None:
    rejects("misfire_policy", parse_misfire_policy, text)


def test_bad_max_lateness() -> None:
    rejects("max_lateness", parse_misfire_policy, "skip", "-1m")
    rejects("max_lateness", parse_misfire_policy, "skip", timedelta(seconds=-1), match="negative")
    rejects("max_lateness", parse_misfire_policy, "skip", "soon")

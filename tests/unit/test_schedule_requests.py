"""Validation of schedule requests: every rejection names its field."""

from datetime import UTC, datetime, timedelta

import pytest

from engine.control.schedule_requests import first_fire, parse_schedule_request
from schemas.errors import InvalidInput

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def body(**overrides):
    base = {"kind": "cron", "expression": "0 9 * * *", "time_zone": "Europe/Berlin", "target": "billing.invoice"}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def test_a_valid_cron_request_has_defaults_a_user_expects():
    request = parse_schedule_request(body())
    assert request.priority == "strict" and request.overlap_policy == "allow"
    assert request.misfire.kind == "fire_once" and request.max_attempts == 3
    assert first_fire(request, NOW) == datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def test_flexible_priority_gets_the_five_minute_window_by_default():
    assert parse_schedule_request(body(priority="flexible")).flexible_window == timedelta(minutes=5)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"expression": "0 0 30 2 *"}, "expression"),
        ({"expression": "61 * * * *"}, "expression"),
        ({"expression": None}, "expression"),
        ({"time_zone": "Mars/Olympus"}, "time_zone"),
        ({"target": None}, "target"),
        ({"target": "has space"}, "target"),
        ({"kind": "weekly"}, "kind"),
        ({"kind": None}, "kind"),
        ({"payload": {"blob": "x" * (64 * 1024)}}, "payload"),
        ({"priority": "urgent"}, "priority"),
        ({"misfire_policy": "catch_up"}, "misfire_policy"),
        ({"overlap_policy": "sometimes"}, "overlap_policy"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"retry_base": "0s"}, "retry_base"),
        ({"flexible_window": "5m"}, "flexible_window"),
        ({"colour": "blue"}, "colour"),
        ({"payload": {"note": "a\x00b"}}, "payload"),  # jsonb cannot store NUL: a 422, not a 500
        ({"payload": {"a\x00": [1]}}, "payload"),
        ({"payload": [{"deep": ["\x00"]}]}, "payload"),
    ],
)
def test_invalid_requests_name_the_field(overrides, field):
    with pytest.raises(InvalidInput) as caught:
        parse_schedule_request(body(**overrides))
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_payload_that_is_not_json_serializable_is_rejected():
    with pytest.raises(InvalidInput) as caught:
        parse_schedule_request(body(payload={"when": object()}))
    assert caught.value.field == "payload"


def test_once_in_the_past_beyond_lateness_is_rejected_but_just_late_fires_now():
    late = parse_schedule_request(body(kind="once", expression="2026-11-29T09:59:30Z", time_zone=None))
    assert first_fire(late, NOW) == datetime(2026, 11, 29, 9, 59, 30, tzinfo=UTC)
    stale = parse_schedule_request(body(kind="once", expression="2026-11-29T09:00:00Z", time_zone=None))
    with pytest.raises(InvalidInput) as caught:
        first_fire(stale, NOW)
    assert caught.value.field == "expression"


def test_preview_of_a_rate_is_anchored_like_a_schedule_created_at_that_instant():
    from engine.control.schedule_requests import preview_fires

    fires = preview_fires({"kind": "rate", "expression": "90m"}, NOW.replace(microsecond=123), 2)["fires"]
    assert [f["utc"] for f in fires] == ["2026-11-29T11:30:00Z", "2026-11-29T13:00:00Z"]


@pytest.mark.parametrize("count", [0, 1001, "3", True])
def test_preview_count_is_bounded(count):
    from engine.control.schedule_requests import preview_fires

    with pytest.raises(InvalidInput) as caught:
        preview_fires({"kind": "cron", "expression": "* * * * *"}, NOW, count)
    assert caught.value.field == "count"

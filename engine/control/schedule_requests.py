"""Schedule requests: a raw create, update or preview request turned into a validated value.

Every path that changes a schedule (the HTTP API, the CLI, the command topic,
the Python API) hands its request to this module, and every field is checked
here: unknown fields, the time fields (:func:`build_time_spec`), payload,
priority and flexible window, misfire policy, overlap policy, retries,
deadline. A rejected request raises :class:`InvalidInput` naming the field;
nothing has been written at that point. The values themselves follow the
time contract's text forms (:mod:`engine.rules.timing`: durations, instants,
zones, misfire policies, cron).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from engine.control.calendar_requests import validate_calendar_name
from engine.control.identifiers import expected_version
from engine.rules import timing
from engine.rules.cron_expression import MAX_EXPRESSION_LENGTH, normalize_cron, parse_cron
from engine.rules.exclusion_calendars import ExclusionCalendar
from engine.rules.overlap_policy import POLICIES as OVERLAP_POLICIES
from engine.rules.timing.instants import CEILING, DAY, MICROSECOND, UTC, iso, parse_instant
from engine.rules.timing.spec import DST_GAP_CHOICES, DST_REPEAT_CHOICES, KINDS, Kind, TimeSpec
from engine.rules.timing.zones import validate_zone, zone_info
from schemas.errors import InvalidInput
from schemas.messages import format_instant
from schemas.record_fields import json_problem
from schemas.topics import validate_target

MAX_PAYLOAD_BYTES = 64 * 1024
DEFAULT_RETRY_BASE = timedelta(seconds=1)
DEFAULT_RETRY_CAP = timedelta(minutes=5)
MAX_PREVIEW = 1000
PRIORITIES = ("strict", "flexible")

#: The fields of a schedule definition, as create and update accept them.
SCHEDULE_FIELDS = frozenset(
    {
        "kind",
        "expression",
        "time_zone",
        "target",
        "payload",
        "priority",
        "flexible_window",
        "misfire_policy",
        "max_lateness",
        "overlap_policy",
        "max_attempts",
        "retry_base",
        "retry_cap",
        "deadline",
        "dst_repeat",
        "dst_gap",
        "start_at",
        "end_at",
        "anchor",
        "exclusion_calendar",
        "max_runs",
    }
)
MAX_RUNS = 1_000_000_000
#: The fields a preview of a definition takes (besides ``from`` and ``count``).
PREVIEW_FIELDS = frozenset(
    {
        "kind",
        "expression",
        "time_zone",
        "dst_repeat",
        "dst_gap",
        "anchor",
        "start_at",
        "end_at",
        "exclusion_calendar",
        "max_runs",
    }
)


@dataclass(frozen=True)
class ScheduleRequest:
    """A validated request to create (or replace the definition of) a schedule."""

    spec: TimeSpec
    target: str
    payload: Any = field(default_factory=dict)
    priority: str = "strict"
    flexible_window: timedelta = timedelta(0)
    misfire: timing.MisfirePolicy = timing.MisfirePolicy("fire_once", 0, timedelta(minutes=1))
    misfire_text: str = "fire_once"
    overlap_policy: str = "allow"
    max_attempts: int = 3
    retry_base: timedelta = timedelta(seconds=1)
    retry_cap: timedelta = timedelta(minutes=5)
    deadline: timedelta | None = None
    calendar_name: str | None = None  # the tenant's exclusion calendar, resolved by the control plane
    max_runs: int | None = None  # the schedule completes after this many runs


def parse_schedule_request(raw: Mapping[str, Any], *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> ScheduleRequest:
    """Validate a create request given as API field names; raise InvalidInput naming the field."""
    if not isinstance(raw, Mapping):
        raise InvalidInput("body", "must be a JSON object", '{"kind": "cron", "expression": "0 9 * * *"}')
    _reject_unknown(raw)
    kind = raw.get("kind")
    expression = raw.get("expression")
    if not isinstance(kind, str):
        raise InvalidInput("kind", "is required: once, cron or rate", "cron")
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidInput(
            "expression", "is required: a cron expression, an ISO-8601 instant or a duration", "0 9 * * MON-FRI"
        )
    time_zone = raw.get("time_zone")
    if time_zone is not None and not isinstance(time_zone, str):
        raise InvalidInput("time_zone", "must be an IANA zone name", "Europe/Berlin")
    spec = build_time_spec(
        kind,
        expression,
        time_zone,
        dst_repeat=raw.get("dst_repeat"),
        dst_gap=raw.get("dst_gap"),
        anchor=raw.get("anchor"),
        start_at=raw.get("start_at"),
        end_at=raw.get("end_at"),
    )
    target = validate_target(raw.get("target"))
    # null means "no payload", like leaving it out (the column holds {} then, never SQL NULL).
    payload = validate_payload({} if raw.get("payload") is None else raw["payload"], max_payload_bytes)
    priority = _choice(raw, "priority", PRIORITIES, "strict")
    window = _flexible_window(raw, priority)
    misfire_text, misfire = _misfire(raw)
    overlap = _choice(raw, "overlap_policy", OVERLAP_POLICIES, "allow")
    max_attempts, retry_base, retry_cap, deadline = _retries(raw)
    return ScheduleRequest(
        spec=spec,
        target=target,
        payload=payload,
        priority=priority,
        flexible_window=window,
        misfire=misfire,
        misfire_text=misfire_text,
        overlap_policy=overlap,
        max_attempts=max_attempts,
        retry_base=retry_base,
        retry_cap=retry_cap,
        deadline=deadline,
        calendar_name=_calendar_name(raw),
        max_runs=parse_max_runs(raw.get("max_runs")),
    )


def _calendar_name(raw: Mapping[str, Any]) -> str | None:
    """The name of the tenant's exclusion calendar (resolved, tenant-scoped, by the control plane)."""
    name = raw.get("exclusion_calendar")
    return validate_calendar_name(name, "exclusion_calendar") if name is not None else None


def _flexible_window(raw: Mapping[str, Any], priority: str) -> timedelta:
    window = _duration(raw, "flexible_window", timedelta(0))
    assert window is not None
    if priority == "flexible" and window <= timedelta(0):
        window = timedelta(minutes=5)  # flexible jobs spread over 5 minutes by default (docs/time-contract.md)
    if priority == "strict" and window > timedelta(0):
        raise InvalidInput("flexible_window", "applies only to priority=flexible", "5m")
    return window


def _misfire(raw: Mapping[str, Any]) -> tuple[str, timing.MisfirePolicy]:
    """The misfire policy as written (stripped) and parsed, with max_lateness in seconds or as a duration."""
    misfire_text = raw.get("misfire_policy") or "fire_once"
    if not isinstance(misfire_text, str):
        raise InvalidInput("misfire_policy", "must be skip, fire_once or catch_up:K", "catch_up:3")
    return misfire_text.strip(), timing.parse_misfire_policy(misfire_text, _duration(raw, "max_lateness", None))


def _retries(raw: Mapping[str, Any]) -> tuple[int, timedelta, timedelta, timedelta | None]:
    """max_attempts, retry_base, retry_cap and deadline."""
    max_attempts = raw.get("max_attempts", 3)
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or not 1 <= max_attempts <= 100:
        raise InvalidInput("max_attempts", "must be an integer from 1 to 100", "5")
    # A default never contradicts the other field given: the cap defaults to 5 minutes or the base if that
    # is larger, the base to 1 s or the cap if that is smaller. Only two explicit values can disagree.
    retry_base = _duration(raw, "retry_base", None)
    retry_cap = _duration(raw, "retry_cap", None)
    if retry_base is None:
        retry_base = min(DEFAULT_RETRY_BASE, retry_cap) if retry_cap is not None else DEFAULT_RETRY_BASE
    if retry_cap is None:
        retry_cap = max(DEFAULT_RETRY_CAP, retry_base)
    if retry_cap < retry_base:
        raise InvalidInput("retry_cap", "must be at least retry_base", "5m")
    return max_attempts, retry_base, retry_cap, _duration(raw, "deadline", None)


def parse_max_runs(value: object) -> int | None:
    """``max_runs``: absent/null (no limit) or an integer from 1 to 10^9."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_RUNS:
        raise InvalidInput("max_runs", f"must be an integer from 1 to {MAX_RUNS} (or null for no limit)", "12")
    return value


def split_expected_version(changes: Mapping[str, Any]) -> tuple[int | None, Mapping[str, Any]]:
    """An update's ``expected_version`` (the version the caller read; None: unconditional) and its changes."""
    if not isinstance(changes, Mapping) or "expected_version" not in changes:
        return None, changes
    expected = expected_version(changes["expected_version"])
    return expected, {name: value for name, value in changes.items() if name != "expected_version"}


def check_changes(changes: Mapping[str, Any]) -> None:
    """An update names at least one known field (checked before anything is read or locked)."""
    if not isinstance(changes, Mapping) or not changes:
        raise InvalidInput("body", "give at least one field to change", '{"expression": "0 10 * * *"}')
    _reject_unknown(changes)


def parse_changed_request(
    definition: Mapping[str, Any], changes: Mapping[str, Any], *, max_payload_bytes: int = MAX_PAYLOAD_BYTES
) -> ScheduleRequest:
    """The request a partial update makes of a stored definition (API field names).

    A changed kind drops the old anchor unless a new one is given; DST options
    apply only to cron, so a definition that stops being cron drops them; a
    change to ``priority: strict`` drops the old flexible window unless one is
    given (a strict schedule has none).
    """
    check_changes(changes)
    merged = {**definition, **changes}
    if "kind" in changes and changes["kind"] != definition.get("kind") and "anchor" not in changes:
        merged.pop("anchor", None)
    if changes.get("priority") == "strict" and "flexible_window" not in changes:
        merged.pop("flexible_window", None)
    for name in ("dst_repeat", "dst_gap"):
        if merged.get("kind") != "cron" and name not in changes:
            merged.pop(name, None)
    return parse_schedule_request(merged, max_payload_bytes=max_payload_bytes)


def anchored(request: ScheduleRequest, now: datetime) -> ScheduleRequest:
    """A rate without an anchor is anchored at ``now``, on a whole second (so "every 10s" fires at
    readable instants); other requests are returned as they are."""
    if request.spec.kind != "rate" or request.spec.anchor is not None:
        return request
    return dataclasses.replace(request, spec=dataclasses.replace(request.spec, anchor=now.replace(microsecond=0)))


def first_fire(request: ScheduleRequest, now: datetime) -> datetime | None:
    """The first fire instant of a new schedule.

    cron and rate fire strictly after ``now`` (a rate without an anchor is
    anchored at ``now`` by :func:`anchored`, so it first fires one period
    later); a one-time instant slightly in the past (within max_lateness) is
    accepted and fires at once, further in the past it is rejected rather
    than silently never firing.
    """
    spec = request.spec
    if spec.kind == "once":
        first = timing.next_fire_after(spec, now - request.misfire.max_lateness - timedelta(microseconds=1))
        if first is None:
            raise InvalidInput(
                "expression",
                f"the instant {spec.expression} is already past (now is {format_instant(now)});"
                " choose a future instant",
                format_instant(now + timedelta(minutes=5)),
            )
        return first
    first = timing.next_fire_after(spec, now)
    if first is None:
        raise InvalidInput("end_at", "the schedule has no fire time before its end; move end_at later")
    return first


def validate_idempotency_key(key: object) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= 200 or "\x00" in key:
        raise InvalidInput("Idempotency-Key", "must be 1-200 characters (no NUL)", "create-invoice-42")
    return key


def request_hash(raw: Mapping[str, Any]) -> str:
    """A stable hash of a create request's body: the same key with another body is a conflict."""
    try:
        canonical = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError as err:
        raise InvalidInput("payload", f"must be JSON-serializable: {err}", '{"invoice": 42}') from err
    return hashlib.sha256(canonical).hexdigest()


def validate_payload(payload: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> Any:
    """The payload must be JSON, storable as PostgreSQL jsonb (no NUL character), and at most
    ``max_bytes`` once encoded."""
    try:
        encoded = orjson.dumps(payload)
    except TypeError as err:
        raise InvalidInput("payload", f"must be JSON-serializable: {err}", '{"invoice": 42}') from err
    problem = json_problem(payload)
    if problem is not None:  # jsonb cannot store a NUL (\\u0000); orjson encodes 254 levels at most
        raise InvalidInput("payload", problem, '{"invoice": 42}')
    if len(encoded) > max_bytes:
        raise InvalidInput(
            "payload",
            f"is {len(encoded)} bytes encoded; the limit is {max_bytes} bytes."
            " Store large data elsewhere and send a reference",
            '{"blob_url": "s3://bucket/key"}',
        )
    return payload


def preview_fires(
    raw: Mapping[str, Any], after: datetime, count: int, *, calendar: ExclusionCalendar | None = None, runs: int = 0
) -> dict[str, Any]:
    """The next ``count`` fires strictly after ``after`` of a schedule definition, and what is excluded.

    Uses the same rules as create: a rate without an anchor is anchored at
    ``after`` (whole seconds), as a schedule created at that instant would be.
    ``calendar`` is the definition's exclusion calendar (the caller resolves
    ``exclusion_calendar`` in the tenant); ``runs`` are the runs already
    counted against ``max_runs`` (a stored schedule's).

    Returns ``{"fires": [{"utc", "local", "rule"}], "excluded": [{"utc",
    "local", "date", "label"}], "excluded_dates": [{"start", "end", "label"}]}``
    and, with ``max_runs``, ``"runs_left"``. Local times carry their offset in
    the schedule's zone; ``excluded`` lists the fires the calendar removes in
    the window the fires span (at most :data:`MAX_PREVIEW`),
    ``excluded_dates`` the calendar's entries in that window.
    """
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_PREVIEW:
        raise InvalidInput("count", f"must be an integer from 1 to {MAX_PREVIEW}", "10")
    kind, expression = raw.get("kind"), raw.get("expression")
    if not isinstance(kind, str):
        raise InvalidInput("kind", "is required: once, cron or rate", "cron")
    if not isinstance(expression, str):
        raise InvalidInput(
            "expression", "is required: a cron expression, an ISO-8601 instant or a duration", "0 9 * * MON-FRI"
        )
    anchor = raw.get("anchor")
    if kind == "rate" and anchor is None:
        anchor = after.replace(microsecond=0)
    plain = build_time_spec(
        kind,
        expression,
        raw.get("time_zone"),
        dst_repeat=raw.get("dst_repeat"),
        dst_gap=raw.get("dst_gap"),
        anchor=anchor,
        start_at=raw.get("start_at"),
        end_at=raw.get("end_at"),
    )
    max_runs = parse_max_runs(raw.get("max_runs"))
    runs_left = max(max_runs - runs, 0) if max_runs is not None else None
    spec = dataclasses.replace(plain, calendar=calendar)
    fires = timing.preview(spec, after, min(count, runs_left) if runs_left is not None else count)
    result: dict[str, Any] = {
        "fires": [{"utc": format_instant(f.utc), "local": f.local.isoformat(), "rule": f.rule} for f in fires]
    }
    if runs_left is not None:
        result["runs_left"] = runs_left
    result["excluded"], result["excluded_dates"] = [], []
    if calendar is not None:
        window_end: datetime | None = fires[-1].utc if fires else None
        if len(fires) < count and (runs_left is None or len(fires) < runs_left):
            # Exhausted before `count` fires: the window reaches the last slot the definition has.
            window_end = timing.previous_fire_before(plain, CEILING.replace(tzinfo=UTC)) or window_end
        if window_end is not None:
            slots = timing.excluded_slots(spec, calendar, after, window_end, limit=MAX_PREVIEW)
            result["excluded"] = [
                {
                    "utc": format_instant(s.utc),
                    "local": s.local.isoformat(),
                    "date": s.date.isoformat(),
                    "label": s.label,
                }
                for s in slots
            ]
            clock = zone_info(calendar.zone_for(plain.time_zone))
            first, last = after.astimezone(clock).date(), window_end.astimezone(clock).date()
            result["excluded_dates"] = [
                {"start": e.start.isoformat(), "end": e.end.isoformat(), "label": e.label}
                for e in calendar.entries_between(first, last)
            ]
    return result


def build_time_spec(
    kind: str,
    expression: str,
    time_zone: str | None = None,
    *,
    dst_repeat: str | None = None,
    dst_gap: str | None = None,
    anchor: datetime | str | None = None,
    start_at: datetime | str | None = None,
    end_at: datetime | str | None = None,
) -> TimeSpec:
    """Validate and normalize a schedule's time fields, or raise :class:`InvalidInput`.

    ``InvalidInput.field`` is the API field at fault. A ``once`` instant in the
    past is accepted: whether it is too late is decided with the control
    plane's clock, not here.
    """
    kind_value = _kind(kind)
    stripped = _expression_text(expression, kind_value)
    zone_key = validate_zone(time_zone if time_zone is not None else "UTC")
    repeat, gap = _dst_options(kind_value, dst_repeat, dst_gap)
    anchor_at = parse_instant(anchor, "anchor") if anchor is not None else None
    if anchor_at is not None and kind_value != "rate":
        raise InvalidInput("anchor", "applies only to kind rate; leave it out", "2027-01-01T00:00:00Z")
    start = parse_instant(start_at, "start_at") if start_at is not None else None
    end = parse_instant(end_at, "end_at") if end_at is not None else None
    if start is not None and end is not None and end < start:
        raise InvalidInput("end_at", f"{iso(end)} is before start_at {iso(start)}", iso(start + DAY))
    text = _normalized_expression(kind_value, stripped, start, end)
    spec = TimeSpec(kind_value, text, zone_key, repeat, gap, anchor_at, start, end)  # type: ignore[arg-type]
    if kind_value != "once" and start is not None and end is not None:
        if timing.next_fire_after(spec, start - MICROSECOND) is None:
            raise InvalidInput(
                "end_at",
                f"there is no fire time between start_at {iso(start)} and end_at {iso(end)}; move end_at later",
                iso(end + timedelta(days=30)),
            )
    return spec


_EXAMPLES = {"cron": "0 9 * * MON-FRI", "rate": "15m", "once": "2027-03-01T09:00:00Z"}


def _kind(kind: object) -> Kind:
    if not isinstance(kind, str) or kind.strip() not in KINDS:
        shown = kind.strip()[:40] if isinstance(kind, str) else type(kind).__name__
        raise InvalidInput("kind", f"must be once, cron or rate; got {shown!r}", "cron")
    return kind.strip()  # type: ignore[return-value]


def _expression_text(expression: object, kind: Kind) -> str:
    """The expression stripped, or InvalidInput when it is not a string, too long or empty."""
    if not isinstance(expression, str):
        raise InvalidInput("expression", f"must be a string, got {type(expression).__name__}", _EXAMPLES[kind])
    stripped = expression.strip()
    if len(stripped) > MAX_EXPRESSION_LENGTH:
        raise InvalidInput(
            "expression", f"is {len(stripped)} characters long; the limit is {MAX_EXPRESSION_LENGTH}", _EXAMPLES[kind]
        )
    if not stripped:
        raise InvalidInput("expression", "is empty", _EXAMPLES[kind])
    return stripped


def _dst_options(kind: Kind, dst_repeat: object, dst_gap: object) -> tuple[str, str]:
    """dst_repeat and dst_gap (defaults first/skip); anything else applies only to cron."""
    repeat = _time_choice("dst_repeat", dst_repeat, DST_REPEAT_CHOICES)
    gap = _time_choice("dst_gap", dst_gap, DST_GAP_CHOICES)
    if kind != "cron":
        if repeat != "first":
            raise InvalidInput(
                "dst_repeat", f"applies only to kind cron ({kind} ignores wall-clock time); leave it out", "first"
            )
        if gap != "skip":
            raise InvalidInput(
                "dst_gap", f"applies only to kind cron ({kind} ignores wall-clock time); leave it out", "skip"
            )
    return repeat, gap


def _normalized_expression(kind: Kind, stripped: str, start: datetime | None, end: datetime | None) -> str:
    """The expression as stored: cron normalized and parsed, a rate's period checked, a one-time instant
    checked against the bounds."""
    if kind == "cron":
        text = normalize_cron(stripped)
        parse_cron(text)
        return text
    if kind == "rate":
        if timing.parse_duration(stripped, "expression") <= timedelta(0):
            raise InvalidInput("expression", "a rate period must be at least 1s", "15m")
        return stripped
    instant = parse_instant(stripped, "expression")
    if start is not None and instant < start:
        raise InvalidInput(
            "start_at", f"is after the one-time instant {iso(instant)}; the schedule could never fire", iso(instant)
        )
    if end is not None and instant > end:
        raise InvalidInput(
            "end_at", f"is before the one-time instant {iso(instant)}; the schedule could never fire", iso(instant)
        )
    return stripped


def _time_choice(field: str, value: object, choices: tuple[str, ...]) -> str:
    if value is None:
        return choices[0]
    if not isinstance(value, str) or value.strip() not in choices:
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise InvalidInput(field, f"must be {' or '.join(choices)}; got {shown!r}", choices[0])
    return value.strip()


def _reject_unknown(raw: Mapping[str, Any]) -> None:
    unknown = sorted(set(raw) - SCHEDULE_FIELDS)
    if unknown:
        raise InvalidInput(unknown[0], f"is not a schedule field; known fields: {', '.join(sorted(SCHEDULE_FIELDS))}")


@dataclass(frozen=True)
class DurationRange:
    """The accepted values of one duration field (stated in /openapi.json and docs/security.md).

    ``whole_seconds``: the engine stores the field in whole seconds, so a
    fraction is refused rather than silently truncated (``deadline: 0.5``
    would otherwise become "no deadline"). Otherwise fractions are honoured to
    the millisecond.
    """

    minimum: timedelta
    maximum: timedelta
    whole_seconds: bool = True


#: Every duration of a schedule and its range. A number means seconds; a string is "90s", "15m", "1h30m", "2d".
DURATIONS: dict[str, DurationRange] = {
    "flexible_window": DurationRange(timedelta(0), timedelta(hours=24)),
    "max_lateness": DurationRange(timedelta(0), timing.MAX_DURATION),
    "deadline": DurationRange(timedelta(seconds=1), timing.MAX_DURATION),
    "retry_base": DurationRange(timedelta(milliseconds=1), timing.MAX_DURATION, whole_seconds=False),
    "retry_cap": DurationRange(timedelta(milliseconds=1), timing.MAX_DURATION, whole_seconds=False),
}


def _duration(raw: Mapping[str, Any], name: str, default: timedelta | None) -> timedelta | None:
    """The duration field ``name`` within its DURATIONS range, or InvalidInput naming it."""
    value = raw.get(name)
    if value is None:
        return default
    limits = DURATIONS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidInput(name, f"must be a duration string or a number of seconds, got {type(value).__name__}", "90s")
    if isinstance(value, str):
        duration = timing.parse_duration(value, field=name)
    else:
        # Checked before any timedelta is built: timedelta(seconds=1e20) raises OverflowError.
        if not math.isfinite(value) or not -1 < value < limits.maximum.total_seconds() + 1:
            raise InvalidInput(name, f"{_seconds(value)} s is outside {_range(limits)}", "90s")
        if limits.whole_seconds and not float(value).is_integer():
            raise InvalidInput(
                name, f"{_seconds(value)} s is not a whole number of seconds; {name} is stored in whole seconds", "90s"
            )
        duration = timedelta(seconds=round(float(value), 3))
    if not limits.minimum <= duration <= limits.maximum:
        raise InvalidInput(name, f"{_seconds(duration.total_seconds())} s is outside {_range(limits)}", "90s")
    return duration


def _seconds(value: float) -> str:
    return f"{value:g}"


def _range(limits: DurationRange) -> str:
    unit = "whole seconds" if limits.whole_seconds else "seconds (to the millisecond)"
    return (
        f"the accepted range {_seconds(limits.minimum.total_seconds())} to"
        f" {_seconds(limits.maximum.total_seconds())} {unit}"
    )


def _choice(raw: Mapping[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    value = raw.get(name, default)
    if value is None:
        return default
    if value not in choices:
        raise InvalidInput(name, f"must be one of {', '.join(choices)}; got {str(value)[:60]!r}", choices[0])
    return value

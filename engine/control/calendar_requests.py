"""Calendar requests: a raw create or update of an exclusion calendar turned into a validated value.

A calendar is written as::

    {"name": "de-holidays", "time_zone": "Europe/Berlin", "description": "...",
     "dates": ["2026-12-25", "2026-12-24/2026-12-26",
               {"date": "2026-01-01", "label": "Neujahr"},
               {"start": "2026-07-20", "end": "2026-07-31", "label": "Betriebsferien"}]}

Dates are ISO ``YYYY-MM-DD``; a range ``start/end`` (or ``{"start", "end"}``)
includes both ends. ``time_zone`` null or absent means each referencing
schedule reads the dates on its own clock. Every field is checked here and a
rejected request raises :class:`InvalidInput` naming the field
(``dates[3].end``); nothing has been written at that point.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

from engine.control.identifiers import expected_version
from engine.rules.exclusion_calendars import FIRST_YEAR, LAST_YEAR, MAX_ENTRIES, CalendarEntry
from engine.rules.timing.zones import validate_zone
from schemas.errors import InvalidInput

CALENDAR_FIELDS = frozenset({"name", "time_zone", "description", "dates"})
CHANGE_FIELDS = frozenset({"time_zone", "description", "dates", "expected_version"})
MAX_DESCRIPTION = 500
MAX_LABEL = 200
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_EXAMPLE_DATES = '["2026-12-25", "2026-12-24/2026-12-26", {"date": "2026-01-01", "label": "New Year"}]'


@dataclass(frozen=True)
class CalendarRequest:
    """A validated calendar definition (create, or the whole definition after an update)."""

    name: str
    time_zone: str | None
    description: str
    entries: tuple[CalendarEntry, ...]


@dataclass(frozen=True)
class CalendarChanges:
    """A validated partial update; None means "leave as it is" (``time_zone_set`` tells null from absent)."""

    time_zone: str | None
    time_zone_set: bool
    description: str | None
    entries: tuple[CalendarEntry, ...] | None
    expected_version: int | None


def validate_calendar_name(value: object, field: str = "name") -> str:
    """A calendar name: 1-63 of a-z 0-9 _ . - starting with a letter or digit."""
    if not isinstance(value, str) or not _NAME.match(value):
        shown = value[:70] if isinstance(value, str) else type(value).__name__
        raise InvalidInput(
            field,
            f"{shown!r} is not a calendar name: 1-63 characters a-z 0-9 _ . - starting with a letter or digit",
            "de-holidays",
        )
    return value


def parse_calendar_request(raw: Mapping[str, Any]) -> CalendarRequest:
    """Validate a create request (API field names) or raise InvalidInput naming the field."""
    if not isinstance(raw, Mapping):
        raise InvalidInput("body", "must be a JSON object", '{"name": "holidays", "dates": ["2026-12-25"]}')
    _reject_unknown(raw, CALENDAR_FIELDS, "calendar")
    name = validate_calendar_name(raw.get("name"))
    if "dates" not in raw:
        raise InvalidInput("dates", "is required: a list of dates and date ranges (may be empty)", _EXAMPLE_DATES)
    return CalendarRequest(
        name, _zone(raw.get("time_zone")), _description(raw.get("description")), parse_dates(raw["dates"])
    )


def parse_calendar_changes(raw: Mapping[str, Any]) -> CalendarChanges:
    """Validate an update: at least one of time_zone, description, dates (which replaces the whole list)."""
    if not isinstance(raw, Mapping) or not (set(raw) - {"expected_version"}):
        raise InvalidInput("body", "give at least one of time_zone, description, dates", '{"dates": ["2026-12-25"]}')
    _reject_unknown(raw, CHANGE_FIELDS, "calendar update")
    # Absent: unconditional. Present, it must be a version, null included: the document says so, a schedule
    # update says so, and a condition that a client's null turned into no condition would overwrite silently.
    expected = expected_version(raw["expected_version"]) if "expected_version" in raw else None
    return CalendarChanges(
        time_zone=_zone(raw.get("time_zone")) if "time_zone" in raw else None,
        time_zone_set="time_zone" in raw,
        description=_description(raw["description"]) if "description" in raw else None,
        entries=parse_dates(raw["dates"]) if "dates" in raw else None,
        expected_version=expected,
    )


def parse_dates(value: object, field: str = "dates") -> tuple[CalendarEntry, ...]:
    """A list of dates and ranges as entries, in the order given."""
    if not isinstance(value, list):
        raise InvalidInput(
            field, f"must be a list of dates and date ranges, got {type(value).__name__}", _EXAMPLE_DATES
        )
    if len(value) > MAX_ENTRIES:
        raise InvalidInput(
            field,
            f"has {len(value)} entries; the limit is {MAX_ENTRIES} (write long stretches as ranges)",
            _EXAMPLE_DATES,
        )
    return tuple(_entry(item, f"{field}[{index}]") for index, item in enumerate(value))


def _entry(item: object, field: str) -> CalendarEntry:
    if isinstance(item, str):
        first, slash, last = item.strip().partition("/")
        start = _date(first, field)
        end = _date(last, field) if slash else start
        label = None
    elif isinstance(item, Mapping):
        unknown = sorted(set(item) - {"date", "start", "end", "label"})
        if unknown:
            raise InvalidInput(
                f"{field}.{unknown[0]}",
                "is not a date field; use date, or start and end, and label",
                '{"start": "2026-12-24", "end": "2026-12-26", "label": "Christmas"}',
            )
        if "date" in item:
            if "start" in item or "end" in item:
                raise InvalidInput(
                    f"{field}.date", "give either date, or start and end, not both", '{"date": "2026-12-25"}'
                )
            start = end = _date(item["date"], f"{field}.date")
        else:
            if "start" not in item:
                raise InvalidInput(
                    f"{field}.start",
                    "is required (or give date for a single day)",
                    '{"start": "2026-12-24", "end": "2026-12-26"}',
                )
            start = _date(item["start"], f"{field}.start")
            end = _date(item["end"], f"{field}.end") if item.get("end") is not None else start
        label = item.get("label")
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL):
            raise InvalidInput(f"{field}.label", f"must be a string of at most {MAX_LABEL} characters", "Christmas")
        label = (label.strip() or None) if isinstance(label, str) else None
    else:
        raise InvalidInput(field, f"must be a date string or an object, got {type(item).__name__}", _EXAMPLE_DATES)
    if end < start:
        raise InvalidInput(
            field if isinstance(item, str) else f"{field}.end",
            f"{end.isoformat()} is before {start.isoformat()}; a range runs forwards and includes both ends",
            f"{end.isoformat()}/{start.isoformat()}",
        )
    return CalendarEntry(start, end, label)


def _date(value: object, field: str) -> date:
    example = "2026-12-25"
    if not isinstance(value, str) or not _DATE.match(value.strip()):
        shown = value[:30] if isinstance(value, str) else type(value).__name__
        raise InvalidInput(field, f"{shown!r} is not a date YYYY-MM-DD (ranges: YYYY-MM-DD/YYYY-MM-DD)", example)
    try:
        day = date.fromisoformat(value.strip())
    except ValueError:
        raise InvalidInput(field, f"{value.strip()!r} is not a calendar date", example) from None
    if not FIRST_YEAR <= day.year <= LAST_YEAR:
        raise InvalidInput(field, f"year {day.year} is outside {FIRST_YEAR}-{LAST_YEAR}", example)
    return day


def _zone(value: object) -> str | None:
    if value is None:
        return None
    return validate_zone(value)


def _description(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION:
        raise InvalidInput(
            "description", f"must be a string of at most {MAX_DESCRIPTION} characters", "Public holidays of Berlin"
        )
    return value.strip()


def _reject_unknown(raw: Mapping[str, Any], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidInput(unknown[0], f"is not a {what} field; known fields: {', '.join(sorted(known))}")


def entries_to_json(entries: tuple[CalendarEntry, ...]) -> list[dict[str, Any]]:
    """The public form of entries: ``{"start", "end", "label"}``, both ends included."""
    return [{"start": e.start.isoformat(), "end": e.end.isoformat(), "label": e.label} for e in entries]

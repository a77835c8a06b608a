"""Importing exclusion dates from iCalendar files of all-day events."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from engine.control.icalendar_import import MAX_ICS_BYTES, parse_icalendar_dates
from engine.rules.exclusion_calendars import CalendarEntry
from schemas.errors import InvalidInput

BERLIN = Path(__file__).parent / "calendars" / "holidays_berlin_2026.ics"


def ics(*events: str, head: str = "") -> str:
    body = "".join(f"BEGIN:VEVENT\nUID:{n}@test\n{e}\nEND:VEVENT\n" for n, e in enumerate(events))
    return f"BEGIN:VCALENDAR\nVERSION:2.0\n{head}{body}END:VCALENDAR\n"


def test_a_real_shaped_file_with_folding_alarms_timezones_and_a_cancelled_event() -> None:
    imported = parse_icalendar_dates(BERLIN.read_bytes())
    assert imported.entries == (
        CalendarEntry(date(2026, 1, 1), date(2026, 1, 1), "Neujahr"),
        CalendarEntry(date(2026, 4, 3), date(2026, 4, 3), "Karfreitag"),  # no DTEND: one day
        CalendarEntry(date(2026, 4, 6), date(2026, 4, 6), "Ostermontag"),  # DURATION:P1D
        CalendarEntry(date(2026, 5, 1), date(2026, 5, 1), "Tag der Arbeit, Maifeiertag"),  # escaped comma
        # DTEND is exclusive; the folded SUMMARY is joined.
        CalendarEntry(
            date(2026, 12, 24),
            date(2027, 1, 1),
            "Betriebsferien zwischen den Jahren (Weihnachten bis Neujahr einschliesslich)",
        ),
    )
    assert (imported.events, imported.cancelled) == (6, 1)
    assert imported.calendar_name == "Feiertage Berlin 2026"


def test_lf_line_endings_bom_and_a_date_without_value_parameter() -> None:
    text = "\ufeff" + ics("DTSTART:20261225\nDTEND:20261227")
    assert parse_icalendar_dates(text.encode()).entries == (CalendarEntry(date(2026, 12, 25), date(2026, 12, 26)),)


def test_week_durations() -> None:
    assert parse_icalendar_dates(ics("DTSTART;VALUE=DATE:20260803\nDURATION:P2W")).entries == (
        CalendarEntry(date(2026, 8, 3), date(2026, 8, 16)),
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("hello", "must start with BEGIN:VCALENDAR"),
        (ics("DTSTART:20261225T090000Z"), "has a time of day"),
        (ics("DTSTART;TZID=Europe/Berlin:20261225T090000"), "has a time of day"),
        (ics("DTSTART;VALUE=DATE-TIME:20261225T090000"), "has a time of day"),
        (ics("DTSTART;VALUE=DATE:20261225\nRRULE:FREQ=YEARLY"), "RRULE (a recurring event) is not supported"),
        (ics("DTSTART;VALUE=DATE:20261225\nRDATE;VALUE=DATE:20271225"), "RDATE"),
        (ics("DTSTART;VALUE=DATE:20261225\nDTEND;VALUE=DATE:20261225"), "ends on or before it starts"),
        (ics("DTSTART;VALUE=DATE:20261225\nDTEND;VALUE=DATE:20261226\nDURATION:P1D"), "both DTEND and DURATION"),
        (ics("DTSTART;VALUE=DATE:20261225\nDURATION:PT12H"), "whole number of days"),
        (ics("DTSTART;VALUE=DATE:20260230"), "is not a calendar date"),
        (ics("DTSTART;VALUE=DATE:18991231"), "outside 1900-8999"),
        (ics("SUMMARY:no date"), "has no DTSTART"),
        (ics(), "contains no VEVENT"),
        ("BEGIN:VCALENDAR\nBEGIN:VEVENT\nDTSTART;VALUE=DATE:20261225\n", "ends inside BEGIN:VEVENT"),
        ("BEGIN:VCALENDAR\nBEGIN:VEVENT\nEND:VCALENDAR\n", "does not close BEGIN:VEVENT"),
        ("BEGIN:VCALENDAR\nBEGIN:VEVENT\nnonsense\nEND:VEVENT\nEND:VCALENDAR\n", "line 3"),
    ],
)
def test_rejected_with_the_line_and_what_to_do(text: str, problem: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_icalendar_dates(text)
    assert caught.value.field == "ics"
    assert problem in str(caught.value)


def test_not_utf8_and_too_large() -> None:
    with pytest.raises(InvalidInput, match="not UTF-8"):
        parse_icalendar_dates(b"BEGIN:VCALENDAR\n\xff\xfe")
    with pytest.raises(InvalidInput, match="the limit is"):
        parse_icalendar_dates(b" " * (MAX_ICS_BYTES + 1))


def test_quoted_parameter_with_a_colon_and_labels_are_bounded() -> None:
    text = ics('DTSTART;VALUE=DATE;X-NOTE="a:b":20261225\nSUMMARY:' + "x" * 500)
    (entry,) = parse_icalendar_dates(text).entries
    assert entry.start == date(2026, 12, 25) and entry.label == "x" * 200

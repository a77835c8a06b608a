"""Reading exclusion dates from an iCalendar (RFC 5545) file of all-day events.

The subset: ``VEVENT`` components with ``DTSTART;VALUE=DATE:YYYYMMDD`` and an
optional ``DTEND;VALUE=DATE`` (exclusive, as RFC 5545 says: an event on 25
December ends on the 26th) or ``DURATION:PnD``/``PnW``; without either the
event lasts one day. ``SUMMARY`` becomes the entry's label. Lines may be
folded and end in CRLF or LF; other properties and components (VTIMEZONE,
VALARM, X- properties) are ignored. Events with ``STATUS:CANCELLED`` are
skipped and counted.

Rejected, with the line number, rather than silently losing dates: timed
events (a DTSTART with a time), recurring events (RRULE, RDATE, EXDATE:
expand them into dates first; published holiday calendars list each year's
dates), DTEND not after DTSTART, unterminated components, and files with no
events. All-day dates are floating: the calendar's ``time_zone`` (or each
schedule's zone) says which clock they are read on; X-WR-TIMEZONE is ignored.

Written here rather than with the ``icalendar`` package: the subset is about
a hundred lines, and an all-day-date reader needs none of time zones and
recurrence that the package exists for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, timedelta

from engine.rules.exclusion_calendars import FIRST_YEAR, LAST_YEAR, MAX_ENTRIES, CalendarEntry
from schemas.errors import InvalidInput

MAX_ICS_BYTES = 1024 * 1024
MAX_LABEL = 200
_FIELD = "ics"
_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})$")
_DURATION = re.compile(r"^\+?P(?:(\d{1,5})W|(\d{1,5})D(?:T0+H)?(?:0+M)?(?:0+S)?)$")
_RECURRENCE = ("RRULE", "RDATE", "EXDATE")


@dataclass(frozen=True)
class ImportedDates:
    """What an iCalendar file lists: one entry per all-day event, in file order."""

    entries: tuple[CalendarEntry, ...]
    events: int  # VEVENTs read, cancelled ones included
    cancelled: int  # skipped because STATUS:CANCELLED
    calendar_name: str | None  # X-WR-CALNAME, if any (informational)


@dataclass
class _Event:
    line: int
    start: date | None = None
    end: date | None = None
    duration: timedelta | None = None
    summary: str | None = None
    cancelled: bool = False


def parse_icalendar_dates(data: bytes | str) -> ImportedDates:
    """The all-day events of an iCalendar file as calendar entries, or InvalidInput for field ``ics``."""
    lines = _unfold(_text_of(data))
    if not lines or lines[0][1].upper() != "BEGIN:VCALENDAR":
        raise InvalidInput(
            _FIELD,
            "is not an iCalendar file: it must start with BEGIN:VCALENDAR",
            "BEGIN:VCALENDAR ... BEGIN:VEVENT DTSTART;VALUE=DATE:20261225 ... END:VCALENDAR",
        )
    reader = _Reader()
    for number, line in lines:
        reader.read(number, *_split(line, number))
    return reader.result()


def _text_of(data: bytes | str) -> str:
    if isinstance(data, str):
        return data.removeprefix("\ufeff")
    if len(data) > MAX_ICS_BYTES:
        raise InvalidInput(_FIELD, f"is {len(data)} bytes; the limit is {MAX_ICS_BYTES}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InvalidInput(_FIELD, f"is not UTF-8 text (byte {err.start})") from None


class _Reader:
    """Reads content lines one at a time: components nest on a stack, VEVENTs become entries."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.event: _Event | None = None
        self.entries: list[CalendarEntry] = []
        self.events = 0
        self.cancelled = 0
        self.calendar_name: str | None = None

    def read(self, number: int, name: str, params: dict[str, str], value: str) -> None:
        if name == "BEGIN":
            self.stack.append(value.upper())
            if self.stack == ["VCALENDAR", "VEVENT"]:
                self.event = _Event(number)
        elif name == "END":
            self._end(number, value.upper())
        elif self.stack == ["VCALENDAR"] and name == "X-WR-CALNAME":
            self.calendar_name = _text(value)[:MAX_LABEL]
        elif self.event is not None and self.stack == ["VCALENDAR", "VEVENT"]:
            _event_property(self.event, number, name, params, value)
        # Anything else: properties of the calendar itself, VTIMEZONE, VALARM inside an event...

    def _end(self, number: int, component: str) -> None:
        if not self.stack or self.stack[-1] != component:
            opened = ("BEGIN:" + self.stack[-1]) if self.stack else "anything"
            raise InvalidInput(_FIELD, f"line {number}: END:{component[:30]} does not close {opened}")
        self.stack.pop()
        if component != "VEVENT" or self.event is None or self.stack != ["VCALENDAR"]:
            return
        self.events += 1
        if self.event.cancelled:
            self.cancelled += 1
        else:
            self.entries.append(_entry(self.event))
            if len(self.entries) > MAX_ENTRIES:
                raise InvalidInput(_FIELD, f"lists more than {MAX_ENTRIES} events; split the calendar")
        self.event = None

    def result(self) -> ImportedDates:
        if self.stack:
            top = self.stack[-1]
            raise InvalidInput(_FIELD, f"ends inside BEGIN:{top}; the file is cut short or misses END:{top}")
        if self.events == 0:
            raise InvalidInput(
                _FIELD,
                "contains no VEVENT; an exclusion calendar is imported from all-day events",
                "BEGIN:VEVENT DTSTART;VALUE=DATE:20261225 END:VEVENT",
            )
        return ImportedDates(tuple(self.entries), self.events, self.cancelled, self.calendar_name)


def _event_property(event: _Event, number: int, name: str, params: dict[str, str], value: str) -> None:
    if name == "DTSTART":
        event.start = _date_value(params, value, number, "DTSTART")
    elif name == "DTEND":
        event.end = _date_value(params, value, number, "DTEND")
    elif name == "DURATION":
        event.duration = _duration(value, number)
    elif name == "SUMMARY":
        event.summary = _text(value)[:MAX_LABEL] or None
    elif name == "STATUS":
        event.cancelled = value.strip().upper() == "CANCELLED"
    elif name in _RECURRENCE:
        raise InvalidInput(
            _FIELD,
            f"line {number}: {name} (a recurring event) is not supported; list each"
            " date as its own event (published holiday calendars do)",
            "BEGIN:VEVENT DTSTART;VALUE=DATE:20261225 SUMMARY:Christmas END:VEVENT",
        )


def _unfold(text: str) -> list[tuple[int, str]]:
    """Content lines with their first physical line number; a line starting with space or tab continues the last."""
    lines: list[tuple[int, str]] = []
    for number, raw in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), start=1):
        if raw[:1] in (" ", "\t") and lines:
            lines[-1] = (lines[-1][0], lines[-1][1] + raw[1:])
        elif raw.strip():
            lines.append((number, raw))
    return lines


def _split(line: str, number: int) -> tuple[str, dict[str, str], str]:
    """NAME;PARAM=VALUE;...:value, with quoted parameter values allowed."""
    head, colon, value = _partition_outside_quotes(line)
    if not colon:
        raise InvalidInput(_FIELD, f"line {number}: {line[:40]!r} is not a content line NAME:value")
    name, *raw_params = head.split(";")
    params: dict[str, str] = {}
    for raw in raw_params:
        key, _, param_value = raw.partition("=")
        params[key.strip().upper()] = param_value.strip().strip('"')
    return name.strip().upper(), params, value


def _partition_outside_quotes(line: str) -> tuple[str, str, str]:
    quoted = False
    for index, char in enumerate(line):
        if char == '"':
            quoted = not quoted
        elif char == ":" and not quoted:
            return line[:index], ":", line[index + 1 :]
    return line, "", ""


def _date_value(params: dict[str, str], value: str, number: int, name: str) -> date:
    raw = value.strip()
    kind = params.get("VALUE", "").upper()
    if kind not in ("", "DATE") or "T" in raw.upper() or "TZID" in params:
        raise InvalidInput(
            _FIELD,
            f"line {number}: {name} {raw[:30]!r} has a time of day; only all-day events"
            f" ({name};VALUE=DATE:YYYYMMDD) can exclude dates",
            f"{name};VALUE=DATE:20261225",
        )
    match = _DATE.match(raw)
    if match is None:
        raise InvalidInput(
            _FIELD, f"line {number}: {name} {raw[:30]!r} is not a date YYYYMMDD", f"{name};VALUE=DATE:20261225"
        )
    try:
        day = date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    except ValueError:
        raise InvalidInput(_FIELD, f"line {number}: {name} {raw!r} is not a calendar date") from None
    if not FIRST_YEAR <= day.year <= LAST_YEAR:
        raise InvalidInput(_FIELD, f"line {number}: {name} year {day.year} is outside {FIRST_YEAR}-{LAST_YEAR}")
    return day


def _duration(value: str, number: int) -> timedelta:
    match = _DURATION.match(value.strip().upper())
    if match is None:
        raise InvalidInput(
            _FIELD,
            f"line {number}: DURATION {value.strip()[:30]!r} is not a whole number of days or weeks (P1D, P2W)",
            "DURATION:P1D",
        )
    weeks, days = match.groups()
    return timedelta(weeks=int(weeks)) if weeks else timedelta(days=int(days))


def _entry(event: _Event) -> CalendarEntry:
    if event.start is None:
        raise InvalidInput(_FIELD, f"line {event.line}: the VEVENT has no DTSTART", "DTSTART;VALUE=DATE:20261225")
    if event.end is not None and event.duration is not None:
        raise InvalidInput(_FIELD, f"line {event.line}: the VEVENT has both DTEND and DURATION; RFC 5545 allows one")
    if event.end is not None:
        exclusive = event.end
    elif event.duration is not None:
        exclusive = event.start + event.duration
    else:
        exclusive = event.start + timedelta(days=1)  # RFC 5545: an all-day DTSTART alone lasts one day
    if exclusive <= event.start:
        raise InvalidInput(
            _FIELD,
            f"line {event.line}: the VEVENT ends on or before it starts"
            f" ({event.start.isoformat()}); DTEND is exclusive: a one-day event on 25 December"
            " has DTEND 26 December",
            "DTEND;VALUE=DATE:20261226",
        )
    return CalendarEntry(event.start, exclusive - timedelta(days=1), event.summary)


def _text(value: str) -> str:
    """An iCalendar TEXT value unescaped (\\, \\; \\, \\n)."""
    return re.sub(r"\\([\\;,nN])", lambda m: "\n" if m.group(1) in "nN" else m.group(1), value).strip()

"""Golden fire times: two years of fires for a corpus of (expression, zone, DST options).

tests/unit/golden/fire_times.json is committed. Any difference fails loudly:
usually a tzdata upgrade (zone rules changed), a croniter upgrade, or a change
to engine/timing.py. Review the reported differences; if they are intended,
regenerate the file and commit it with the reason:

    cd /work/main && /work/venv/bin/python -m tests.unit.test_timing_golden --regenerate

Daily, weekly and monthly expressions cover the full two years; sub-daily ones
only the days around each DST transition, to keep the file small.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.control.schedule_requests import build_time_spec
from engine.rules.timing import fire_times

UTC = UTC
GOLDEN = Path(__file__).parent / "golden" / "fire_times.json"
FROM = datetime(2027, 1, 1, tzinfo=UTC)
UNTIL = datetime(2029, 1, 1, tzinfo=UTC)
REGENERATE = "cd /work/main && /work/venv/bin/python -m tests.unit.test_timing_golden --regenerate"

# Transition days in 2027-2028 (UTC dates), for the windows of sub-daily expressions.
NORTH_AMERICA = ("2027-03-14", "2027-11-07", "2028-03-12", "2028-11-05")
EUROPE = ("2027-03-28", "2027-10-31", "2028-03-26", "2028-10-29")
BEIRUT = ("2027-03-27", "2027-10-30", "2028-03-25", "2028-10-28")
LORD_HOWE = ("2027-04-03", "2027-10-02", "2028-04-01", "2028-09-30")
CHATHAM = ("2027-04-03", "2027-09-25", "2028-04-01", "2028-09-23")
SANTIAGO = ("2027-04-04", "2027-09-05", "2028-04-02", "2028-09-03")


@dataclass(frozen=True)
class Entry:
    expression: str
    time_zone: str
    dst_repeat: str = "first"
    dst_gap: str = "skip"
    around: tuple[str, ...] = ()  # transition days; empty = the whole two years

    def windows(self) -> list[tuple[datetime, datetime]]:
        if not self.around:
            return [(FROM, UNTIL)]
        found = []
        for day in self.around:
            middle = datetime.combine(date.fromisoformat(day), datetime.min.time(), UTC)
            found.append((middle - timedelta(days=2), middle + timedelta(days=3)))
        return found

    def key(self) -> dict[str, object]:
        return {
            "expression": self.expression,
            "time_zone": self.time_zone,
            "dst_repeat": self.dst_repeat,
            "dst_gap": self.dst_gap,
            "windows": [[_iso(low), _iso(high)] for low, high in self.windows()],
        }


CORPUS = [
    # Daily, whole two years.
    Entry("0 9 * * *", "America/New_York"),
    Entry("30 2 * * *", "America/New_York"),  # in the spring gap: skipped
    Entry("30 2 * * *", "America/New_York", dst_gap="shift"),  # in the spring gap: 03:00
    Entry("30 1 * * *", "America/New_York", dst_repeat="both"),  # in the repeated hour: twice
    Entry("0 0 * * *", "America/Santiago", dst_gap="shift"),  # midnight transitions
    Entry("30 0 * * *", "America/Havana", dst_repeat="both"),  # midnight transitions
    Entry("0 0 * * *", "Asia/Beirut"),  # midnight transitions
    Entry("15 2 * * *", "Australia/Lord_Howe", "both", "shift"),  # 30-minute DST
    Entry("45 2 * * *", "Pacific/Chatham"),  # +12:45, gap 02:45-03:45
    Entry("30 1 * * *", "Europe/Dublin", dst_repeat="both"),  # negative DST in tzdata
    Entry("0 12 * * MON-FRI", "Europe/London"),
    # Weekly, monthly, yearly, calendar edges.
    Entry("0 1 * * 0", "Europe/Berlin"),
    Entry("0 9 * * 1", "Asia/Kolkata"),
    Entry("@monthly", "Asia/Tokyo"),
    Entry("0 0 31 * *", "Europe/Berlin"),
    Entry("0 12 29 2 *", "UTC"),
    Entry("0 0 13 * 5", "America/Chicago"),  # OR rule: the 13th or any Friday
    Entry("0 8 1-7 * MON", "Australia/Sydney"),  # OR rule, not "first Monday"
    # Sub-daily, only around the transitions.
    Entry("*/30 * * * *", "America/St_Johns", dst_repeat="both", around=NORTH_AMERICA),
    Entry("0 * * * *", "Pacific/Chatham", dst_gap="shift", around=CHATHAM),
    Entry("@hourly", "Asia/Beirut", dst_repeat="both", around=BEIRUT),
    Entry("*/20 1-3 * * *", "Australia/Lord_Howe", "both", "shift", around=LORD_HOWE),
    Entry("15 * * * *", "America/Santiago", "both", "shift", around=SANTIAGO),
    Entry("0,30 * * * *", "Europe/London", around=EUROPE),
]


def _iso(instant: datetime) -> str:
    """Minute precision ("2027-01-01T14:00Z") unless there are seconds: keeps the file small."""
    instant = instant.astimezone(UTC)
    if instant.second == 0 and instant.microsecond == 0:
        return instant.strftime("%Y-%m-%dT%H:%MZ")
    return instant.isoformat().replace("+00:00", "Z")


def dump(content: dict[str, object]) -> str:
    """JSON with one fire per line, so a diff shows exactly which instants moved."""
    lines = [
        "{",
        f' "about": {json.dumps(content["about"])},',
        f' "generated_with": {json.dumps(content["generated_with"])},',
        ' "entries": [',
    ]
    entries = content["entries"]
    assert isinstance(entries, list)
    for number, entry in enumerate(entries):
        head = json.dumps({k: v for k, v in entry.items() if k != "fires"})[:-1]
        fires = ",\n".join(json.dumps(fire) for fire in entry["fires"])
        lines.append(f'  {head}, "fires": [\n{fires}\n  ]}}' + ("," if number < len(entries) - 1 else ""))
    lines += [" ]", "}", ""]
    return "\n".join(lines)


def compute(entry: Entry) -> list[str]:
    spec = build_time_spec(
        "cron", entry.expression, entry.time_zone, dst_repeat=entry.dst_repeat, dst_gap=entry.dst_gap
    )
    fires: list[str] = []
    for low, high in entry.windows():
        fires.extend(_iso(t) for t in fire_times(spec, low, 100_000, high))
    return fires


def tzdata_version() -> str:
    """Which zone data zoneinfo reads here: the system's (TZPATH) or the tzdata package."""
    for root in zoneinfo.TZPATH:
        if os.path.exists(os.path.join(root, "America", "New_York")):
            version_file = os.path.join(root, "tzdata.zi")
            if os.path.exists(version_file):
                with open(version_file, encoding="utf-8") as handle:
                    first = handle.readline().strip()
                return f"system {first.removeprefix('# version ')} ({root})"
            return f"system unknown ({root})"
    try:
        return f"tzdata package {metadata.version('tzdata')}"
    except metadata.PackageNotFoundError:
        return "unknown"


def versions() -> dict[str, str]:
    return {"tzdata": tzdata_version(), "croniter": metadata.version("croniter"), "python": platform.python_version()}


def generate() -> dict[str, object]:
    return {
        "about": "Fire times (UTC) per (expression, zone, DST options); see tests/unit/test_timing_golden.py."
        f" Regenerate: {REGENERATE}",
        "generated_with": versions(),
        "entries": [{**entry.key(), "fires": compute(entry)} for entry in CORPUS],
    }


def test_golden_fire_times() -> None:
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    entries = golden["entries"]
    assert [{k: v for k, v in e.items() if k != "fires"} for e in entries] == [e.key() for e in CORPUS], (
        f"The corpus in test_timing_golden.py no longer matches {GOLDEN.name}; regenerate it: {REGENERATE}"
    )
    problems = []
    for entry, stored in zip(CORPUS, entries, strict=True):
        now = compute(entry)
        if now == stored["fires"]:
            continue
        index = next(
            (i for i, (a, b) in enumerate(zip(now, stored["fires"], strict=False)) if a != b),
            min(len(now), len(stored["fires"])),
        )
        problems.append(
            f"  {entry.expression!r} in {entry.time_zone} ({entry.dst_repeat}/{entry.dst_gap}):"
            f" {len(stored['fires'])} fires stored, {len(now)} now; first difference at #{index}:"
            f" stored {stored['fires'][index] if index < len(stored['fires']) else 'nothing'},"
            f" now {now[index] if index < len(now) else 'nothing'}"
        )
    assert not problems, (
        "FIRE TIMES CHANGED. A tzdata or croniter upgrade (or a change to engine/timing.py) moved when"
        " schedules fire; running schedules would fire at different instants.\n"
        f"  generated with: {golden['generated_with']}\n  running with:   {versions()}\n"
        + "\n".join(problems)
        + f"\nIf the change is intended, regenerate and commit the file with the reason: {REGENERATE}"
    )


def test_golden_file_stays_small() -> None:
    assert GOLDEN.stat().st_size < 300_000


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(f"usage: python -m tests.unit.test_timing_golden --regenerate\n{__doc__}")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    content = generate()
    text = dump(content)
    GOLDEN.write_text(text, encoding="utf-8")
    entries: Any = content["entries"]
    fires = sum(len(e["fires"]) for e in entries)
    print(f"wrote {GOLDEN} ({len(text):,} bytes, {len(CORPUS)} entries, {fires:,} fires)")

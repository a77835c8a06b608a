"""A large-budget run of the time contract's oracle tests, with how many generated cases agreed.

    python -m load_tests.oracle_agreement                 # 5000 examples per property
    python -m load_tests.oracle_agreement --examples 20000 --only calendar

The unit suite runs each property with a small budget (CHRONOQ_PROPERTY_EXAMPLES,
default 120) to stay quick; this runs the same tests with a large one, without
the per-test timeout, and prints, per property, the generated cases that passed
(cases Hypothesis discarded as invalid — an expression that can never fire —
are not counted). Exit status is pytest's: non-zero if any case disagreed,
with the falsifying example in the output.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = {
    "calendar": ["tests/unit/test_timing_calendar_properties.py", "tests/unit/test_exclusion_intervals.py"],
    "plain": ["tests/unit/test_timing_properties.py"],
}
_STATS = re.compile(r"^(?P<test>\S+::\S+):\s*$")
_PASSING = re.compile(r"^\s*- (?P<count>\d+) passing, (?P<failing>\d+) failing, and (?P<invalid>\d+) invalid")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=5000, help="examples per property (default 5000)")
    parser.add_argument("--only", choices=sorted(SUITES), help="one group of properties")
    args = parser.parse_args(argv)
    files = SUITES[args.only] if args.only else [f for group in SUITES.values() for f in group]
    env = {**os.environ, "CHRONOQ_PROPERTY_EXAMPLES": str(args.examples)}
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--timeout=0",
            "--hypothesis-show-statistics",
            *files,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.monotonic() - started
    total = 0
    current = None
    for line in result.stdout.splitlines():
        header = _STATS.match(line)
        if header:
            current = header.group("test")
            continue
        passing = _PASSING.match(line)
        if passing and current:
            count = int(passing.group("count"))
            total += count
            print(f"{count:>7} agreeing cases ({passing.group('invalid')} discarded)  {current}")
            current = None
    print(
        f"{total:>7} agreeing cases in {elapsed:.0f} s ({args.examples} examples per property);"
        f" pytest exit status {result.returncode}"
    )
    if result.returncode:
        print(result.stdout[-8000:], result.stderr[-2000:], sep="\n")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())

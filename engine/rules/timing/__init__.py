"""When schedules fire: the time contract of chronoq (see docs/time-contract.md).

Everything here is pure: no I/O beyond loading zone data, no wall clock (every
"now"/"after" is an argument), no process-dependent ``hash()``.

The contract:

* ``cron`` is evaluated in the local wall-clock time of the schedule's IANA
  zone. A local time that does not exist (spring forward) is skipped
  (``dst_gap="skip"``, default) or fires at the first instant after the gap
  (``dst_gap="shift"``; several nonexistent times, and a regular fire at that
  instant, collapse onto one fire). A wall time that occurs twice (fall back)
  fires once at the earlier instant (``dst_repeat="first"``, default) or at
  both instants (``dst_repeat="both"``).
* ``rate`` fires at ``anchor + k * period`` (k = 0, 1, ...) of elapsed time and
  ignores daylight saving. Without an anchor it is anchored at ``start_at``,
  else at 1970-01-01T00:00Z (so "15m" fires at :00, :15, :30, :45 UTC).
* ``once`` fires at one instant.
* ``start_at`` and ``end_at`` are inclusive bounds on the fire instants.

The modules, in the order a fire is computed:

* :mod:`.spec` — :class:`TimeSpec`, the hashable value of "when";
* :mod:`.instants`, :mod:`.zones`, :mod:`.durations` — the text forms of its values;
* :mod:`.cron_source` — cron in local time with the DST rules above;
* :mod:`.sources` — rate and once sources, and the start/end bounds;
* :mod:`.fires` — next fire (memoized), fires in a range, previous fire, preview, rates;
* :mod:`.exclusions` — the fires an exclusion calendar removes (and lists for previews, reconcilers);
* :mod:`.fire_reasons` — which rule produced a fire, in words;
* :mod:`.misfire` — what happens to late fire instants (and the run limit);
* :mod:`.jitter` — the deterministic spread of flexible occurrences.

Validating a request's time fields into a spec is request parsing and lives in
:mod:`engine.control.schedule_requests` (``build_time_spec``).
"""

from __future__ import annotations

from engine.rules.cron_expression import MAX_EXPRESSION_LENGTH
from engine.rules.timing.durations import MAX_DURATION, parse_duration
from engine.rules.timing.exclusions import ExcludedSlot, excluded_slots
from engine.rules.timing.fire_reasons import fire_reason
from engine.rules.timing.fires import (
    clear_time_caches,
    fire_times,
    fires_per_minute,
    next_fire_after,
    next_fire_cache_info,
    preview,
    previous_fire_before,
    smallest_gap,
)
from engine.rules.timing.instants import parse_instant
from engine.rules.timing.jitter import jitter_offset
from engine.rules.timing.misfire import (
    MAX_CATCH_UP,
    DispatchDecision,
    MisfireDecision,
    MisfirePolicy,
    MissedRange,
    decide_dispatch,
    decide_misfire,
    late_threshold,
    parse_misfire_policy,
)
from engine.rules.timing.spec import DST_GAP_CHOICES, DST_REPEAT_CHOICES, KINDS, FirePreview, Kind, TimeSpec
from engine.rules.timing.zones import validate_zone

__all__ = [
    "Kind",
    "KINDS",
    "DST_REPEAT_CHOICES",
    "DST_GAP_CHOICES",
    "TimeSpec",
    "FirePreview",
    "MisfirePolicy",
    "MisfireDecision",
    "MAX_EXPRESSION_LENGTH",
    "MAX_DURATION",
    "MAX_CATCH_UP",
    "parse_duration",
    "parse_instant",
    "validate_zone",
    "next_fire_after",
    "fire_times",
    "previous_fire_before",
    "preview",
    "jitter_offset",
    "smallest_gap",
    "fires_per_minute",
    "parse_misfire_policy",
    "decide_misfire",
    "next_fire_cache_info",
    "clear_time_caches",
    "ExcludedSlot",
    "excluded_slots",
    "fire_reason",
    "MissedRange",
    "DispatchDecision",
    "decide_dispatch",
    "late_threshold",
]

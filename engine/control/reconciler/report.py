"""The result of a reconcile run: counts, first offenders, and whether the run is clean.

A run is clean when nothing is missing (lost, or never materialized before
its version ended), nothing unexpected exists, no slot has two occurrences
that may run, no misfire decision enqueued more late slots than its policy
allows, and (when a consumer database was checked) no effect was applied
twice, for an unknown occurrence, for an occurrence that was never to run,
without the engine learning of it, or never. An effect applied for an
occurrence the engine CANCELED (a change raced a consumer already applying
it) is counted and listed, not failed. Slots the materializer has not
reached yet (``pending``), slots recorded as a missed range (``summarized``)
and occurrences not yet final are reported, and do not make a run unclean.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opentelemetry import metrics

from schemas import observability as obs
from schemas.messages import format_instant

#: Counts that make a run unclean when non-zero.
FAILING = (
    "missing",
    "unexpected",
    "duplicate_slots",
    "policy_violations",
    "effects_applied_twice",
    "effects_applied_unknown",
    "effects_applied_not_to_run",
    "effects_applied_unrecorded",
    "effects_never_applied",
)


@dataclass(frozen=True)
class Offender:
    """One slot or occurrence that breaks a promise, and why."""

    kind: str  # missing | unexpected | duplicate_slot | policy_violation | effect
    reason: str
    schedule_id: uuid.UUID | None
    scheduled_for: datetime | None
    tenant_id: str | None = None
    version: int | None = None
    occurrence_id: uuid.UUID | None = None
    state: str | None = None
    detail: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "reason": self.reason}
        for name in ("schedule_id", "occurrence_id"):
            value = getattr(self, name)
            if value is not None:
                data[name] = str(value)
        if self.scheduled_for is not None:
            data["scheduled_for"] = format_instant(self.scheduled_for)
        for name in ("tenant_id", "version", "state", "detail"):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        return data

    def line(self) -> str:
        parts = [
            f"{self.kind:<16}",
            f"{self.reason:<26}",
            format_instant(self.scheduled_for) if self.scheduled_for else "-",
            f"schedule={self.schedule_id}" if self.schedule_id else "",
            f"v{self.version}" if self.version is not None else "",
            f"occurrence={self.occurrence_id}" if self.occurrence_id else "",
            self.state or "",
            self.detail or "",
        ]
        return "  ".join(part for part in parts if part)


@dataclass
class ReconcileReport:
    """Counts keyed by name (see :data:`FAILING`), occurrences per state, and the first offenders."""

    window_from: datetime
    window_to: datetime
    tenant_id: str | None
    as_of: datetime
    counts: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, dict[str, int]] = field(default_factory=dict)
    offenders: list[Offender] = field(default_factory=list)
    duration_s: float = 0.0
    run_id: int | None = None
    #: The end of the window's archived part (history retention): its finished occurrences were read from the
    #: archive; None when no part of the window is archived.
    archived_before: datetime | None = None

    @property
    def clean(self) -> bool:
        return all(self.counts.get(name, 0) == 0 for name in FAILING)

    def to_json(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "window": {"from": format_instant(self.window_from), "to": format_instant(self.window_to)},
            "tenant_id": self.tenant_id,
            "as_of": format_instant(self.as_of),
            "counts": dict(self.counts),
            "states": dict(self.states),
            "reasons": {kind: dict(per) for kind, per in self.reasons.items()},
            "offenders": [offender.to_json() for offender in self.offenders],
            "duration_s": round(self.duration_s, 3),
            "run_id": self.run_id,
            "archived_before": format_instant(self.archived_before) if self.archived_before else None,
        }

    def lines(self) -> list[str]:
        c = self.counts
        out = [
            f"reconcile {format_instant(self.window_from)} .. {format_instant(self.window_to)}"
            + (f" tenant={self.tenant_id}" if self.tenant_id else "")
            + f" as of {format_instant(self.as_of)}",
            f"  schedules {c.get('schedules', 0)}, versions {c.get('versions', 0)}",
            f"  expected {c.get('expected', 0)}: present {c.get('present', 0)}"
            f" (accounted for without running {c.get('accounted', 0)}), missing {c.get('missing', 0)},"
            f" pending {c.get('pending', 0)}, summarized {c.get('summarized', 0)}",
            f"  unexpected {c.get('unexpected', 0)}, duplicate slots {c.get('duplicate_slots', 0)},"
            f" policy violations {c.get('policy_violations', 0)}",
            f"  not final {c.get('unfinished', 0)} (stuck {c.get('stuck', 0)})",
            "  states: " + (", ".join(f"{state} {n}" for state, n in sorted(self.states.items())) or "none"),
        ]
        if self.archived_before is not None:
            out.append(
                f"  archived: {format_instant(self.window_from)} .. {format_instant(self.archived_before)}"
                f" (finished occurrences past retention; {c.get('archived', 0)} of this window read from the archive)"
            )
        if "effects_checked" in c:
            out.append(
                f"  effects checked {c['effects_checked']}: applied twice {c.get('effects_applied_twice', 0)},"
                f" never applied {c.get('effects_never_applied', 0)}, unknown {c.get('effects_applied_unknown', 0)},"
                f" not to run {c.get('effects_applied_not_to_run', 0)},"
                f" unrecorded {c.get('effects_applied_unrecorded', 0)}; after a cancel (raced, ran once)"
                f" {c.get('effects_applied_after_cancel', 0)}"
            )
        for kind, per in sorted(self.reasons.items()):
            if per:
                out.append(f"  {kind} by reason: " + ", ".join(f"{r} {n}" for r, n in sorted(per.items())))
        if self.offenders:
            out.append("first offenders:")
            out.extend("  " + offender.line() for offender in self.offenders)
        out.append(("CLEAN" if self.clean else "NOT CLEAN") + f" ({self.duration_s:.2f} s)")
        return out


class ReconcileMetrics:
    """The run's counts as gauges (attribute ``count``) and its duration."""

    def __init__(self, meter: metrics.Meter | None = None) -> None:
        meter = meter or obs.get_meter("reconciler")
        self._counts = meter.create_gauge(
            obs.RECONCILE_COUNTS, unit="1", description="result of the last reconcile run, per count"
        )
        self._duration = meter.create_histogram(obs.RECONCILE_DURATION, unit="s")

    def record(self, report: ReconcileReport) -> None:
        tenant = {"tenant_id": report.tenant_id} if report.tenant_id else {}
        for name, value in report.counts.items():
            self._counts.set(value, {"count": name, **tenant})
        for state, value in report.states.items():
            self._counts.set(value, {"count": f"state.{state}", **tenant})
        self._counts.set(0 if report.clean else 1, {"count": "unclean", **tenant})
        self._duration.record(report.duration_s, tenant)

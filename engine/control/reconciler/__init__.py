"""The reconciler: proof that no occurrence was silently omitted or doubled.

Independently of the materializer, it recomputes from the schedule version
history and the time contract every slot that should exist in a window, and
compares that set with the occurrences that do exist (and, optionally, with a
consumer app's record of applied effects). See ``docs/operations.md``
("Reconcile") for how to read its counts.
"""

from engine.control.reconciler.calendar_filter import CalendarFilter
from engine.control.reconciler.checks import ReconcileOptions
from engine.control.reconciler.effects import ConsumerCheck
from engine.control.reconciler.report import FAILING, Offender, ReconcileReport
from engine.control.reconciler.run import reconcile
from engine.control.reconciler.slots import FilteredVersion, SlotFilter, SlotVerdicts, Window

__all__ = [
    "CalendarFilter",
    "SlotVerdicts",
    "ReconcileOptions",
    "ConsumerCheck",
    "FAILING",
    "FilteredVersion",
    "Offender",
    "ReconcileReport",
    "SlotFilter",
    "Window",
    "reconcile",
]

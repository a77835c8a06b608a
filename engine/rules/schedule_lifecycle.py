"""The schedule lifecycle: which state each action leads to from each state.

A missing entry is a conflict; an action that leaves the state as it is is a
no-op (retrying a pause is safe and creates no new version). ``canceled`` and
``completed`` are final.
"""

from __future__ import annotations

from schemas.errors import Conflict

SCHEDULE_STATES = ("active", "paused", "canceled", "completed")
FINAL_STATES = ("canceled", "completed")

LIFECYCLE: dict[str, dict[str, str]] = {
    "pause": {"active": "paused", "paused": "paused"},
    "resume": {"paused": "active", "active": "active"},
    "cancel": {"active": "canceled", "paused": "canceled", "canceled": "canceled", "completed": "completed"},
    "update": {"active": "active", "paused": "paused"},
}


def lifecycle_transition(state: str, action: str) -> str:
    """The state after ``action``, or Conflict saying why the action is not possible."""
    following = LIFECYCLE[action].get(state)
    if following is None:
        raise Conflict(
            f"cannot {action} a {state} schedule; {state} is final, create a new schedule instead"
            if state in FINAL_STATES
            else f"cannot {action} a {state} schedule"
        )
    return following

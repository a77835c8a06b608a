"""The engine's answer to a ``started``, decided as a value from the state the batch left: ``grant_for``.

Pure. The attempt processor applies a batch of events, commits, and answers every ``started`` of it on
``chronoq.attempt-grants`` (``schemas/attempt_grants.py``); the consumer runtime calls the handler only
after ``granted``. The answer is read from the occurrence's state and lease token *after* the batch, not
from the event's verdict, so a ``started`` read again after a crash between the commit and the reply (a
duplicate, changing nothing) is still answered ``granted`` while the occurrence runs on that token.

Rules, in order:

1. an event that failed authentication → refused ``not_authenticated`` (it was never applied);
2. the occurrence is unknown → refused ``unknown``;
3. the occurrence is CANCELED → refused ``canceled`` (whoever asks: an observing group is stopped by a
   cancel too);
4. the group does not own the target (``FOREIGN``) → refused ``foreign_group``: an observer has no lease
   the engine could grant; its runtime runs on the schedule-state view alone;
5. the occurrence's current lease token is this event's and it is RUNNING (or already SUCCEEDED on it)
   → ``granted``;
6. another final state → refused ``finished``; anything else (another token is current) → ``fenced``.

Exactly one order of cancel and ``started`` happens because the control plane's cancel and the ledger
lock the same occurrence row: cancel first → rule 3; start first → rule 5, and the cancel then reports
the occurrence ``still_running``.
"""

from __future__ import annotations

import uuid

# The answers of schemas/attempt_grants.py (rules import no message code; a unit test keeps them equal).
GRANTED, REFUSED = "granted", "refused"
CANCELED, FENCED, FINISHED, UNKNOWN, FOREIGN_GROUP, NOT_AUTHENTICATED = (
    "canceled",
    "fenced",
    "finished",
    "unknown",
    "foreign_group",
    "not_authenticated",
)

_FINAL = frozenset({"SUCCEEDED", "DEAD", "CANCELED", "MISSED", "SKIPPED_OVERLAP"})
_HOLDS_A_GRANTED_LEASE = frozenset({"RUNNING", "SUCCEEDED"})


def grant_for(
    lease_token: uuid.UUID,
    verdict: str,
    state: str | None,
    current_token: uuid.UUID | None,
) -> tuple[str, str | None]:
    """(result, reason) for a ``started`` with ``lease_token`` whose verdict was ``verdict``, given the
    occurrence's ``state`` and ``current_token`` after the batch (None, None: no such occurrence)."""
    if verdict == "rejected":
        return REFUSED, NOT_AUTHENTICATED
    if state is None:
        return REFUSED, UNKNOWN
    if state == "CANCELED":
        return REFUSED, CANCELED
    if verdict == "foreign":
        return REFUSED, FOREIGN_GROUP
    if current_token == lease_token and state in _HOLDS_A_GRANTED_LEASE:
        return GRANTED, None
    if state in _FINAL:
        return REFUSED, FINISHED
    return REFUSED, FENCED

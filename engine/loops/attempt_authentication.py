"""Authenticating attempt events: only the consumer side of a target may change its occurrences.

Guarantee: an event about an occurrence whose target has (or ever had) an
attempt credential is applied only if it is signed — over its exact key and
value — with a credential of that same target that is valid at the engine's
clock (issued, and not past the end a revocation or rotation gave it).
Anything else is rejected with a :class:`Rejection` the processor counts
(``chronoq.attempt_events_rejected``) and logs; it changes nothing.

A target that never had a credential accepts unsigned events (deployments
from before credentials keep working until an operator issues one; see
docs/security.md); a *signed* event is verified whatever the target, so a
credential of one target never vouches for another target's occurrence.
The contract is ``schemas/attempt_credentials.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Protocol

import asyncpg

from schemas.attempt_credentials import SignedBy, verify
from schemas.attempt_events import AttemptEvent
from schemas.frozen_records import quick_init
from schemas.queries import QUERIES


class Rejection(str, Enum):
    UNSIGNED = "unsigned"  # the target requires signatures and the event has none
    MALFORMED = "malformed"  # the credential headers are garbled
    UNKNOWN_CREDENTIAL = "unknown_credential"  # no credential has the claimed id
    EXPIRED_CREDENTIAL = "expired_credential"  # revoked, or past a rotation's grace
    WRONG_TARGET = "wrong_target"  # a credential of another target than the occurrence's
    BAD_SIGNATURE = "bad_signature"  # the signature does not match the record


@quick_init
@dataclass(frozen=True)
class ReceivedEvent:
    """An attempt event as it arrived: what its record claims about who sent it (None: unsigned), the exact
    key and value a signature covers, and where it was read (for the log)."""

    event: AttemptEvent
    claim: SignedBy | None = None
    key: bytes | None = None
    value: bytes = b""
    partition: int | None = None
    offset: int | None = None

    @property
    def credential_id(self) -> uuid.UUID | None:
        return self.claim.credential_id if self.claim is not None else None


class EventVerifier(Protocol):
    """Decides whether each received event comes from the consumer side it claims to.

    Called once per batch, inside the batch's transaction before anything is applied, with ``targets``: the
    target of every occurrence the batch names that exists (read by the batch's lock, so a verifier reads
    no occurrence itself). Returns, per event in order, None for an authentic event or the reason it is
    rejected; a rejected event changes nothing and is counted and logged.
    """

    async def verify(
        self,
        conn: asyncpg.Connection,
        received: Sequence[ReceivedEvent],
        now: datetime,
        targets: Mapping[uuid.UUID, str],
    ) -> Sequence[str | None]: ...


class CredentialVerifier:
    """The engine's verifier: the per-target attempt credentials (:func:`authenticate`)."""

    async def verify(
        self,
        conn: asyncpg.Connection,
        received: Sequence[ReceivedEvent],
        now: datetime,
        targets: Mapping[uuid.UUID, str],
    ) -> list[str | None]:
        return [None if why is None else why.value for why in await authenticate(conn, received, now, targets)]


async def authenticate(
    conn: asyncpg.Connection, batch: Sequence[ReceivedEvent], now: datetime, targets: Mapping[uuid.UUID, str]
) -> list[Rejection | None]:
    """Why each event must not be applied, or None if it may be (in the caller's transaction).

    ``targets`` maps every occurrence the batch names that exists to its target; the caller read it by id
    (with a wrong or absent instant too: :func:`engine.loops.attempt_ledger.lock_event_occurrences`), so
    only an occurrence that does not exist at all leaves an event unchecked (the ledger then answers
    "unknown" and changes nothing). One statement for the batch: the credentials its targets and
    signatures name."""
    claimed = sorted({r.credential_id for r in batch if r.credential_id is not None})
    named = sorted({targets[r.event.occurrence_id] for r in batch if r.event.occurrence_id in targets})
    if not named:
        return [None] * len(batch)
    enforced: set[str] = set()
    credentials: dict[uuid.UUID, asyncpg.Record] = {}
    for row in await conn.fetch(*QUERIES.attempt_authorities(targets=named, credential_ids=claimed)):
        if row["credential_id"] is None:
            enforced.add(row["target"])
        else:
            credentials[row["credential_id"]] = row
    return [
        _judge(targets.get(received.event.occurrence_id), enforced, credentials, received, now) for received in batch
    ]


def _judge(
    target: str | None,
    enforced: set[str],
    credentials: Mapping[uuid.UUID, asyncpg.Record],
    received: ReceivedEvent,
    now: datetime,
) -> Rejection | None:
    if target is None:
        return None  # no such occurrence: the ledger answers "unknown" and changes nothing
    claim = received.claim
    if claim is None:
        return Rejection.UNSIGNED if target in enforced else None
    credential = credentials.get(claim.credential_id)
    if credential is None:
        return Rejection.UNKNOWN_CREDENTIAL
    if not verify(bytes(credential["secret"]), received.key, received.value, claim):
        return Rejection.BAD_SIGNATURE
    if credential["target"] != target:
        return Rejection.WRONG_TARGET
    if credential["revoked_at"] is not None and credential["revoked_at"] <= now:
        return Rejection.EXPIRED_CREDENTIAL
    return None

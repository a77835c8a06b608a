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
    key and value a signature covers, where it was read (for the log), and whether its record was a group
    (its answer goes back as one). The events of one group record share the record's claim, key and value."""

    event: AttemptEvent
    claim: SignedBy | None = None
    key: bytes | None = None
    value: bytes = b""
    partition: int | None = None
    offset: int | None = None
    grouped: bool = False

    @property
    def credential_id(self) -> uuid.UUID | None:
        return self.claim.credential_id if self.claim is not None else None


class EventVerifier(Protocol):
    """Decides whether each received event comes from the consumer side it claims to.

    Called once per batch, inside the batch's transaction before anything is applied, with the targets of the
    occurrences the batch names (locked by that transaction; an occurrence that does not exist is absent), so
    looking the credentials up is one small statement for the batch. Returns, per event in order, None for an
    authentic event or the reason it is rejected; a rejected event changes nothing and is counted and logged.
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

    ``targets`` are the targets of the batch's occurrences, read (and locked) by id — by the days the events
    name, and by id alone where an instant was wrong or absent — so only an occurrence that does not exist at
    all leaves an event unchecked (the ledger then answers "unknown" and changes nothing): a wrong instant must
    never make an event look like that. One statement reads which of those targets require signatures and
    the credentials the events claim."""
    claimed = sorted({r.credential_id for r in batch if r.credential_id is not None})
    rows = await conn.fetch(*QUERIES.batch_credentials(targets=sorted(set(targets.values())), credential_ids=claimed))
    enforced = {row["target"] for row in rows if row["kind"] == "enforced"}
    credentials = {row["credential_id"]: row for row in rows if row["kind"] == "claimed"}
    signatures = _Signatures()
    return [_judge(targets.get(r.event.occurrence_id), enforced, credentials, r, now, signatures) for r in batch]


class _Signatures:
    """Signature checks of one batch, each record's once: the events of a group record share its key, value
    and claim, and an HMAC over a group's value per event would cost a group's size squared."""

    def __init__(self) -> None:
        self._checked: dict[tuple[bytes, bytes | None, bytes, SignedBy], bool] = {}

    def valid(self, secret: bytes, received: ReceivedEvent, claim: SignedBy) -> bool:
        # The secret is part of the key, so a check never answers for a secret it was not made with.
        key = (secret, received.key, received.value, claim)
        valid = self._checked.get(key)
        if valid is None:
            valid = self._checked[key] = verify(secret, received.key, received.value, claim)
        return valid


def _judge(
    target: str | None,
    enforced: set[str],
    credentials: Mapping[uuid.UUID, asyncpg.Record],
    received: ReceivedEvent,
    now: datetime,
    signatures: _Signatures,
) -> Rejection | None:
    if target is None:
        return None  # no such occurrence: the ledger answers "unknown" and changes nothing
    claim = received.claim
    if claim is None:
        return Rejection.UNSIGNED if target in enforced else None
    credential = credentials.get(claim.credential_id)
    if credential is None:
        return Rejection.UNKNOWN_CREDENTIAL
    if not signatures.valid(bytes(credential["secret"]), received, claim):
        return Rejection.BAD_SIGNATURE
    if credential["target"] != target:
        return Rejection.WRONG_TARGET
    if credential["revoked_at"] is not None and credential["revoked_at"] <= now:
        return Rejection.EXPIRED_CREDENTIAL
    return None

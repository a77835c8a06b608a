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
from collections.abc import Sequence
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

    Called once per batch, inside the batch's transaction before anything is applied, so looking the
    credentials up is one statement for the batch. Returns, per event in order, None for an authentic event
    or the reason it is rejected; a rejected event changes nothing and is counted and logged.
    """

    async def verify(
        self, conn: asyncpg.Connection, received: Sequence[ReceivedEvent], now: datetime
    ) -> Sequence[str | None]: ...


class CredentialVerifier:
    """The engine's verifier: the per-target attempt credentials (:func:`authenticate`)."""

    async def verify(
        self, conn: asyncpg.Connection, received: Sequence[ReceivedEvent], now: datetime
    ) -> list[str | None]:
        return [None if why is None else why.value for why in await authenticate(conn, received, now)]


async def authenticate(
    conn: asyncpg.Connection, batch: Sequence[ReceivedEvent], now: datetime
) -> list[Rejection | None]:
    """Why each event must not be applied, or None if it may be (in the caller's transaction).

    One query for the batch in the days its events name; the events whose occurrence it did not find (no
    instant, or a wrong one) are looked up again by id alone. Only an occurrence that does not exist at all
    leaves an event unchecked (the ledger then answers "unknown" and changes nothing): a wrong instant must
    never make an event look like that."""
    days = sorted({r.event.scheduled_for for r in batch if r.event.scheduled_for is not None})
    by_position: dict[int, asyncpg.Record] = {}
    if days:
        rows = await conn.fetch(
            *QUERIES.attempt_authorities_of_days(
                occurrence_ids=[r.event.occurrence_id for r in batch],
                credential_ids=[r.credential_id for r in batch],
                days=days,
            )
        )
        by_position = {row["ordinal"]: row for row in rows}
    missing = [i for i in range(1, len(batch) + 1) if i not in by_position]
    if missing:
        rows = await conn.fetch(
            *QUERIES.attempt_authorities(
                occurrence_ids=[batch[i - 1].event.occurrence_id for i in missing],
                credential_ids=[batch[i - 1].credential_id for i in missing],
            )
        )
        by_position.update((missing[row["ordinal"] - 1], row) for row in rows)  # its ordinals count `missing`
    signatures = _Signatures()
    return [_judge(by_position.get(i), received, now, signatures) for i, received in enumerate(batch, start=1)]


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
    row: asyncpg.Record | None, received: ReceivedEvent, now: datetime, signatures: _Signatures
) -> Rejection | None:
    if row is None:
        return None  # no such occurrence: the ledger answers "unknown" and changes nothing
    claim = received.claim
    if claim is None:
        return Rejection.UNSIGNED if row["enforced"] else None
    if row["secret"] is None:
        return Rejection.UNKNOWN_CREDENTIAL
    if not signatures.valid(bytes(row["secret"]), received, claim):
        return Rejection.BAD_SIGNATURE
    if row["credential_target"] != row["target"]:
        return Rejection.WRONG_TARGET
    if row["revoked_at"] is not None and row["revoked_at"] <= now:
        return Rejection.EXPIRED_CREDENTIAL
    return None

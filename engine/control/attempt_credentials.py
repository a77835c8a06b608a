"""Issuing attempt credentials: the secret per target its consumer app signs attempt events with.

The contract (token format, signature) is ``schemas/attempt_credentials.py``;
the attempt processor verifies (``engine/loops/attempt_authentication.py``).
Operator actions (``chronoq target credential issue|rotate|revoke|list``):

* **issue** adds a credential to a registered target and returns its token,
  the only time the secret leaves the database (it is never logged). From the
  first credential a target has, every attempt event about its occurrences
  must be signed with one of its valid credentials.
* **rotate** issues a new credential and ends every other one of the target
  after ``grace``, so events the consumer apps signed with the old one (in
  flight on the topic, or sent before the rollout reached every process)
  are still applied meanwhile.
* **revoke** ends one credential at once (a leaked secret).
* **list** shows a target's credentials and until when each is valid, never
  a secret.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from schemas.attempt_credentials import AttemptCredential
from schemas.clock import Clock
from schemas.errors import InvalidInput, NotFound
from schemas.queries import QUERIES
from schemas.topics import validate_target

log = logging.getLogger("chronoq.credentials")

DEFAULT_GRACE = timedelta(hours=1)
MAX_GRACE = timedelta(days=30)


@dataclass(frozen=True)
class CredentialInfo:
    """A credential as an operator sees it: never its secret."""

    credential_id: uuid.UUID
    target: str
    created_at: datetime
    valid_until: datetime | None  # None: until revoked or rotated

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> CredentialInfo:
        return cls(row["credential_id"], row["target"], row["created_at"], row["revoked_at"])

    def to_json(self) -> dict[str, Any]:
        return {
            "credential_id": str(self.credential_id),
            "target": self.target,
            "created_at": self.created_at.isoformat(),
            "valid_until": self.valid_until.isoformat() if self.valid_until else None,
        }


@dataclass(frozen=True)
class IssuedCredential:
    """A new credential and its token (shown once; ``repr`` hides it so a log line never carries it)."""

    info: CredentialInfo
    credential: AttemptCredential
    expiring: tuple[uuid.UUID, ...] = ()  # credentials a rotation ends after its grace

    @property
    def token(self) -> str:
        return self.credential.token

    def __repr__(self) -> str:
        return f"IssuedCredential({self.info.credential_id}, target={self.info.target!r}, token=<hidden>)"


async def issue(pool: asyncpg.Pool, target: str, clock: Clock) -> IssuedCredential:
    """Add a credential to a registered target (NotFound if it is not registered)."""
    async with pool.acquire() as conn, conn.transaction():
        return await _issue(conn, target, clock.now())


async def rotate(pool: asyncpg.Pool, target: str, clock: Clock, grace: timedelta = DEFAULT_GRACE) -> IssuedCredential:
    """Issue a new credential and end the target's others ``grace`` after now, in one transaction."""
    if not timedelta(0) <= grace <= MAX_GRACE:
        raise InvalidInput("grace", f"must be between 0 and {MAX_GRACE.days} days", "1h")
    async with pool.acquire() as conn, conn.transaction():
        issued = await _issue(conn, target, clock.now())
        now: datetime = await conn.fetchval(*QUERIES.current_instant(now=clock.now()))
        rows = await conn.fetch(
            *QUERIES.expire_attempt_credentials(target=target, keep=issued.info.credential_id, until=now + grace)
        )
        expiring = tuple(r["credential_id"] for r in rows)
    log.info(
        "attempt credential rotated",
        extra={
            "action": "credential.rotated",
            "target": target,
            "credential_id": str(issued.info.credential_id),
            "expiring": [str(c) for c in expiring],
            "grace_s": grace.total_seconds(),
        },
    )
    return IssuedCredential(issued.info, issued.credential, expiring)


async def revoke(pool: asyncpg.Pool, credential_id: uuid.UUID, clock: Clock) -> CredentialInfo:
    """End one credential now (NotFound if there is no such credential)."""
    row = await pool.fetchrow(*QUERIES.revoke_attempt_credential(credential_id=credential_id, now=clock.now()))
    if row is None:
        raise NotFound("attempt credential", credential_id)
    log.info(
        "attempt credential revoked",
        extra={"action": "credential.revoked", "target": row["target"], "credential_id": str(credential_id)},
    )
    return CredentialInfo.from_row(row)


async def list_credentials(pool: asyncpg.Pool, target: str) -> list[CredentialInfo]:
    validate_target(target)
    return [CredentialInfo.from_row(r) for r in await pool.fetch(*QUERIES.list_attempt_credentials(target=target))]


async def _issue(conn: asyncpg.Connection, target: str, now: datetime | None) -> IssuedCredential:
    validate_target(target)
    if await conn.fetchrow(*QUERIES.lock_target(target=target)) is None:
        raise NotFound("target", f"{target} (it is registered by its first schedule, or with chronoq target register)")
    credential = AttemptCredential.issue()
    row = await conn.fetchrow(
        *QUERIES.insert_attempt_credential(
            credential_id=credential.credential_id, target=target, secret=credential.secret, now=now
        )
    )
    log.info(
        "attempt credential issued",
        extra={"action": "credential.issued", "target": target, "credential_id": str(credential.credential_id)},
    )
    return IssuedCredential(CredentialInfo.from_row(row), credential)

"""Tenants: identity and credentials (their quotas are in :mod:`engine.control.quotas`).

A tenant is named by its ``tenant_id`` (a slug such as ``acme``). It owns two
secrets, both returned once at creation:

- ``api_token``: the bearer token of the HTTP API. Only its SHA-256 is stored,
  so a database leak does not leak tokens.
- ``signing_key``: the HMAC-SHA256 key a service signs Kafka commands with.
  Verifying an HMAC needs the key, so it is stored; it never travels in the
  Kafka log (commands carry signatures only).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg

from engine.control.quotas import TenantQuotas
from schemas.errors import Conflict, InvalidInput, NotFound
from schemas.queries import QUERIES

_TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
TOKEN_PREFIX = "cq_"


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    state: str
    quotas: TenantQuotas
    signing_key: bytes

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Tenant:
        return cls(row["tenant_id"], row["state"], TenantQuotas.from_row(row), bytes(row["signing_key"]))

    def to_json(self) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "state": self.state, "quotas": asdict(self.quotas)}


@dataclass(frozen=True)
class NewTenant:
    """A created tenant with its secrets; the only time they are readable."""

    tenant: Tenant
    api_token: str

    def to_json(self) -> dict[str, Any]:
        return {**self.tenant.to_json(), "api_token": self.api_token, "signing_key": self.tenant.signing_key.hex()}


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def validate_tenant_id(tenant_id: object) -> str:
    if not isinstance(tenant_id, str) or not _TENANT_ID.match(tenant_id):
        raise InvalidInput(
            "tenant", "must be 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit", "acme"
        )
    return tenant_id


async def create_tenant(pool: asyncpg.Pool, tenant_id: str, quotas: TenantQuotas | None = None) -> NewTenant:
    """Create a tenant and return it with its freshly generated secrets."""
    validate_tenant_id(tenant_id)
    quotas = quotas or TenantQuotas()
    quotas.validate()
    api_token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    signing_key = secrets.token_bytes(32)
    row = await pool.fetchrow(
        *QUERIES.insert_tenant(
            tenant_id=tenant_id, api_token_hash=token_hash(api_token), signing_key=signing_key, **asdict(quotas)
        )
    )
    if row is None:
        raise Conflict(f"tenant {tenant_id!r} already exists; choose another name")
    return NewTenant(Tenant.from_row(row), api_token)


async def find_tenant(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: str) -> Tenant | None:
    """The tenant named ``tenant_id``, in any state, or None."""
    row = await conn.fetchrow(*QUERIES.get_tenant(tenant_id=tenant_id))
    return Tenant.from_row(row) if row is not None else None


async def authenticate(pool: asyncpg.Pool, api_token: str) -> Tenant | None:
    """The active tenant owning ``api_token``, or None."""
    if not api_token.startswith(TOKEN_PREFIX) or len(api_token) > 200:
        return None
    row = await pool.fetchrow(*QUERIES.tenant_by_token_hash(api_token_hash=token_hash(api_token)))
    return Tenant.from_row(row) if row else None


async def lock_tenant(conn: asyncpg.Connection, tenant_id: str) -> Tenant:
    """Lock an active tenant's row for a schedule change: quota checks and the insert they guard are
    serialized per tenant. NotFound for an unknown tenant, Conflict for a suspended one."""
    row = await conn.fetchrow(*QUERIES.lock_tenant(tenant_id=tenant_id))
    if row is None:
        raise NotFound("tenant", f"{tenant_id} (create it with: chronoq tenant create {tenant_id})")
    tenant = Tenant.from_row(row)
    if tenant.state != "active":
        raise Conflict(f"tenant {tenant_id} is {tenant.state}; an operator must reactivate it")
    return tenant

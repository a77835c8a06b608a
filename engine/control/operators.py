"""Operators: the principals that see every tenant in the console.

An operator token (``chronoq operator token NAME``) is a bearer secret with
the prefix ``cqop_``, shown once; only its SHA-256 is stored, like a tenant's
API token. Revoking an operator's tokens (``chronoq operator revoke NAME``)
ends its console sessions too. Tenant tokens (``cq_``) and operator tokens
never authenticate as each other: the prefixes differ and so do the tables.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

import asyncpg

from engine.control.tenants import token_hash
from schemas.errors import InvalidInput, NotFound
from schemas.queries import QUERIES

OPERATOR_TOKEN_PREFIX = "cqop_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$")


@dataclass(frozen=True)
class NewOperatorToken:
    name: str
    token: str

    def to_json(self) -> dict[str, str]:
        return {"operator": self.name, "operator_token": self.token}


def validate_operator_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInput(
            "name", "must be 1-63 letters, digits, '.', '_', '@' or '-', starting with a letter or digit", "alice"
        )
    return name


async def create_operator_token(pool: asyncpg.Pool, name: str) -> NewOperatorToken:
    """A new token for operator ``name`` (several may exist; each is shown only here)."""
    validate_operator_name(name)
    token = OPERATOR_TOKEN_PREFIX + secrets.token_urlsafe(32)
    await pool.fetchrow(*QUERIES.insert_operator_token(token_hash=token_hash(token), name=name, now=None))
    return NewOperatorToken(name, token)


async def authenticate_operator(pool: asyncpg.Pool, token: str) -> str | None:
    """The operator's name if ``token`` is a live operator token, else None."""
    if not token.startswith(OPERATOR_TOKEN_PREFIX) or len(token) > 200:
        return None
    return await pool.fetchval(*QUERIES.operator_by_token_hash(token_hash=token_hash(token)))


async def revoke_operator(pool: asyncpg.Pool, name: str) -> int:
    """Revoke every token of ``name``; return how many. NotFound if it had none live."""
    rows = await pool.fetch(*QUERIES.revoke_operator_tokens(name=validate_operator_name(name), now=None))
    if not rows:
        raise NotFound("operator", name)
    return len(rows)

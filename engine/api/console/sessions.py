"""Console sign-in: an API token (a tenant's) or an operator token becomes a session cookie.

The token is sent once, in the sign-in form; the browser then holds only a
random session id in a cookie that scripts cannot read (``HttpOnly``) and that
other sites' requests do not carry (``SameSite=Strict``). The database keeps
the id's SHA-256, the principal and the session's CSRF token. Every
state-changing request must carry that CSRF token (a hidden form field or the
``X-CSRF-Token`` header of the console's script) — a second, independent
defence against cross-site requests. A tenant session sees only its tenant; an
operator session sees every tenant.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from engine.control.operators import authenticate_operator
from engine.control.tenants import authenticate, token_hash
from schemas.clock import Clock
from schemas.queries import QUERIES

COOKIE = "chronoq_console"
SESSION_TTL = timedelta(hours=12)


@dataclass(frozen=True)
class Principal:
    """Who is signed in: a tenant (sees its own data) or an operator (sees every tenant)."""

    tenant_id: str | None = None
    operator: str | None = None

    @property
    def scope(self) -> str | None:
        """The tenant filter of every read: the tenant, or None (every tenant) for an operator."""
        return self.tenant_id

    @property
    def name(self) -> str:
        return f"operator:{self.operator}" if self.operator else f"tenant:{self.tenant_id}"


@dataclass(frozen=True)
class Session:
    principal: Principal
    csrf_token: str
    expires_at: datetime

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf_token.encode())


async def sign_in(pool: asyncpg.Pool, token: str, clock: Clock) -> tuple[str, Session] | None:
    """A new session for a valid token: (cookie value, session); None for anything else."""
    token = token.strip()
    principal: Principal | None = None
    tenant = await authenticate(pool, token)
    if tenant is not None:
        principal = Principal(tenant_id=tenant.tenant_id)
    else:
        operator = await authenticate_operator(pool, token)
        if operator is not None:
            principal = Principal(operator=operator)
    if principal is None:
        return None
    session_id = secrets.token_urlsafe(32)
    csrf = secrets.token_urlsafe(32)
    await pool.execute(*QUERIES.prune_console_sessions(now=clock.now()))
    await pool.execute(
        *QUERIES.insert_console_session(
            session_hash=token_hash(session_id),
            tenant_id=principal.tenant_id,
            operator=principal.operator,
            csrf_token=csrf,
            now=clock.now(),
            ttl_s=SESSION_TTL.total_seconds(),
        )
    )
    session = await session_of(pool, session_id, clock)
    assert session is not None
    return session_id, session


async def session_of(pool: asyncpg.Pool, session_id: str | None, clock: Clock) -> Session | None:
    if not session_id or len(session_id) > 100:
        return None
    row = await pool.fetchrow(*QUERIES.console_session(session_hash=token_hash(session_id), now=clock.now()))
    if row is None:
        return None
    return Session(Principal(row["tenant_id"], row["operator"]), row["csrf_token"], row["expires_at"])


async def sign_out(pool: asyncpg.Pool, session_id: str | None) -> None:
    if session_id:
        await pool.execute(*QUERIES.delete_console_session(session_hash=token_hash(session_id)))


def session_cookie(value: str, secure: bool, max_age: int | None = None) -> bytes:
    """The Set-Cookie value of the session (``max_age`` 0 deletes it)."""
    parts = [f"{COOKIE}={value}", "Path=/ui", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    else:
        parts.append(f"Max-Age={int(SESSION_TTL.total_seconds())}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts).encode()

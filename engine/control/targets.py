"""Target ownership: which tenants may schedule onto a target.

A target names the handler that consumes an occurrence topic
(``chronoq.occurrences.<target>``), so whoever may schedule onto it decides
what that handler runs. The rule:

* **first use claims**: the first tenant that creates a schedule on an
  unregistered target becomes its owner (existing tests and deployments that
  give each tenant its own target names keep working unchanged);
* an operator may **register** a target to a tenant before anyone uses it
  (reserving the name), **grant** it to further tenants and **revoke** a grant
  (``chronoq target register|grant|revoke|list``);
* any other tenant is refused with :class:`Forbidden` naming ``target`` — on
  create and on an update that changes the target, over HTTP (403) and
  commands alike. Refusing reveals that the name is taken, like any unique
  name; it reveals nothing else (not the owner).

Every change of a target's tenants bumps its version and queues a
:class:`~schemas.target_bindings.TargetBindingMessage` in the outbox, in the
same transaction, so consumer apps learn the binding at least once and in
version order (``consumers/target_bindings.py``).

Every occurrence message carries its target's version as ``binding_version``
(:func:`binding_versions`, read in the transaction that writes the message).
That is the version the tenant is bound under — it was authorized when its
schedule was accepted, and a grant cannot be revoked while the tenant has live
schedules there — and its binding message committed no later than the
occurrence's, so a consumer's view reaches it eventually whatever order the
relays publish in. A view older than it is *behind*, not refusing.

The production equivalent is Kafka ACLs (``docs/security.md``): only the
engine's principal writes occurrence topics, and each consumer app's
principal reads only the topics of its targets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from schemas import observability as obs
from schemas.clock import Clock
from schemas.errors import Conflict, Forbidden, NotFound
from schemas.queries import QUERIES
from schemas.target_bindings import TargetBindingMessage
from schemas.topics import TARGET_BINDINGS_TOPIC, validate_target


@dataclass(frozen=True)
class Target:
    target: str
    owner: str
    granted: tuple[str, ...]
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "owner": self.owner, "granted": list(self.granted), "version": self.version}


async def authorize(conn: asyncpg.Connection, tenant_id: str, target: str, now: datetime | None) -> None:
    """Let ``tenant_id`` schedule onto ``target`` (claiming it if unregistered), or raise Forbidden.

    Runs inside the caller's transaction: a claim commits (and is announced)
    with the schedule that made it, or not at all.
    """
    claimed = await conn.fetchrow(*QUERIES.claim_target(target=target, tenant_id=tenant_id, now=now))
    if claimed is not None:
        await _announce(conn, claimed, now)
        return
    access = await conn.fetchrow(*QUERIES.target_access(target=target, tenant_id=tenant_id))
    if access is None or not (access["owner"] or access["granted"]):
        obs.get_meter("engine").create_counter(obs.TARGET_REFUSALS, unit="1").add(1)
        raise Forbidden(
            "target",
            f"{target!r} belongs to another tenant; use a target name of your own, or"
            " ask an operator to grant it to you (chronoq target grant <target> <tenant>)",
        )


async def binding_versions(conn: asyncpg.Connection, targets: Iterable[str]) -> dict[str, int]:
    """The current binding version of each registered target among ``targets`` (unregistered ones are
    absent: their occurrences carry no binding_version, and consumers check them as before)."""
    names = sorted(set(targets))
    if not names:
        return {}
    return {r["target"]: r["version"] for r in await conn.fetch(*QUERIES.binding_versions(targets=names))}


async def register(pool: asyncpg.Pool, target: str, owner: str, clock: Clock) -> Target:
    """Register ``target`` to ``owner`` before first use (Conflict if another tenant has it)."""
    validate_target(target)
    async with pool.acquire() as conn, conn.transaction():
        await _tenant_exists(conn, owner)
        row = await conn.fetchrow(*QUERIES.claim_target(target=target, tenant_id=owner, now=clock.now()))
        if row is not None:
            await _announce(conn, row, clock.now())
        else:
            row = await conn.fetchrow(*QUERIES.lock_target(target=target))
            if row["owner_tenant"] != owner:
                raise Conflict(f"target {target!r} belongs to tenant {row['owner_tenant']!r}; grant it instead")
        return await _target(conn, row)


async def grant(pool: asyncpg.Pool, target: str, tenant_id: str, clock: Clock) -> Target:
    """Let ``tenant_id`` schedule onto a registered target as well (idempotent)."""
    async with pool.acquire() as conn, conn.transaction():
        row = await _lock(conn, target)
        await _tenant_exists(conn, tenant_id)
        if row["owner_tenant"] != tenant_id and await conn.fetchval(
            *QUERIES.insert_target_grant(target=target, tenant_id=tenant_id, now=clock.now())
        ):
            row = await conn.fetchrow(*QUERIES.bump_target_version(target=target, now=clock.now()))
            await _announce(conn, row, clock.now())
        return await _target(conn, row)


async def revoke(pool: asyncpg.Pool, target: str, tenant_id: str, clock: Clock) -> Target:
    """Withdraw a grant. Refused while the tenant has live schedules on the target (cancel them first)."""
    async with pool.acquire() as conn, conn.transaction():
        row = await _lock(conn, target)
        if row["owner_tenant"] == tenant_id:
            raise Conflict(f"tenant {tenant_id!r} owns target {target!r}; an owner cannot be revoked")
        live = await conn.fetchval(*QUERIES.live_schedules_on_target(target=target, tenant_id=tenant_id))
        if live:
            raise Conflict(
                f"tenant {tenant_id!r} has {live} live schedules on target {target!r}; cancel them"
                " before revoking the grant"
            )
        if await conn.fetchval(*QUERIES.delete_target_grant(target=target, tenant_id=tenant_id)):
            row = await conn.fetchrow(*QUERIES.bump_target_version(target=target, now=clock.now()))
            await _announce(conn, row, clock.now())
        return await _target(conn, row)


async def list_targets(pool: asyncpg.Pool, tenant_id: str | None = None) -> list[Target]:
    rows = await pool.fetch(*QUERIES.list_targets(tenant_id=tenant_id))
    return [Target(r["target"], r["owner_tenant"], tuple(r["granted"]), r["version"]) for r in rows]


async def _lock(conn: asyncpg.Connection, target: str) -> asyncpg.Record:
    validate_target(target)
    row = await conn.fetchrow(*QUERIES.lock_target(target=target))
    if row is None:
        raise NotFound("target", f"{target} (it is registered by its first schedule, or with chronoq target register)")
    return row


async def _tenant_exists(conn: asyncpg.Connection, tenant_id: str) -> None:
    if await conn.fetchrow(*QUERIES.get_tenant(tenant_id=tenant_id)) is None:
        raise NotFound("tenant", tenant_id)


async def _target(conn: asyncpg.Connection, row: asyncpg.Record) -> Target:
    tenants = [r["tenant_id"] for r in await conn.fetch(*QUERIES.target_tenants(target=row["target"]))]
    return Target(row["target"], row["owner_tenant"], tuple(tenants[1:]), row["version"])


async def _announce(conn: asyncpg.Connection, row: asyncpg.Record, now: datetime | None) -> None:
    tenants = tuple(r["tenant_id"] for r in await conn.fetch(*QUERIES.target_tenants(target=row["target"])))
    message = TargetBindingMessage(row["target"], tenants, row["version"], row["updated_at"])
    await conn.execute(
        *QUERIES.insert_topic_message(
            tenant_id=row["owner_tenant"],
            topic=TARGET_BINDINGS_TOPIC,
            message_key=message.key,
            message=message.encode(),
            now=now,
        )
    )

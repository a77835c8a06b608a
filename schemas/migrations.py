"""Ordered, forward-only SQL migrations and the runner that applies them.

Two migration sets exist: ``engine`` (the scheduler's database) and
``consumer`` (the dedupe table in a consumer app's own database). Files are
``schemas/migrations/<set>/NNNN_name.sql``; applied versions are recorded in
``chronoq_migrations`` with a checksum, so an edited, already-applied file is
reported instead of silently ignored.

``apply_migrations`` is idempotent and safe when several processes run it at
once: the whole run holds a transaction-scoped advisory lock, so a second
process waits and then finds nothing left to do.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from schemas.errors import ChronoqError

MIGRATION_SETS = ("engine", "consumer")
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS chronoq_migrations (
    migration_set text NOT NULL,
    version       integer NOT NULL,
    name          text NOT NULL,
    checksum      text NOT NULL,
    applied_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (migration_set, version)
)
"""


class MigrationError(ChronoqError):
    """The database's recorded migrations disagree with the files shipped."""


@dataclass(frozen=True)
class Migration:
    migration_set: str
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(migration_set: str) -> list[Migration]:
    """All migrations of a set, in version order; versions must be contiguous from 1."""
    if migration_set not in MIGRATION_SETS:
        raise MigrationError(f"unknown migration set {migration_set!r}; use one of {MIGRATION_SETS}")
    folder = resources.files("schemas").joinpath("migrations", migration_set)
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(migration_set, int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise MigrationError(
                f"migration set {migration_set!r} has a gap: expected version {expected:04d},"
                f" found {migration.version:04d}_{migration.name}.sql"
            )
    return found


def _lock_key(migration_set: str) -> int:
    # A stable signed 64-bit key for pg_advisory_xact_lock, one per set.
    digest = hashlib.sha256(f"chronoq.migrations.{migration_set}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def apply_migrations(conn: asyncpg.Connection, migration_set: str) -> list[Migration]:
    """Apply every not-yet-applied migration of the set; return the ones applied now.

    Runs in one transaction: either all pending migrations apply or none do.
    """
    migrations = load_migrations(migration_set)
    async with conn.transaction():
        # The ledger is created under a global lock too: concurrent
        # CREATE TABLE IF NOT EXISTS can still collide on pg_type.
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _lock_key("ledger"))
        await conn.execute(_LEDGER_DDL)
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _lock_key(migration_set))
        rows = await conn.fetch(
            "SELECT version, name, checksum FROM chronoq_migrations WHERE migration_set = $1",
            migration_set,
        )
        applied = {r["version"]: r for r in rows}
        newly: list[Migration] = []
        for migration in migrations:
            recorded = applied.get(migration.version)
            if recorded is not None:
                if recorded["checksum"] != migration.checksum:
                    raise MigrationError(
                        f"migration {migration_set}/{migration.version:04d}_{migration.name}.sql was"
                        " edited after it was applied; add a new migration instead of editing it"
                    )
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO chronoq_migrations (migration_set, version, name, checksum) VALUES ($1, $2, $3, $4)",
                migration_set,
                migration.version,
                migration.name,
                migration.checksum,
            )
            newly.append(migration)
        unknown = sorted(set(applied) - {m.version for m in migrations})
        if unknown:
            raise MigrationError(
                f"the database has {migration_set} migrations {unknown} that this chronoq does not"
                " ship; upgrade chronoq before running it against this database"
            )
    return newly

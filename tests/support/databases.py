"""The PostgreSQL server the tests run against, and creating and dropping its databases."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg

#: The migrated engine database every test's engine database is cloned from.
TEMPLATE = "chronoq_test_template"


@dataclass
class Servers:
    admin_url: str  # a URL on the server with rights to create databases

    def url(self, database: str) -> str:
        parts = urlsplit(self.admin_url)
        return urlunsplit(parts._replace(path=f"/{database}"))


async def create_database(servers: Servers, name: str, template: str | None = None) -> str:
    """Create database ``name`` (optionally as a copy of ``template``); return its URL."""
    conn = await asyncpg.connect(servers.admin_url)
    try:
        # Identifiers cannot be parameters; names here are the tests' own, quoted.
        clause = f' TEMPLATE "{template}"' if template else ""
        await conn.execute(f'CREATE DATABASE "{name}"{clause}')
    finally:
        await conn.close()
    return servers.url(name)


async def drop_database(servers: Servers, name: str) -> None:
    conn = await asyncpg.connect(servers.admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()

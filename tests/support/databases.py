"""The PostgreSQL server the tests run against, and creating and dropping its databases."""

from __future__ import annotations

import asyncio
import queue
import threading
import uuid
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


class DatabaseSpares:
    """Databases created ahead and dropped behind, on a thread of their own, off the tests' critical path.

    Each test gets a fresh database (a clone of the migrated template, or an empty one). A clone costs
    about 0.2 s here and the suite makes ~570, so a background thread keeps ``depth`` of each kind ready
    and drops used ones while the tests run; a test waits only when none is ready (then it creates its
    own, as before). Names keep the tests' prefixes.
    """

    def __init__(self, servers: Servers, template: str, depth: int = 3) -> None:
        self.servers = servers
        self.template = template
        self.depth = depth
        self._ready: dict[str | None, queue.Queue[str]] = {template: queue.Queue(), None: queue.Queue()}
        self._work: queue.Queue[tuple[str, str | None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="database-spares", daemon=True)
        self._thread.start()
        for kind in self._ready:
            for _ in range(depth):
                self._work.put(("create", kind))

    @staticmethod
    def name(template: str | None) -> str:
        return f"chronoq_{'test' if template else 'consumer'}_{uuid.uuid4().hex[:12]}"

    async def take(self, template: str | None) -> str:
        """A fresh database's URL: a clone of ``template`` (or an empty one for None)."""
        try:
            name = self._ready[template].get_nowait()
        except queue.Empty:
            name = self.name(template)
            await create_database(self.servers, name, template)
        self._work.put(("create", template))  # keep the queue topped up
        return self.servers.url(name)

    def discard(self, url: str) -> None:
        """Drop the database behind ``url`` in the background."""
        self._work.put(("drop", urlsplit(url).path.lstrip("/")))

    def close(self) -> None:
        """Drop what is ready, and stop the thread (databases still to drop die with the server)."""
        self._work.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        conn = await asyncpg.connect(self.servers.admin_url)
        try:
            while (item := await asyncio.to_thread(self._work.get)) is not None:
                action, arg = item
                try:
                    if action == "create":
                        if self._ready[arg].qsize() >= self.depth:
                            continue
                        name = self.name(arg)
                        clause = f' TEMPLATE "{arg}"' if arg else ""
                        await conn.execute(f'CREATE DATABASE "{name}"{clause}')
                        self._ready[arg].put(name)
                    else:
                        await conn.execute(f'DROP DATABASE IF EXISTS "{arg}" WITH (FORCE)')
                except asyncpg.PostgresError:
                    continue  # a spare not made is made by the test itself
            for ready in self._ready.values():
                while not ready.empty():
                    await conn.execute(f'DROP DATABASE IF EXISTS "{ready.get_nowait()}" WITH (FORCE)')
        finally:
            await conn.close()

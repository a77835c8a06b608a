"""A TCP gate in front of a server (PostgreSQL over TCP or its Unix socket, or a Kafka broker), for tests of
processes that start before their dependencies accept connections: closed, it cuts every connection as soon as
it is accepted (and counts it); open, it forwards bytes both ways."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


class Gate:
    """127.0.0.1:<free port> → the server of ``database_url`` (TCP or its Unix socket); closed: every
    connection is cut as soon as it is accepted."""

    def __init__(self, database_url: str) -> None:
        parts = urlsplit(database_url)
        query = dict(parse_qsl(parts.query))
        host, port = query.pop("host", parts.hostname or "127.0.0.1"), int(query.pop("port", parts.port or 5432))
        self.upstream = (host, port)
        # The gated URL: the same database and user over TCP to the gate.
        self.parts = parts._replace(query=urlencode(query))
        self.open, self.refused = False, 0
        self.accepted, self.cut = 0, set[int]()  # connections by number (from 1) cut even while open
        self.server: asyncio.base_events.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        # PostgreSQL only: armed with "before" or "after", the next client write holding a COMMIT (asyncpg's
        # "COMMIT;") cuts that connection — before the server sees the COMMIT (the transaction aborts) or right
        # after (it commits, and the client never hears so). Disarms itself; ``commits_cut`` counts.
        self.cut_commit: str | None = None
        self.commits_cut = 0

    async def start(self) -> str:
        """Listen; return the database URL through the gate."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        user = f"{self.parts.username}@" if self.parts.username else ""
        return urlunsplit(self.parts._replace(netloc=f"{user}127.0.0.1:{port}"))

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = self.upstream
        if host.startswith("/"):  # a socket directory, as the embedded server's URLs name it
            return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        return await asyncio.open_connection(host, port)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if not self.open or self.accepted in self.cut:
            self.refused += 1
            writer.close()
            return
        up_reader, up_writer = await self._connect_upstream()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, from_client: bool) -> None:
            try:
                while data := await src.read(65536):
                    cut = None
                    if from_client and self.cut_commit is not None and b"COMMIT;" in data:
                        cut, self.cut_commit = self.cut_commit, None
                    if cut is not None:
                        self.commits_cut += 1
                        writer.close()  # the client's side first: no answer to the COMMIT reaches it
                        if cut == "after":
                            dst.write(data)
                            await dst.drain()
                            await asyncio.sleep(0.2)  # the server reads and executes it before its socket closes
                        return
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()

        for task in (
            asyncio.create_task(pipe(reader, up_writer, True)),
            asyncio.create_task(pipe(up_reader, writer, False)),
        ):
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

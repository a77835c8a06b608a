"""A Kafka-protocol-aware TCP proxy between clients and a broker, for fault tests.

It forwards bytes both ways and reads only the frame headers (size, api key,
correlation id). Armed with :meth:`drop_next_produce_response`, it forwards
the next Produce request to the broker (which appends the records), swallows
the broker's answer and cuts the connection: the producer sees a lost
connection for a write that did happen, which is exactly when a retry
duplicates.

The broker must advertise the proxy's address (``advertised.listeners``), or
clients would learn the broker's own address from Metadata and bypass it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

PRODUCE = 0


class KafkaProxy:
    """Listens on 127.0.0.1:``port`` (chosen by the OS) and forwards to ``upstream()``."""

    def __init__(self, upstream: Callable[[], tuple[str, int]]) -> None:
        self.upstream = upstream
        self.server: asyncio.base_events.Server | None = None
        self.port: int | None = None
        self.dropped: list[int] = []  # correlation ids of produce responses swallowed
        self._drops_armed = 0
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and cut every open connection; returns when all are closed."""
        if self.server is not None:
            self.server.close()
        # Cutting the sockets ends each connection's pumps; cancelling its
        # task instead would leave asyncio's server callback to log the
        # CancelledError and could leak a writer not yet wired up.
        for writer in list(self._writers):
            _cut(writer)
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=10)
        if self.server is not None:
            await self.server.wait_closed()

    def drop_next_produce_response(self, count: int = 1) -> None:
        self._drops_armed += count

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._writers.add(client_writer)
        try:
            host, port = self.upstream()
            broker_reader, broker_writer = await asyncio.open_connection(host, port)
        except BaseException as err:
            # The broker is down (the connection simply ends, as it would
            # without the proxy) or the loop is going away.
            _cut(client_writer)
            self._writers.discard(client_writer)
            self._connections.discard(task)
            if isinstance(err, OSError):
                return
            raise
        self._writers.add(broker_writer)
        doomed: set[int] = set()

        async def requests() -> None:
            while True:
                frame = await _read_frame(client_reader)
                api_key, _version, correlation_id = struct.unpack_from(">hhi", frame, 4)
                if api_key == PRODUCE and self._drops_armed:
                    self._drops_armed -= 1
                    doomed.add(correlation_id)
                broker_writer.write(frame)
                await broker_writer.drain()

        async def responses() -> None:
            while True:
                frame = await _read_frame(broker_reader)
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                if correlation_id in doomed:
                    self.dropped.append(correlation_id)
                    return
                client_writer.write(frame)
                await client_writer.drain()

        pumps = [asyncio.create_task(requests()), asyncio.create_task(responses())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            _cut(client_writer)
            _cut(broker_writer)
            self._writers.difference_update((client_writer, broker_writer))
            self._connections.discard(task)


def _cut(writer: asyncio.StreamWriter) -> None:
    # abort(): a reset, not a polite FIN, so the client fails its in-flight
    # requests at once instead of waiting for a timeout; close() marks the
    # writer closed so it is not reported as leaked.
    writer.transport.abort()
    writer.close()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    """One size-prefixed Kafka frame, size included (raises IncompleteReadError at EOF)."""
    header = await reader.readexactly(4)
    (size,) = struct.unpack(">i", header)
    return header + await reader.readexactly(size)

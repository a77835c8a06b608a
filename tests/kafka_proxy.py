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
from typing import Callable

PRODUCE = 0


class KafkaProxy:
    """Listens on 127.0.0.1:``port`` (chosen by the OS) and forwards to ``upstream()``."""

    def __init__(self, upstream: Callable[[], tuple[str, int]]) -> None:
        self.upstream = upstream
        self.server: asyncio.base_events.Server | None = None
        self.port: int | None = None
        self.dropped: list[int] = []            # correlation ids of produce responses swallowed
        self._drops_armed = 0
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    def drop_next_produce_response(self, count: int = 1) -> None:
        self._drops_armed += count

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            host, port = self.upstream()
            broker_reader, broker_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.transport.abort()
            self._connections.discard(task)
            return
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
            # abort(): a reset, not a polite FIN, so the client fails its
            # in-flight requests at once instead of waiting for a timeout.
            client_writer.transport.abort()
            broker_writer.transport.abort()
            self._connections.discard(task)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    """One size-prefixed Kafka frame, size included (raises IncompleteReadError at EOF)."""
    header = await reader.readexactly(4)
    (size,) = struct.unpack(">i", header)
    return header + await reader.readexactly(size)

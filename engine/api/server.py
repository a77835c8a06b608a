"""Serving the API with uvicorn inside a chronoq process.

The caller owns signals (``chronoq up`` shuts every component down in order),
so uvicorn's own signal capture is switched off; the listening socket is bound
by us so port 0 yields a free port whose number we know.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

log = logging.getLogger("chronoq.api")


class _Server(uvicorn.Server):
    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


async def serve(app: Callable[..., Any], sock: socket.socket, stop: asyncio.Event) -> None:
    """Serve ``app`` on ``sock`` until ``stop`` is set, then finish in-flight requests."""
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, log_level="warning")
    server = _Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    stopping.cancel()
    await serving

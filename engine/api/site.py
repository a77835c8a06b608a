"""What the API process serves on its one port: the JSON API, the console and the metrics.

A plain ASGI dispatcher by path: ``/ui`` and below go to the console
(:mod:`engine.api.console`), ``/metrics`` to the Prometheus exposition
(:mod:`engine.api.metrics_endpoint`), everything else to the JSON API
(:class:`engine.api.app.Api`). No separate server, no framework.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

Asgi = Callable[
    [Mapping[str, Any], Callable[[], Awaitable[Mapping[str, Any]]], Callable[[Mapping[str, Any]], Awaitable[None]]],
    Awaitable[None],
]


class Site:
    def __init__(self, api: Asgi, console: Asgi | None = None, metrics: Asgi | None = None) -> None:
        self.api, self.console, self.metrics = api, console, metrics

    async def __call__(
        self,
        scope: Mapping[str, Any],
        receive: Callable[[], Awaitable[Mapping[str, Any]]],
        send: Callable[[Mapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if self.console is not None and (path == "/ui" or path.startswith("/ui/")):
                return await self.console(scope, receive, send)
            if self.metrics is not None and path == "/metrics":
                return await self.metrics(scope, receive, send)
        await self.api(scope, receive, send)

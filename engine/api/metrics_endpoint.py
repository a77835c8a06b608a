"""``GET /metrics``: the process's OpenTelemetry metrics in the Prometheus text format.

The metrics are the ones every component already records through
OpenTelemetry; :func:`schemas.observability.configure_telemetry` adds the
OpenTelemetry Prometheus exporter's reader beside the OTLP one (OTLP export
stays as it was), and this endpoint renders what that reader collects. Names
follow the exporter's translation: ``chronoq.schedule_lag`` (unit s) becomes
``chronoq_schedule_lag_seconds_bucket|sum|count``, counters get ``_total``.

The API process serves it on its own port (``/metrics`` beside ``/v1`` and
``/ui``); engine and relay processes serve it with ``--metrics-port``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest


class MetricsEndpoint:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry

    async def __call__(
        self,
        scope: Mapping[str, Any],
        receive: Callable[[], Awaitable[Mapping[str, Any]]],
        send: Callable[[Mapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            status, body, kind = 405, b"use GET\n", b"text/plain"
        elif scope["path"] != "/metrics":
            status, body, kind = 404, b"metrics are at /metrics\n", b"text/plain"
        else:
            status, body, kind = 200, generate_latest(self.registry), CONTENT_TYPE_LATEST.encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

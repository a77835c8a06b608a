"""The HTTP API of the control plane (ASGI), its OpenAPI document and its server."""

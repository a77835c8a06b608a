"""Waiting on a condition, never on the wall clock alone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def wait_for(predicate: Callable[[], Any | Awaitable[Any]], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Await ``predicate()`` (sync or async) until truthy and return its value; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)

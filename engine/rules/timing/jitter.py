"""Deterministic jitter of flexible occurrences."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta


def jitter_offset(occurrence_id: uuid.UUID, window: timedelta) -> timedelta:
    """Deterministic jitter in [0, window) at millisecond granularity.

    ``int.from_bytes(sha256(occurrence_id.bytes)[:8], "big") % window_ms``
    milliseconds: the same for every process, host and Python version (unlike
    ``hash()``), so a replayed occurrence gets the same ``available_at``.
    """
    if window < timedelta(0):
        raise ValueError("window must not be negative")
    window_ms = window // timedelta(milliseconds=1)
    if window_ms <= 0:
        return timedelta(0)
    digest = hashlib.sha256(occurrence_id.bytes).digest()
    return timedelta(milliseconds=int.from_bytes(digest[:8], "big") % window_ms)

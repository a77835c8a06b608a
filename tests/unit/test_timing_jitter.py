"""Deterministic jitter: available_at = scheduled_for + sha256(occurrence_id) mod flexible_window."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from engine.rules.timing import jitter_offset

NAMESPACE = uuid.UUID("2f0f8a5e-8f0e-4a8e-9c1b-0f6d6f3f9a11")


@pytest.mark.parametrize(
    ("occurrence_id", "window", "expected"),
    [
        # Fixed vectors: if these change, every flexible occurrence moves. Don't update them casually.
        (
            "00000000-0000-0000-0000-000000000000",
            timedelta(minutes=5),
            timedelta(minutes=4, seconds=54, milliseconds=69),
        ),
        (
            "00000000-0000-0000-0000-000000000000",
            timedelta(hours=24),
            timedelta(hours=20, minutes=39, seconds=54, milliseconds=69),
        ),
        (
            "6f1c2a9e-3b7d-4c1e-9a51-2f0e8d7c6b5a",
            timedelta(minutes=5),
            timedelta(minutes=1, seconds=12, milliseconds=82),
        ),
        ("6f1c2a9e-3b7d-4c1e-9a51-2f0e8d7c6b5a", timedelta(seconds=1), timedelta(milliseconds=82)),
    ],
)
def test_known_vectors(occurrence_id: str, window: timedelta, expected: timedelta) -> None:
    assert jitter_offset(uuid.UUID(occurrence_id), window) == expected


def test_same_id_same_offset_and_within_the_window() -> None:
    window = timedelta(minutes=5)
    for number in range(2000):
        occurrence = uuid.uuid5(NAMESPACE, f"occurrence-{number}")
        offset = jitter_offset(occurrence, window)
        assert offset == jitter_offset(uuid.UUID(str(occurrence)), window)
        assert timedelta(0) <= offset < window
        assert offset % timedelta(milliseconds=1) == timedelta(0)


def test_zero_and_tiny_windows() -> None:
    occurrence = uuid.uuid5(NAMESPACE, "x")
    assert jitter_offset(occurrence, timedelta(0)) == timedelta(0)
    assert jitter_offset(occurrence, timedelta(microseconds=999)) == timedelta(0)
    assert jitter_offset(occurrence, timedelta(milliseconds=1)) == timedelta(0)
    with pytest.raises(ValueError):
        jitter_offset(occurrence, timedelta(seconds=-1))


def test_roughly_uniform_over_the_window() -> None:
    """10,000 ids into 10 buckets; the ids are fixed, so this cannot flake."""
    window = timedelta(seconds=10)
    buckets = [0] * 10
    for number in range(10_000):
        offset = jitter_offset(uuid.uuid5(NAMESPACE, f"occurrence-{number}"), window)
        buckets[offset // timedelta(seconds=1)] += 1
    chi_square = sum((count - 1000) ** 2 / 1000 for count in buckets)
    # 9 degrees of freedom: 27.9 is the 0.1% critical value; a biased hash lands far above it.
    assert chi_square < 27.9, buckets
    assert min(buckets) > 850 and max(buckets) < 1150, buckets

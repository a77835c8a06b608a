"""The embedded PostgreSQL's buffer cache is sized to the machine (engine/cli/embedded/server_sizing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.cli.embedded.server_sizing import (
    CEILING_MB,
    FLOOR_MB,
    MB,
    OVERRIDE_VARIABLE,
    embedded_server_settings,
    memory_limit,
    shared_buffers_for,
)
from schemas.errors import StackError

GB = 1024 * MB


def megabytes(setting: str) -> int:
    assert setting.endswith("MB"), setting
    return int(setting[:-2])


@given(st.integers(min_value=0, max_value=1 << 50))
def test_an_eighth_of_memory_within_the_floor_and_the_ceiling(memory: int) -> None:
    size = megabytes(shared_buffers_for(memory))
    assert FLOOR_MB <= size <= CEILING_MB
    if FLOOR_MB < size < CEILING_MB:
        assert size == memory // 8 // MB
    # Never more than an eighth, unless that is below PostgreSQL's own default.
    assert size * MB <= max(memory // 8, FLOOR_MB * MB)


@given(st.integers(min_value=0, max_value=1 << 45), st.integers(min_value=0, max_value=1 << 45))
def test_more_memory_never_gets_a_smaller_cache(a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert megabytes(shared_buffers_for(low)) <= megabytes(shared_buffers_for(high))


def test_the_development_machine_and_small_containers() -> None:
    assert shared_buffers_for(24 * GB) == "3072MB"
    assert shared_buffers_for(64 * GB) == "4096MB"
    assert shared_buffers_for(512 * MB) == "128MB"  # a small container keeps PostgreSQL's default


def test_a_container_limit_below_the_machine_wins(tmp_path: Path) -> None:
    limit = tmp_path / "memory.max"
    limit.write_text(f"{2 * GB}\n")
    assert memory_limit((limit,)) == min(2 * GB, memory_limit(()))


def test_no_container_limit_means_the_machine(tmp_path: Path) -> None:
    unlimited = tmp_path / "memory.max"
    unlimited.write_text("max\n")
    physical = memory_limit(())
    assert physical > 0
    assert memory_limit((unlimited, tmp_path / "absent")) == physical
    # cgroup v1 writes a huge number for "no limit": the machine's memory is lower.
    v1 = tmp_path / "memory.limit_in_bytes"
    v1.write_text(str(1 << 62))
    assert memory_limit((v1,)) == physical


def test_the_override_is_taken_as_given() -> None:
    assert embedded_server_settings({OVERRIDE_VARIABLE: "512MB"}) == {"shared_buffers": "512MB"}
    assert embedded_server_settings({}, memory_bytes=16 * GB) == {"shared_buffers": "2048MB"}


@pytest.mark.parametrize("value", ["lots", "512", "-1GB", "1.5GB", "512 MB; DROP TABLE x", "0MB"])
def test_an_override_postgresql_would_not_read_is_refused_with_what_to_write(value: str) -> None:
    with pytest.raises(StackError, match="e.g. 512MB or 2GB"):
        embedded_server_settings({OVERRIDE_VARIABLE: value})

"""The fast murmur2 partitioner picks exactly the partition Kafka's clients pick."""

from __future__ import annotations

import uuid

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from schemas.key_partitioning import key_partition, murmur2

# librdkafka's own murmur2 test vectors (src/rdmurmur2.c), which match the Java client's.
LIBRDKAFKA_VECTORS = [
    (b"kafka", 0xD067CF64),
    (b"giberish123456789", 0x8F552B0C),
    (b"1234", 0x9FC97B14),
    (b"234", 0xE7C009CA),
    (b"34", 0x873930DA),
    (b"4", 0x5A4B5CA1),
    (b"PreAmbleWillBeRemoved,ThePrePartThatIs", 0x78424F1C),
    (b"", 0x106E08D9),
]


@pytest.mark.parametrize(("key", "expected"), LIBRDKAFKA_VECTORS)
def test_known_hashes(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@given(st.binary(max_size=300))
def test_equals_aiokafka_on_any_bytes(key: bytes) -> None:
    assert murmur2(key) == aiokafka_murmur2(key)


@given(st.uuids(), st.lists(st.integers(0, 10_000), min_size=1, max_size=64, unique=True))
def test_partition_equals_the_default_partitioner(occurrence: uuid.UUID, ids: list[int]) -> None:
    key, partitions = str(occurrence).encode(), sorted(ids)
    assert key_partition(key, partitions) == DefaultPartitioner()(key, partitions, partitions)

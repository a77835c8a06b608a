"""Kafka's default partition of a keyed record: the Java client's murmur2 of the key.

Every producer of a keyed topic must pick a key's partition exactly as the Java
client, librdkafka's ``murmur2_random`` and aiokafka's ``DefaultPartitioner``
do, or the events of one occurrence (started, heartbeats, outcome) could land on
two partitions and lose their order. This is that function, written for speed:
aiokafka's pure-Python ``murmur2`` masks every byte and step separately and cost
~11 µs per 36-byte key here, the largest single item of a consumer app's
attempt reports (docs/benchmarks.md, "The burst to the handler"); reading the
key's words with one ``struct`` call and masking once per multiplication takes
~5 µs. A property test keeps both equal on arbitrary bytes. Pure, no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
#: One little-endian word reader per key length in words (keys here are a few lengths: UUIDs, names).
_READERS: dict[int, Callable[[bytes], tuple[int, ...]]] = {}


def murmur2(key: bytes) -> int:
    """The 32-bit murmur2 hash (unsigned) of ``key``, as ``org.apache.kafka.common.utils.Utils.murmur2``."""
    length = len(key)
    words = length >> 2
    read = _READERS.get(words)
    if read is None:
        read = _READERS.setdefault(words, struct.Struct(f"<{words}I").unpack_from)
    h = _SEED ^ length
    for k in read(key):
        k = (k * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    tail = length & 3
    if tail:
        base = length - tail
        if tail == 3:
            h ^= key[base + 2] << 16
        if tail >= 2:
            h ^= key[base + 1] << 8
        h ^= key[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def key_partition(key: bytes, partitions: Sequence[int]) -> int:
    """The partition of a record keyed ``key`` among ``partitions`` (sorted by id), as Kafka's default
    partitioner picks it: ``toPositive(murmur2(key)) % len(partitions)``."""
    return partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]

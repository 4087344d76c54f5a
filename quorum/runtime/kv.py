"""The replicated key-value state machine.

Commands travel as opaque data records in the log (the core never looks inside); this module
encodes them and applies committed ones. Applying is deterministic, so every replica that
applied the same prefix holds the same map (the simulation's "committed data identical"
invariant relies on that).

Record layout: ``op (1 byte) | key length (uint16 LE) | key (UTF-8) | value``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator

from quorum.types import ErrorCode, KraftError

OP_PUT = 1
OP_DELETE = 2
MAX_KEY_BYTES = 1024
MAX_VALUE_BYTES = 4 * 1024 * 1024
_KLEN = struct.Struct("<H")
_SNAP_ENTRY = struct.Struct("<HI")
_SNAP_CHUNK = 1024 * 1024


def check_key(key: str) -> bytes:
    """Validate a key and return its UTF-8 bytes; raises INVALID_REQUEST naming the problem."""
    if not key:
        raise KraftError(ErrorCode.INVALID_REQUEST, "key is empty")
    kb = key.encode("utf-8", "surrogatepass")
    if len(kb) > MAX_KEY_BYTES:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"key is {len(kb)} bytes, the limit is {MAX_KEY_BYTES}")
    if "\x00" in key:
        raise KraftError(ErrorCode.INVALID_REQUEST, "key contains a NUL character")
    return kb


def encode_put(key: str, value: bytes) -> bytes:
    kb = check_key(key)
    if len(value) > MAX_VALUE_BYTES:
        raise KraftError(
            ErrorCode.PAYLOAD_TOO_LARGE, f"value is {len(value)} bytes, the limit is {MAX_VALUE_BYTES}"
        )
    return bytes((OP_PUT,)) + _KLEN.pack(len(kb)) + kb + value


def encode_delete(key: str) -> bytes:
    kb = check_key(key)
    return bytes((OP_DELETE,)) + _KLEN.pack(len(kb)) + kb


Value = bytes | memoryview


def decode_snapshot(chunks: Iterable[bytes | memoryview]) -> dict[bytes, Value]:
    """The map a snapshot's chunks hold (the inverse of :meth:`KVStore.snapshot_chunks`); pure,
    so a follower can run it off the event loop while the old map keeps serving.
    Values are views into the chunks, not copies (a fetched snapshot's chunks are the received
    bytes: a 1 GB state is not copied once more on the catch-up's critical path); keys are
    copied (they are hashed). Raises CORRUPT_RECORD on a malformed chunk."""
    data: dict[bytes, Value] = {}
    for c in chunks:
        chunk = memoryview(c)
        pos = 0
        n = len(chunk)
        while pos < n:
            if pos + _SNAP_ENTRY.size > n:
                raise KraftError(ErrorCode.CORRUPT_RECORD, "snapshot entry header cut short")
            kl, vl = _SNAP_ENTRY.unpack_from(chunk, pos)
            pos += _SNAP_ENTRY.size
            if pos + kl + vl > n:
                raise KraftError(ErrorCode.CORRUPT_RECORD, "snapshot entry runs past its chunk")
            data[bytes(chunk[pos : pos + kl])] = chunk[pos + kl : pos + kl + vl]
            pos += kl + vl
    return data


class KVStore:
    """The in-memory map plus the offset of the last applied record."""

    def __init__(self) -> None:
        # values: bytes, or views into the chunks of the snapshot the map was loaded from
        self.data: dict[bytes, Value] = {}
        self.applied_offset = -1  # offset of the last applied record; -1 = none

    def apply(self, offset: int, record: bytes) -> None:
        """Apply one committed record. A record that does not decode is skipped (it was
        validated when proposed, so this only guards against a bug, never loses others)."""
        if offset <= self.applied_offset:
            return  # idempotent on replay
        self.applied_offset = offset
        if len(record) < 3:
            return
        op = record[0]
        (klen,) = _KLEN.unpack_from(record, 1)
        key = record[3 : 3 + klen]
        if op == OP_PUT:
            self.data[key] = record[3 + klen :]
        elif op == OP_DELETE:
            self.data.pop(key, None)

    def apply_batch(self, base_offset: int, records: Iterable[bytes]) -> None:
        for i, r in enumerate(records):
            self.apply(base_offset + i, r)

    def get(self, key: str) -> bytes | None:
        v = self.data.get(check_key(key))
        return v if v is None or isinstance(v, bytes) else bytes(v)

    def snapshot_chunks(self) -> Iterator[bytes]:
        """The map as chunks of ``(key len, value len, key, value)`` entries, sorted by key so
        two replicas with equal maps produce equal snapshots."""
        buf = bytearray()
        for k in sorted(self.data):
            v = self.data[k]
            buf += _SNAP_ENTRY.pack(len(k), len(v))
            buf += k
            buf += v
            if len(buf) >= _SNAP_CHUNK:
                yield bytes(buf)
                buf.clear()
        if buf:
            yield bytes(buf)

    def load_snapshot(self, chunks: Iterable[bytes | memoryview], applied_offset: int) -> None:
        """Replace the map with a snapshot's; raises CORRUPT_RECORD on a malformed chunk."""
        self.data = decode_snapshot(chunks)
        self.applied_offset = applied_offset

    def digest(self) -> int:
        """An order-independent checksum of the map (for recovery verification and tests)."""
        h = 0
        for k, v in self.data.items():
            h ^= zlib.crc32(v, zlib.crc32(k)) * 2654435761 % (1 << 64)
        return h

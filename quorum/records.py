"""The record-batch codec: pure functions between :class:`~quorum.types.BatchInfo` /
control records and the bytes that sit in log segments, Fetch responses and snapshots.

The layout (little-endian) is documented in ``docs/design.md``. Every batch carries a CRC
(zlib.crc32, computed in C) over everything after the CRC field, so a torn or flipped batch is
detected wherever it travels: on log recovery, on a follower receiving Fetch bytes, and in a
snapshot chunk. Data records are opaque bytes; control records are small JSON objects.

Invariant: ``decode_batches(encode_batch(...))`` returns the same base offset, epoch, record
count and records; any single-byte change in a batch makes ``decode_batches`` raise
:class:`CorruptRecordError` (or report a torn tail when asked to tolerate one).
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from quorum.types import (
    AddVoter,
    BatchInfo,
    ControlRecord,
    ControlType,
    ErrorCode,
    KraftError,
    LeaderChange,
    LeaderRecovery,
    LeaderRecoveryState,
    RemoveVoter,
    ReplicaKey,
    SnapshotFooter,
    SnapshotHeader,
    TargetVoters,
)

# base_offset q, batch_length i, crc I, epoch i, attributes B, record_count i, append_time q
_HEADER = struct.Struct("<qiIiBiq")
HEADER_SIZE = _HEADER.size  # 33
_LEN = struct.Struct("<I")
_PREFIX = 12  # base_offset + batch_length: the bytes not covered by batch_length
_CRC_START = 16  # the CRC covers bytes [16, end)
ATTR_CONTROL = 0x01
MAX_BATCH_BYTES = 64 * 1024 * 1024


class CorruptRecordError(KraftError):
    """A batch whose bytes do not decode (bad length, CRC mismatch, bad control JSON)."""

    def __init__(self, message: str, position: int = -1) -> None:
        super().__init__(ErrorCode.CORRUPT_RECORD, message)
        self.position = position


@dataclass(frozen=True)
class DecodedBatch:
    """One batch found in a buffer: its header facts and where its bytes are."""

    info: BatchInfo
    position: int  # byte position of the batch in the buffer
    data: memoryview  # the whole encoded batch

    @property
    def end(self) -> int:
        return self.position + len(self.data)


def _encode(
    base_offset: int, epoch: int, records: Sequence[bytes], attributes: int, append_time_ms: int
) -> bytes:
    parts = [b""]
    for r in records:
        parts.append(_LEN.pack(len(r)))
        parts.append(r)
    body = b"".join(parts)
    batch_length = HEADER_SIZE - _PREFIX + len(body)
    head_rest = struct.pack("<iBiq", epoch, attributes, len(records), append_time_ms)
    crc = zlib.crc32(body, zlib.crc32(head_rest))
    return struct.pack("<qiI", base_offset, batch_length, crc) + head_rest + body


def encode_batch(
    base_offset: int, epoch: int, records: Sequence[bytes], append_time_ms: int | None = None
) -> bytes:
    """Encode a data batch of opaque records."""
    if not records:
        raise ValueError("a batch holds at least one record")
    t = int(time.time() * 1000) if append_time_ms is None else append_time_ms
    return _encode(base_offset, epoch, records, 0, t)


def encode_control_batch(
    base_offset: int, epoch: int, controls: Sequence[ControlRecord], append_time_ms: int | None = None
) -> bytes:
    """Encode a control batch (LeaderChangeMessage, voter records, ...)."""
    if not controls:
        raise ValueError("a control batch holds at least one record")
    t = int(time.time() * 1000) if append_time_ms is None else append_time_ms
    return _encode(base_offset, epoch, [encode_control(c) for c in controls], ATTR_CONTROL, t)


def _key(k: ReplicaKey) -> dict[str, Any]:
    return {"id": k.id, "uuid": k.uuid}


def _unkey(d: Any) -> ReplicaKey:
    if not isinstance(d, dict) or not isinstance(d.get("id"), int):
        raise ValueError(f"bad replica key {d!r}")
    u = d.get("uuid")
    if u is not None and not isinstance(u, str):
        raise ValueError(f"bad replica uuid {u!r}")
    return ReplicaKey(d["id"], u)


def encode_control(c: ControlRecord) -> bytes:
    """One control record as compact JSON with its ``type`` number."""
    d: dict[str, Any] = {"type": int(c.type)}
    if isinstance(c, LeaderChange):
        d.update(
            leader_id=c.leader_id,
            voters=[_key(v) for v in c.voters],
            granting_voters=[_key(v) for v in c.granting_voters],
        )
    elif isinstance(c, AddVoter):
        d.update(voter=_key(c.voter), endpoint=c.endpoint)
    elif isinstance(c, RemoveVoter):
        d.update(voter=_key(c.voter))
    elif isinstance(c, TargetVoters):
        d.update(ids=None if c.ids is None else list(c.ids))
    elif isinstance(c, LeaderRecovery):
        d.update(state=c.state.value, lost_after=c.lost_after)
    elif isinstance(c, SnapshotHeader):
        d.update(last_contained_log_timestamp=c.last_contained_log_timestamp)
    elif isinstance(c, SnapshotFooter):
        pass
    else:  # pragma: no cover - exhaustive over ControlRecord
        raise TypeError(f"not a control record: {c!r}")
    return json.dumps(d, separators=(",", ":")).encode()


def decode_control(raw: bytes | memoryview) -> ControlRecord:
    """Parse one control record; raises ``ValueError`` naming what is wrong."""
    d = json.loads(bytes(raw))
    if not isinstance(d, dict) or "type" not in d:
        raise ValueError("control record without a type")
    t = ControlType(d["type"])
    if t is ControlType.LEADER_CHANGE:
        return LeaderChange(
            leader_id=int(d["leader_id"]),
            voters=tuple(_unkey(v) for v in d["voters"]),
            granting_voters=tuple(_unkey(v) for v in d["granting_voters"]),
        )
    if t is ControlType.ADD_VOTER:
        ep = d.get("endpoint")
        return AddVoter(_unkey(d["voter"]), endpoint=ep if isinstance(ep, str) else None)
    if t is ControlType.REMOVE_VOTER:
        return RemoveVoter(_unkey(d["voter"]))
    if t is ControlType.TARGET_VOTERS:
        ids = d.get("ids")
        return TargetVoters(None if ids is None else tuple(int(i) for i in ids))
    if t is ControlType.LEADER_RECOVERY:
        return LeaderRecovery(LeaderRecoveryState(d["state"]), int(d.get("lost_after", -1)))
    if t is ControlType.SNAPSHOT_HEADER:
        return SnapshotHeader(int(d["last_contained_log_timestamp"]))
    return SnapshotFooter()


def _iter_records(view: memoryview, count: int, pos: int) -> Iterator[memoryview]:
    end = len(view)
    for _ in range(count):
        if pos + 4 > end:
            raise CorruptRecordError("record length runs past the batch end")
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + n > end:
            raise CorruptRecordError("record runs past the batch end")
        yield view[pos : pos + n]
        pos += n
    if pos != end:
        raise CorruptRecordError("trailing bytes after the last record of a batch")


def decode_batches(
    buf: bytes | bytearray | memoryview, *, verify_crc: bool = True, allow_torn_tail: bool = False
) -> tuple[list[DecodedBatch], int]:
    """Decode every whole batch in ``buf``.

    Returns the batches and the number of bytes they cover. With ``allow_torn_tail`` a last
    batch that is cut short (or whose CRC fails while being the last thing in the buffer) ends
    the scan instead of raising; the caller decides what to do with the remaining bytes.
    Without it, any incomplete or corrupt batch raises :class:`CorruptRecordError`.
    """
    view = memoryview(buf)
    out: list[DecodedBatch] = []
    pos = 0
    n = len(view)
    while pos < n:
        if n - pos < HEADER_SIZE:
            if allow_torn_tail:
                break
            raise CorruptRecordError(
                f"{n - pos} bytes at position {pos} are too short for a batch header", pos
            )
        base, blen, crc, epoch, attrs, count, _t = _HEADER.unpack_from(view, pos)
        total = _PREFIX + blen
        if blen < HEADER_SIZE - _PREFIX or total > MAX_BATCH_BYTES or count < 1 or epoch < 0 or base < 0:
            if allow_torn_tail and _rest_is_tail(view, pos):
                break
            raise CorruptRecordError(
                f"invalid batch header at position {pos} (length {blen}, count {count}, epoch {epoch})", pos
            )
        if pos + total > n:
            if allow_torn_tail:
                break
            raise CorruptRecordError(f"batch at position {pos} needs {total} bytes, {n - pos} present", pos)
        data = view[pos : pos + total]
        if verify_crc and zlib.crc32(data[_CRC_START:]) != crc:
            if allow_torn_tail and pos + total == n:
                break
            raise CorruptRecordError(f"CRC mismatch in batch at offset {base} (position {pos})", pos)
        controls: tuple[ControlRecord, ...] = ()
        if attrs & ATTR_CONTROL:
            try:
                controls = tuple(decode_control(r) for r in _iter_records(data, count, HEADER_SIZE))
            except (ValueError, KeyError, TypeError) as e:
                raise CorruptRecordError(f"bad control record in batch at offset {base}: {e}", pos) from e
        info = BatchInfo(base_offset=base, epoch=epoch, count=count, size_bytes=total, controls=controls)
        out.append(DecodedBatch(info, pos, data))
        pos += total
    return out, pos


def _rest_is_tail(view: memoryview, pos: int) -> bool:
    """A garbage header counts as a torn tail only if nothing after it looks like data: a
    crash mid-write leaves zeros or a partial header, not a valid batch further on."""
    return (
        not view[pos + HEADER_SIZE : pos + HEADER_SIZE + 4096].tobytes().strip(b"\x00")
        or len(view) - pos < 4096
    )


def data_records(batch: DecodedBatch | bytes | memoryview) -> list[bytes]:
    """The opaque records of one data batch (already CRC-checked by ``decode_batches``)."""
    data = batch.data if isinstance(batch, DecodedBatch) else memoryview(batch)
    (count,) = struct.unpack_from("<i", data, 21)
    return [bytes(r) for r in _iter_records(data, count, HEADER_SIZE)]


def batch_header(buf: bytes | memoryview, pos: int = 0) -> tuple[int, int, int, int]:
    """(base_offset, total_size, epoch, record_count) of the batch at ``pos`` without
    checking its CRC: for fast index rebuilding."""
    base, blen, _crc, epoch, _attrs, count, _t = _HEADER.unpack_from(buf, pos)
    return base, _PREFIX + blen, epoch, count

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
import re
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
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
_MAX_LIST = 4096  # voters in one control record: far more than any real quorum
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_CONTROL_FIELDS: dict[ControlType, frozenset[str]] = {
    ControlType.LEADER_CHANGE: frozenset({"leader_id", "voters", "granting_voters"}),
    ControlType.ADD_VOTER: frozenset({"voter", "endpoint"}),
    ControlType.REMOVE_VOTER: frozenset({"voter"}),
    ControlType.TARGET_VOTERS: frozenset({"ids"}),
    ControlType.LEADER_RECOVERY: frozenset({"state", "lost_after"}),
    ControlType.SNAPSHOT_HEADER: frozenset({"last_contained_log_timestamp"}),
    ControlType.SNAPSHOT_FOOTER: frozenset(),
}


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


def _strict_int(d: dict[str, Any], name: str, lo: int, hi: int) -> int:
    v = d.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"field {name} must be an integer {lo}..{hi}, got {v!r:.60}")
    return v


def _unkey(d: Any) -> ReplicaKey:
    if not isinstance(d, dict) or not set(d) <= {"id", "uuid"}:
        raise ValueError(f"bad replica key {d!r:.80}")
    rid = _strict_int(d, "id", 0, _INT32_MAX)
    u = d.get("uuid")
    if u is not None and (not isinstance(u, str) or not _UUID.match(u)):
        raise ValueError(f"bad replica uuid {u!r:.60}")
    return ReplicaKey(rid, u)


def _keys(d: dict[str, Any], name: str) -> tuple[ReplicaKey, ...]:
    v = d.get(name)
    if not isinstance(v, list) or len(v) > _MAX_LIST:
        raise ValueError(f"field {name} must be a list of at most {_MAX_LIST} replica keys")
    return tuple(_unkey(x) for x in v)


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
    """Parse one control record strictly (integers are integers in range, UUIDs canonical,
    lists bounded, no unknown fields); raises ``ValueError`` naming what is wrong."""
    data = bytes(raw)
    if data.count(b"[") + data.count(b"{") > 2 * _MAX_LIST + 4 and _depth(data) > 4:
        raise ValueError("control record nested too deeply")
    try:
        d = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("control record nested too deeply") from None
    if not isinstance(d, dict) or "type" not in d:
        raise ValueError("control record without a type")
    t = ControlType(_strict_int(d, "type", 0, 255))
    allowed = _CONTROL_FIELDS[t]
    unknown = sorted(set(d) - allowed - {"type"})
    if unknown:
        raise ValueError(f"control record {t.name}: unknown field(s) {', '.join(unknown)[:100]}")
    if t is ControlType.LEADER_CHANGE:
        return LeaderChange(
            leader_id=_strict_int(d, "leader_id", -1, _INT32_MAX),
            voters=_keys(d, "voters"),
            granting_voters=_keys(d, "granting_voters"),
        )
    if t is ControlType.ADD_VOTER:
        ep = d.get("endpoint")
        if ep is not None and (not isinstance(ep, str) or len(ep) > 262):
            raise ValueError(f"field endpoint must be HOST:PORT, got {ep!r:.60}")
        return AddVoter(_unkey(d.get("voter")), endpoint=ep)
    if t is ControlType.REMOVE_VOTER:
        return RemoveVoter(_unkey(d.get("voter")))
    if t is ControlType.TARGET_VOTERS:
        ids = d.get("ids")
        if ids is None:
            return TargetVoters(None)
        if not isinstance(ids, list) or len(ids) > _MAX_LIST:
            raise ValueError("field ids must be a list of replica ids")
        return TargetVoters(tuple(_strict_int({"id": i}, "id", 0, _INT32_MAX) for i in ids))
    if t is ControlType.LEADER_RECOVERY:
        return LeaderRecovery(
            LeaderRecoveryState(d.get("state")),
            _strict_int(d, "lost_after", -1, _INT64_MAX) if "lost_after" in d else -1,
        )
    if t is ControlType.SNAPSHOT_HEADER:
        return SnapshotHeader(_strict_int(d, "last_contained_log_timestamp", -1, _INT64_MAX))
    return SnapshotFooter()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _depth(data: bytes) -> int:
    """Maximum bracket nesting of JSON text (strings skipped)."""
    depth = best = 0
    in_str = esc = False
    for b in data:
        if in_str:
            if esc:
                esc = False
            elif b == 0x5C:
                esc = True
            elif b == 0x22:
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):
            depth += 1
            best = max(best, depth)
        elif b in (0x5D, 0x7D):
            depth -= 1
    return best


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
        if (
            blen < HEADER_SIZE - _PREFIX
            or total > MAX_BATCH_BYTES
            or count < 1
            or epoch < 0
            or base < 0
            or base + count > _INT64_MAX  # the batch's offsets must stay int64
            or attrs & ~ATTR_CONTROL  # no attribute bits we do not know
        ):
            if allow_torn_tail and _rest_is_tail(view, pos):
                break
            raise CorruptRecordError(
                f"invalid batch header at position {pos} (length {blen}, count {count}, epoch {epoch}, "
                f"base offset {base}, attributes {attrs:#x})",
                pos,
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
            except CorruptRecordError:
                raise
            except (ValueError, KeyError, TypeError) as e:
                raise CorruptRecordError(f"bad control record in batch at offset {base}: {e}", pos) from None
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

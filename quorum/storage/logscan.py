"""Recovery scan of the segmented log on open (the rules are in ``quorum.storage.log``'s
docstring): non-final segments are walked header by header, the last one CRC-verified batch by
batch; damage that is not a torn tail of the last segment raises ``CORRUPT_LOG`` naming the file,
position and offset. These functions only read; the log cuts a torn tail after every segment
was checked.
"""

from __future__ import annotations

import mmap
import re
import struct

from quorum import records
from quorum.storage.base import LogBookkeeping
from quorum.storage.segment import Segment, pread_all
from quorum.types import BatchInfo, ControlRecord, ErrorCode, KraftError

__all__ = ["check_batch", "corrupt", "scan_headers", "scan_last"]

_ATTR_POS = 20  # attributes byte in the batch header (docs/design.md)
_Q = struct.Struct("<q")
_HEADER = struct.Struct("<qiIiBiq")  # the batch header layout of docs/design.md


def corrupt(seg: Segment, position: int, offset: int, what: str, located: bool = False) -> KraftError:
    where = "" if located else f" at position {position} (offset {offset})"
    return KraftError(
        ErrorCode.CORRUPT_LOG,
        f"{seg.path}: {what}{where}; refusing to open the log so that no committed data is dropped",
        file=seg.path,
        position=position,
        offset=offset,
    )


def check_batch(
    seg: Segment, meta: LogBookkeeping, pos: int, base: int, total: int, epoch: int, count: int
) -> None:
    expected = seg.next_offset
    if total < records.HEADER_SIZE or count < 1 or epoch < 0:
        raise corrupt(
            seg, pos, expected, f"invalid batch header (length {total}, count {count}, epoch {epoch})"
        )
    if base != expected:
        raise corrupt(seg, pos, expected, f"batch has base offset {base}, expected {expected}")
    if epoch < meta.last_epoch:
        raise corrupt(
            seg,
            pos,
            base,
            f"batch epoch {epoch} is below the previous batch's epoch {meta.last_epoch}",
        )


def scan_headers(seg: Segment, meta: LogBookkeeping, size: int) -> None:
    """A non-final segment: headers only, every byte accounted for, no torn tail allowed."""
    if size == 0:
        return
    with mmap.mmap(seg.fd, size, access=mmap.ACCESS_READ) as mm, memoryview(mm) as view:
        pos = 0
        while pos < size:
            if size - pos < records.HEADER_SIZE:
                raise corrupt(
                    seg, pos, seg.next_offset, f"{size - pos} trailing bytes in a non-final segment"
                )
            base, total, epoch, count = records.batch_header(view, pos)
            check_batch(seg, meta, pos, base, total, epoch, count)
            if pos + total > size:
                raise corrupt(seg, pos, base, "partial batch in a non-final segment")
            controls: tuple[ControlRecord, ...] = ()
            if mm[pos + _ATTR_POS] & records.ATTR_CONTROL:
                # control batches are small and rare: decode (and CRC-check) them for the summary
                try:
                    (b,), _ = records.decode_batches(mm[pos : pos + total])
                except records.CorruptRecordError as e:
                    raise corrupt(seg, pos, base, f"bad control batch: {e.message}") from None
                controls = b.info.controls
            seg.add(base, pos, total, count)
            meta.on_append(BatchInfo(base, epoch, count, total, controls))
            pos += total


def scan_last(seg: Segment, meta: LogBookkeeping, size: int) -> tuple[int, str] | None:
    """The final segment: every batch CRC-verified; returns a torn tail to cut, if any."""
    buf = pread_all(seg.fd, size, 0)
    try:
        batches, valid = records.decode_batches(buf, verify_crc=True, allow_torn_tail=True)
    except records.CorruptRecordError as e:
        # the codec's message already names the batch offset and position
        offset = _Q.unpack_from(buf, e.position)[0] if 0 <= e.position <= size - 8 else -1
        raise corrupt(seg, e.position, offset, e.message, located=True) from None
    for b in batches:
        i = b.info
        check_batch(seg, meta, b.position, i.base_offset, i.size_bytes, i.epoch, i.count)
        seg.add(i.base_offset, b.position, i.size_bytes, i.count)
        meta.on_append(i)
    if valid == size:
        return None
    why = _later_valid_batch(buf, valid, seg.next_offset)
    if why is not None:
        raise corrupt(seg, valid, seg.next_offset, f"damaged batch: {why}")
    if size - valid < records.HEADER_SIZE:
        what = f"{size - valid} bytes, too short for a batch header"
    else:
        _b, total, _e, _c = records.batch_header(buf, valid)
        if valid + total > size:
            what = f"partial batch ({size - valid} of {total} bytes)"
        else:
            what = "final batch fails its CRC or header check"
    return valid, what


def _valid_batch_at(buf: bytes, pos: int) -> bool:
    try:
        (b,), _ = records.decode_batches(buf[pos : pos + records.batch_header(buf, pos)[1]])
    except (records.CorruptRecordError, ValueError, struct.error):
        return False
    return b.info.count >= 1


_NONZERO = re.compile(rb"[^\x00]")
_MAX_PATTERNS = 1024


def _later_valid_batch(buf: bytes, tail: int, expected: int) -> str | None:
    """Is there a CRC-valid batch anywhere after the unreadable bytes at ``tail``? If so they are
    not a torn write (a crash tears only the write in flight, never bytes before an intact
    batch), the log is corrupt, and recovery must not cut it.

    Any such batch has a base offset in ``(expected, expected + (len(buf) - tail) // 4]``
    (every record takes at least 4 bytes), so the upper six bytes of its little-endian base
    offset take few values: ``bytes.find`` locates the candidates at C speed, runs of zero
    bytes (which cannot start a batch: its length field is non-zero) are skipped, and each
    plausible header is CRC-checked."""
    n = len(buf)
    if n - tail <= records.HEADER_SIZE:
        return None
    lo, hi = expected + 1, expected + 1 + (n - tail) // 4
    uppers = sorted({(v >> 16) for v in range(lo, hi + 1, 1 << 16)} | {hi >> 16})[:_MAX_PATTERNS]
    for upper in uppers:
        pattern = _Q.pack(upper << 16)[2:]
        zero = not any(pattern)
        start = tail + 3  # the pattern sits at p + 2 for a candidate p > tail
        while True:
            k = buf.find(pattern, start, n - records.HEADER_SIZE + 8)
            if k == -1:
                break
            p = k - 2
            base, blen, _crc, epoch, _a, count, _t = _HEADER.unpack_from(buf, p)
            if (
                lo <= base <= hi
                and count >= 1
                and epoch >= 0
                and records.HEADER_SIZE <= blen + 12 <= n - p
                and _valid_batch_at(buf, p)
            ):
                return f"unreadable bytes are followed by a valid batch at position {p} (offset {base})"
            start = k + 1
            if zero and not any(buf[p + 8 : p + 12]):
                m = _NONZERO.search(buf, p + 8)
                if m is None:
                    break
                start = max(start, m.start() - 9)
    return None

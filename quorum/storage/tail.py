"""Torn append or damage? The one decision recovery makes about the bytes after the last batch
of the final segment that verifies (docs/design.md, "Torn writes and damage").

Only bytes that were never acknowledged may be dropped silently, and nothing on disk says how
far the previous process had fsynced (recording it would cost a second fsync per write). So the
bytes ``[P, n)`` from the first position ``P`` where no valid batch starts to the file end ``n``
are cut only when an interrupted append explains them, and that explanation is strict (an
all-zero tail never reaches this rule: ``logscan`` takes it for a preallocated segment's end):

* an append writes forward from the old end; what a power cut leaves of it is a prefix of the
  new bytes, followed by bytes never written, which read back as zeros (a file extended but not
  yet written) or are simply missing (the file is shorter). Never-written bytes start at the
  old end or at a 512-byte sector boundary (a sector is written whole or not at all);
* so the tail is torn iff it is all zeros, or the first batch it starts needs more bytes than
  were written before the first possible never-written position: ``min(n, the first sector
  boundary at or after the last non-zero byte)`` lies before the batch's end (its header's
  length; a header that does not parse needs at least a header's bytes);
* and even then not if the batch at ``P`` is complete after all, its length field being what
  was damaged (its records, counted from the header, end inside the file where the CRC
  matches), nor if a valid batch follows somewhere after ``P`` (appends are written in order:
  bytes before an intact batch were written too).

Everything else (a complete batch whose CRC fails, a header of non-zero garbage, a length field
that lies) is damage: ``CORRUPT_LOG`` naming the file, position and offset, the node stops, and
the operator replaces the disk under a new storage UUID (KIP-856), which votes again only once
it caught up and was added back. What the rule cannot tell apart, and takes for a torn append:
damage that itself looks like never-written bytes (an acknowledged sector that reads back as
zeros), or a flip that turns exactly the bytes up to a sector boundary at the file end into
zeros.
"""

from __future__ import annotations

import re
import struct
import zlib

from quorum import records

__all__ = ["SECTOR", "later_valid_batch", "torn_tail"]

SECTOR = 512
_HEADER = struct.Struct("<qiIiBiq")  # the batch header layout of docs/design.md
_Q = struct.Struct("<q")
_U32 = struct.Struct("<I")
_PREFIX = 12  # base offset and length: the bytes before the length's count starts
_CRC_START = 16
_NONZERO = re.compile(rb"[^\x00]")
_MAX_PATTERNS = 1024


def torn_tail(buf: bytes, pos: int, expected: int) -> str | None:
    """Why ``buf[pos:]`` (``pos``: where the first unreadable batch starts, ``expected``: the
    offset it should have) is an interrupted append, or None if it is not one (damage)."""
    n = len(buf)
    last = _last_nonzero(buf, pos)
    if last < 0:
        return f"{n - pos} zero bytes (never written)"
    data_end = last + 1
    unwritten_from = min(n, -(-data_end // SECTOR) * SECTOR)
    header = _header_at(buf, pos, expected)
    if header is None:
        if unwritten_from >= pos + records.HEADER_SIZE:
            return None  # a header's worth of written bytes that are no header
        return f"{unwritten_from - pos} bytes, a header cut short"
    total, crc, count = header
    if unwritten_from >= pos + total:
        return None  # the whole batch was written: its CRC failure is damage
    if _complete_elsewhere(buf, pos, crc, count):
        return None  # intact records, damaged length field
    if later_valid_batch(buf, pos, expected) is not None:
        return None
    return f"partial batch ({unwritten_from - pos} of {total} bytes written)"


def _last_nonzero(buf: bytes, pos: int) -> int:
    """Position of the last non-zero byte at or after ``pos``; -1 if there is none."""
    stripped = len(buf[pos:].rstrip(b"\x00"))
    return pos + stripped - 1 if stripped else -1


def _header_at(buf: bytes, pos: int, expected: int) -> tuple[int, int, int] | None:
    """(total size, CRC, record count) of a header that could start the batch at ``pos``."""
    if len(buf) - pos < records.HEADER_SIZE:
        return None
    base, blen, crc, epoch, attrs, count, _t = _HEADER.unpack_from(buf, pos)
    total = _PREFIX + blen
    if (
        base != expected
        or blen < records.HEADER_SIZE - _PREFIX
        or total > records.MAX_BATCH_BYTES
        or count < 1
        or epoch < 0
        or attrs & ~records.ATTR_CONTROL
    ):
        return None
    return total, crc, count


def _complete_elsewhere(buf: bytes, pos: int, crc: int, count: int) -> bool:
    """Do the ``count`` records after the header end inside ``buf`` where the CRC matches? Then
    the batch was written whole and only its length field is wrong."""
    n = len(buf)
    at = pos + records.HEADER_SIZE
    for _ in range(count):
        if at + 4 > n:
            return False
        (length,) = _U32.unpack_from(buf, at)
        at += 4 + length
        if at > n:
            return False
    return zlib.crc32(memoryview(buf)[pos + _CRC_START : at]) == crc


def _valid_batch_at(buf: bytes, pos: int) -> bool:
    try:
        (b,), _ = records.decode_batches(buf[pos : pos + records.batch_header(buf, pos)[1]])
    except (records.CorruptRecordError, ValueError, struct.error):
        return False
    return b.info.count >= 1


def later_valid_batch(buf: bytes, tail: int, expected: int) -> str | None:
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

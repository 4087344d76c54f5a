"""Recovery scan of the segmented log on open (the rules are in ``quorum.storage.log``'s
docstring): non-final segments are walked header by header, the last one CRC-verified batch by
batch; damage that is not a torn tail of the last segment raises ``CORRUPT_LOG`` naming the file,
position and offset. These functions only read; the log cuts a torn tail after every segment
was checked.
"""

from __future__ import annotations

import mmap

from quorum import records
from quorum.storage.base import LogBookkeeping
from quorum.storage.segment import Segment, pread_all
from quorum.storage.tail import later_valid_batch, torn_tail
from quorum.types import BatchInfo, ControlRecord, ErrorCode, KraftError

__all__ = ["check_batch", "corrupt", "scan_headers", "scan_last"]

_ATTR_POS = 20  # attributes byte in the batch header (docs/design.md)


def corrupt(seg: Segment, position: int, offset: int, what: str, located: bool = False) -> KraftError:
    where = "" if located else f" at position {position} (offset {offset})"
    return KraftError(
        ErrorCode.CORRUPT_LOG,
        f"{seg.path}: {what}{where}; refusing to open the log so that no committed data is dropped "
        "(treat the disk as lost: replace it under a new storage UUID, KIP-856)",
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
    """The final segment: every batch CRC-verified; returns a torn tail to cut, if any. What
    counts as torn (never acknowledged) rather than damage is ``quorum.storage.tail``'s rule."""
    buf = pread_all(seg.fd, size, 0)
    try:
        batches, valid = records.decode_batches(buf, verify_crc=True, allow_torn_tail=True)
    except records.CorruptRecordError as e:
        # A bad batch with bytes after it: the tail rule decides (zeros after a batch whose
        # last sectors were never written can look like this), on the batches before it.
        valid = e.position if 0 <= e.position < size else 0
        batches, _ = records.decode_batches(buf[:valid], verify_crc=True)
    for b in batches:
        i = b.info
        check_batch(seg, meta, b.position, i.base_offset, i.size_bytes, i.epoch, i.count)
        seg.add(i.base_offset, b.position, i.size_bytes, i.count)
        meta.on_append(i)
    if valid == size:
        return None
    why = torn_tail(buf, valid, seg.next_offset)
    if why is None:
        raise corrupt(seg, valid, seg.next_offset, _damage(buf, valid, seg.next_offset))
    return valid, why


def _damage(buf: bytes, pos: int, expected: int) -> str:
    """What the damage at ``pos`` is, for the CORRUPT_LOG message."""
    what = "damaged batch, not a torn write"
    try:
        records.decode_batches(buf, verify_crc=True)
    except records.CorruptRecordError as e:
        what += f": {e.message}"
    later = later_valid_batch(buf, pos, expected)
    return what if later is None else f"{what}; {later}"

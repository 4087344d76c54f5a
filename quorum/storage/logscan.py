"""Recovery of the segmented log (:mod:`quorum.storage.log`) on open. Why it is shaped like this:
a crash may tear only the write in flight, and only the last segment receives writes.

* non-final segments are walked header by header (no CRC, Kafka does the same for segments
  below the recovery point); the last segment is CRC-verified batch by batch;
* zeros after the last valid batch of the LAST segment are its end: the zero tail a
  preallocated segment carries (``quorum.storage.segment``), or bytes an extended file never
  received; nothing is cut and nothing is logged (they never parse as a batch, and the next
  append overwrites them);
* a torn tail of the LAST segment -- what a power cut leaves of an append never acknowledged:
  a partial final batch, or bytes never written (zeros), by the rule of
  ``quorum.storage.tail`` -- is cut at the last valid batch, with a WARNING;
* anything else -- a batch the file holds whole that fails its CRC (the last one included), a
  bad batch followed by valid data, a bad or partial batch in a non-final segment, a gap or
  overlap of offsets between batches or segments (a missing segment), decreasing epochs --
  raises ``KraftError(CORRUPT_LOG)`` naming the file, position and offset, and nothing is
  modified: data the node may have acknowledged is never dropped silently.

:func:`open_segments` opens a directory's segments with these checks and cuts a torn tail only
after every segment was checked; the scan functions only read.
"""

from __future__ import annotations

import logging
import mmap
import os
import re

from quorum import records
from quorum.storage.atomic import fsync_dir
from quorum.storage.base import LogBookkeeping
from quorum.storage.segment import Segment, pread_all
from quorum.storage.tail import later_valid_batch, torn_tail
from quorum.types import BatchInfo, ControlRecord, ErrorCode, KraftError

__all__ = [
    "check_batch",
    "corrupt",
    "open_segments",
    "scan_headers",
    "scan_last",
    "segment_files",
    "sync_opened",
]

log = logging.getLogger("quorum.storage.log")

_ATTR_POS = 20  # attributes byte in the batch header (docs/design.md)
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")


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
    if valid == size or buf.count(0, valid) == size - valid:
        return None  # whole, or a zero tail (preallocated): the data ends at ``valid``
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


def segment_files(directory: str) -> list[tuple[int, str]]:
    """(base offset, file name) of every segment file in ``directory``, lowest base first."""
    found = [(int(m.group(1)), name) for name in os.listdir(directory) if (m := _SEGMENT_RE.match(name))]
    return sorted(found)


def open_segments(
    directory: str,
    found: list[tuple[int, str]],
    meta: LogBookkeeping,
    opened: list[Segment],
    unflushed_in_memory: bool,
    fsync: bool,
    preallocate_to: int = 0,
) -> None:
    """Open and check every segment of ``found`` (non-empty), appending each to ``opened`` as it
    is opened (so the caller closes them on an error), then cut a torn tail of the last one.
    Everything is validated first: the only modification happens after all segments were
    checked, so a CORRUPT_LOG leaves every file untouched."""
    tail_cut: tuple[Segment, int, str] | None = None
    prev: Segment | None = None
    for i, (base, name) in enumerate(found):
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDWR)
        seg = Segment(directory, base, fd, unflushed_in_memory, preallocate_to)
        opened.append(seg)
        if prev is not None and base != prev.next_offset:
            kind = "gap (a segment is missing)" if base > prev.next_offset else "overlap"
            raise KraftError(
                ErrorCode.CORRUPT_LOG,
                f"{path}: segment starts at offset {base} but {prev.name} ends at offset "
                f"{prev.next_offset}: {kind}",
                file=path,
                offset=base,
            )
        size = os.fstat(fd).st_size
        if i + 1 < len(found):
            scan_headers(seg, meta, size)
            seg.opened(size)
        else:
            cut = scan_last(seg, meta, size)
            seg.opened(size if cut is None else cut[0])
            tail_cut = None if cut is None else (seg, *cut)
        prev = seg
    if tail_cut is not None:
        seg, valid, why = tail_cut
        log.warning(
            "%s: torn tail after offset %d (position %d): %s; truncating the segment from %d to %d bytes",
            seg.path,
            seg.next_offset,
            valid,
            why,
            os.fstat(seg.fd).st_size,
            valid,
        )
        os.ftruncate(seg.fd, valid)
        if fsync:
            os.fsync(seg.fd)


def sync_opened(directory: str, segments: list[Segment]) -> None:
    """Make what the previous process wrote durable before anything counts it. A process
    crash (SIGKILL, OOM kill) keeps its unsynced writes in the page cache: this process
    reads them back as the log, and without this fsync its first Fetch would claim them and
    the leader count them, while a power cut before writeback still takes them. Only the
    last segment can hold unsynced bytes (``_seal`` makes a segment durable before the next
    one exists); the directory fsync makes the entries of a roll, truncation or deletion
    the crash interrupted durable too. Costs the writeback of those bytes only: nothing
    when the previous process stopped cleanly (bench/recovery.py --restart measures it)."""
    last = segments[-1]
    if last.fd >= 0:
        os.fsync(last.fd)
    fsync_dir(directory)

"""A fetched snapshot checked and parsed as its chunks arrive (KIP-630 FetchSnapshot).

The follower writes each chunk in the driver's persist step, off the event loop. Feeding the
same bytes to :class:`DownloadParse` there checks every batch's CRC exactly once and collects
what installing the snapshot needs (the header's voter-set controls, the state chunks), with
the same framing rules as :func:`quorum.storage.snapshot.parse_snapshot`: offsets counting
from 0, every batch in the snapshot's epoch, a ``SnapshotHeader`` control batch first, a
``SnapshotFooter`` control batch last and nothing after it. Installing a large snapshot then
reads nothing back and parses nothing a second time (a 1 GB snapshot used to be
read, CRC-checked and parsed in one pass on the event loop at the end of the download).

Chunks cut batches anywhere ("unaligned records"): the partial batch at a chunk's end is
carried over to the next. Any doubt (a bad header, a CRC mismatch, a framing error) only
clears ``ok`` and drops what was collected: the install then verifies the whole file with
``parse_snapshot``, which names the defect and the position, exactly as before.
"""

from __future__ import annotations

import struct

from quorum import records
from quorum.types import ControlRecord, OffsetAndEpoch, SnapshotFooter, SnapshotHeader

__all__ = ["DownloadParse"]

_LEN = struct.Struct("<I")  # a record's length prefix (quorum.records)


def _record_views(batch: memoryview, count: int) -> list[memoryview]:
    """The records of one data batch that ``decode_batches`` already checked, as views of the
    received bytes: a large snapshot's state is not copied once more before it is decoded."""
    out = []
    pos = records.HEADER_SIZE
    for _ in range(count):
        (n,) = _LEN.unpack_from(batch, pos)
        out.append(batch[pos + 4 : pos + 4 + n])
        pos += 4 + n
    if pos != len(batch):
        raise records.CorruptRecordError("records do not fill their batch")
    return out


class DownloadParse:
    """Incremental check and parse of one snapshot download (see the module docstring)."""

    def __init__(self, snapshot_id: OffsetAndEpoch) -> None:
        self.snapshot_id = snapshot_id
        self.carry = b""
        self.ok = True
        self.next_offset = 0  # offsets inside a snapshot file count from 0
        self.controls: tuple[ControlRecord, ...] | None = None  # from the header batch
        # the state chunks, as written by the leader: views of the received bytes, not copies
        self.chunks: list[memoryview] = []
        self.footer = False
        self.batches = 0

    def _fail(self) -> None:
        self.ok = False
        self.carry = b""
        self.chunks = []

    def feed(self, data: bytes | memoryview) -> None:
        """Check and parse every batch completed by ``data`` (the next chunk of the file).
        Only the batch a chunk boundary cut is copied (to join its two parts); the rest is
        read in place."""
        if not self.ok:
            return
        view = memoryview(data)
        if self.carry:
            head = self.carry
            if len(head) < records.HEADER_SIZE:
                take = records.HEADER_SIZE - len(head)
                head, view = head + bytes(view[:take]), view[take:]
                if len(head) < records.HEADER_SIZE:
                    self.carry = head
                    return
            size = records.batch_header(head, 0)[1]
            if size < records.HEADER_SIZE or size > records.MAX_BATCH_BYTES:
                self._fail()
                return
            take = size - len(head)
            if take > len(view):
                self.carry = head + bytes(view)
                return
            joined, view = head + bytes(view[:take]), view[take:]
            self.carry = b""
            if not self._check(memoryview(joined)):
                return
        pos, n = 0, len(view)
        while n - pos >= records.HEADER_SIZE:
            size = records.batch_header(view, pos)[1]
            if size < records.HEADER_SIZE or size > records.MAX_BATCH_BYTES:
                self._fail()
                return
            if pos + size > n:
                break
            if not self._check(view[pos : pos + size]):
                return
            pos += size
        self.carry = bytes(view[pos:])

    def _check(self, batch: memoryview) -> bool:
        """Verify one whole batch (the one CRC check) and take it; False (and ``ok`` cleared)
        if anything is wrong."""
        try:
            batches, _ = records.decode_batches(batch)
            taken = self._take(batches[0])
        except records.CorruptRecordError:
            taken = False
        if not taken:
            self._fail()
        return taken

    def _take(self, b: records.DecodedBatch) -> bool:
        info = b.info
        if self.footer or info.base_offset != self.next_offset or info.epoch != self.snapshot_id.epoch:
            return False  # a batch after the footer, a gap, or another epoch
        self.next_offset = info.next_offset
        self.batches += 1
        if self.controls is None:
            ctl = info.controls
            if not ctl or not isinstance(ctl[0], SnapshotHeader):
                return False
            if any(isinstance(c, SnapshotHeader | SnapshotFooter) for c in ctl[1:]):
                return False
            self.controls = ctl[1:]
            return True
        if info.controls:
            if info.controls != (SnapshotFooter(),):
                return False
            self.footer = True
            return True
        self.chunks.extend(_record_views(b.data, info.count))
        return True

    def complete(self) -> bool:
        """Every byte fed belongs to a whole batch whose CRC matched, the framing held, and the
        footer came last: ``result()`` is the snapshot's content."""
        return self.ok and not self.carry and self.footer and self.controls is not None

    def result(self) -> tuple[tuple[ControlRecord, ...], list[memoryview]]:
        """(voter-set controls, state chunks); only after ``complete()`` returned True."""
        if not self.complete() or self.controls is None:
            raise ValueError("snapshot download is not completely parsed")
        return self.controls, self.chunks

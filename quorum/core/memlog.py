"""An in-memory log and snapshot store implementing :class:`~quorum.core.ready.LogReader`,
separating durable from unflushed data so that a simulated crash loses exactly what was not
fsynced. Used by the simulation and unit tests; the real segmented log lives in
``quorum.storage``.

Invariant: ``batches`` are contiguous by offset; the first ``durable`` of them survive a crash.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from quorum.core.ready import AppendBatch, LeaderBatch
from quorum.records import decode_batches
from quorum.types import BatchInfo, ControlRecord, ErrorCode, KraftError, LogSummary, OffsetAndEpoch


@dataclass
class StoredSnapshot:
    snapshot_id: OffsetAndEpoch
    data: bytes
    controls: tuple[ControlRecord, ...]


class MemoryLog:
    def __init__(self) -> None:
        self.infos: list[BatchInfo] = []
        self.datas: list[bytes] = []
        self.bases: list[int] = []
        self.durable = 0  # number of durable batches
        self.log_start = 0
        self.snapshot: StoredSnapshot | None = None
        self.pending_snapshot = bytearray()

    # ------------------------------------------------------------------ writes

    @property
    def end_offset(self) -> int:
        if self.infos:
            return self.infos[-1].next_offset
        return self.snapshot.snapshot_id.offset if self.snapshot is not None else self.log_start

    @property
    def durable_end(self) -> int:
        if self.durable:
            return self.infos[self.durable - 1].next_offset
        return self.snapshot.snapshot_id.offset if self.snapshot is not None else self.log_start

    def append(self, batch: AppendBatch) -> None:
        if isinstance(batch, LeaderBatch):
            data = batch.encode()
            items = [(batch.info(len(data)), data)]
        else:
            items = []
            pos = 0
            for info in batch.infos:
                items.append((info, batch.data[pos : pos + info.size_bytes]))
                pos += info.size_bytes
        for info, data in items:
            if info.base_offset != self.end_offset:
                raise KraftError(
                    ErrorCode.CORRUPT_LOG,
                    f"append at {info.base_offset} but the log ends at {self.end_offset}",
                )
            self.infos.append(info)
            self.datas.append(data)
            self.bases.append(info.base_offset)

    def truncate(self, end_offset: int) -> None:
        i = bisect.bisect_left(self.bases, end_offset)
        if i < len(self.infos) and self.infos[i].base_offset != end_offset:
            raise KraftError(ErrorCode.CORRUPT_LOG, f"truncation to {end_offset} is not at a batch boundary")
        if i > 0 and self.infos[i - 1].next_offset > end_offset:
            raise KraftError(ErrorCode.CORRUPT_LOG, f"truncation to {end_offset} splits a batch")
        del self.infos[i:], self.datas[i:], self.bases[i:]
        self.durable = min(self.durable, i)

    def flush(self) -> None:
        self.durable = len(self.infos)

    def crash(self) -> None:
        """Lose everything not flushed."""
        del self.infos[self.durable :], self.datas[self.durable :], self.bases[self.durable :]
        self.pending_snapshot = bytearray()

    def install_snapshot(
        self, snapshot_id: OffsetAndEpoch, data: bytes, controls: tuple[ControlRecord, ...]
    ) -> None:
        self.snapshot = StoredSnapshot(snapshot_id, data, controls)
        self.infos, self.datas, self.bases = [], [], []
        self.durable = 0
        self.log_start = snapshot_id.offset

    def take_snapshot(
        self, snapshot_id: OffsetAndEpoch, data: bytes, controls: tuple[ControlRecord, ...]
    ) -> int:
        """Store a local snapshot and drop the durable batches wholly below it; returns the
        new log start offset."""
        self.snapshot = StoredSnapshot(snapshot_id, data, controls)
        i = 0
        while i < self.durable and self.infos[i].next_offset <= snapshot_id.offset:
            i += 1
        if i:
            self.log_start = self.infos[i - 1].next_offset
            del self.infos[:i], self.datas[:i], self.bases[:i]
            self.durable -= i
        return self.log_start

    # ------------------------------------------------------------------ LogReader

    def read(self, offset: int, max_bytes: int) -> bytes:
        # Everything written, flushed or not, like the real log (the leader serves unflushed
        # batches to followers; a crash can still take them back from the leader).
        n = len(self.infos)
        i = bisect.bisect_left(self.bases, offset, 0, n)
        if i >= n:
            return b""
        if self.bases[i] != offset:
            raise KraftError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} is not a batch boundary")
        out = [self.datas[i]]
        size = len(self.datas[i])
        i += 1
        while i < n and size + len(self.datas[i]) <= max_bytes:
            out.append(self.datas[i])
            size += len(self.datas[i])
            i += 1
        return b"".join(out)

    def read_snapshot(self, snapshot: OffsetAndEpoch, position: int, max_bytes: int) -> tuple[bytes, int]:
        if self.snapshot is None or self.snapshot.snapshot_id != snapshot:
            raise KraftError(ErrorCode.SNAPSHOT_NOT_FOUND, f"no snapshot {snapshot}")
        data = self.snapshot.data
        if position > len(data):
            raise KraftError(ErrorCode.POSITION_OUT_OF_RANGE, f"position {position} > size {len(data)}")
        return data[position : position + max_bytes], len(data)

    # ------------------------------------------------------------------ startup

    def summary(self) -> LogSummary:
        epochs: list[tuple[int, int]] = []
        for info in self.infos:
            if not epochs or epochs[-1][0] != info.epoch:
                epochs.append((info.epoch, info.base_offset))
        last_epoch = epochs[-1][0] if epochs else (self.snapshot.snapshot_id.epoch if self.snapshot else 0)
        return LogSummary(
            log_start_offset=self.log_start,
            end_offset=self.end_offset,
            last_epoch=last_epoch,
            snapshot=self.snapshot.snapshot_id if self.snapshot else None,
            snapshot_controls=self.snapshot.controls if self.snapshot else (),
            control_batches=[i for i in self.infos if i.controls],
            epoch_starts=epochs,
        )

    def records_between(self, start: int, end: int) -> list[tuple[int, int, bytes | ControlRecord, int]]:
        """(offset, epoch, record, batch base offset) of every record in [start, end) (for
        tests and the sim's state
        machine); data records as bytes, control records decoded."""
        from quorum.records import data_records

        out: list[tuple[int, int, bytes | ControlRecord, int]] = []
        i = max(0, bisect.bisect_right(self.bases, start) - 1)
        while i < len(self.infos) and self.infos[i].base_offset < end:
            info = self.infos[i]
            recs: list[bytes | ControlRecord] = (
                list(info.controls)
                if info.controls
                else list(data_records(decode_batches(self.datas[i])[0][0]))
            )
            for j, r in enumerate(recs):
                off = info.base_offset + j
                if start <= off < end:
                    out.append((off, info.epoch, r, info.base_offset))
            i += 1
        return out

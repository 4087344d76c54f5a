"""Small metadata about the local log: start/end offsets and the epoch cache.

The core never holds record data (docs/design.md): it keeps the log end offset (including
batches handed to the driver but maybe not yet durable), the written end reported by
``appended`` (in the log file, maybe not yet fsynced), the durable end reported by
``advance`` (a follower's Fetch offset never exceeds it), the log start offset, the latest
snapshot id and the leader-epoch cache (epoch -> first offset), which is what KIP-595's
DivergingEpoch computation needs.

Invariants: ``epochs`` is ascending in both epoch and start offset; every start offset is in
``[log_start, end)``; ``durable_end <= written_end <= end``.
"""

from __future__ import annotations

from quorum.types import ErrorCode, KraftError, LogSummary, OffsetAndEpoch


class LogMeta:
    def __init__(self, summary: LogSummary) -> None:
        self.log_start = summary.log_start_offset
        self.end = summary.end_offset
        self.durable_end = summary.end_offset  # what the storage layer recovered is durable
        self.written_end = summary.end_offset
        self.snapshot: OffsetAndEpoch | None = summary.snapshot
        # (The log may keep records before the snapshot's offset; they stay readable.)
        self.epochs: list[tuple[int, int]] = sorted(summary.epoch_starts, key=lambda e: e[1])

    def last_epoch(self) -> int:
        if self.epochs:
            return self.epochs[-1][0]
        return self.snapshot.epoch if self.snapshot is not None else 0

    def append(self, base_offset: int, epoch: int, count: int) -> None:
        if base_offset != self.end:
            raise KraftError(
                ErrorCode.CORRUPT_LOG, f"append at offset {base_offset} but the log ends at {self.end}"
            )
        last = self.last_epoch()
        if epoch < last:
            raise KraftError(ErrorCode.CORRUPT_LOG, f"append of epoch {epoch} after epoch {last}")
        if not self.epochs or self.epochs[-1][0] != epoch:
            self.epochs.append((epoch, base_offset))
        self.end = base_offset + count

    def truncate(self, end_offset: int) -> None:
        if end_offset >= self.end:
            return
        self.end = end_offset
        self.durable_end = min(self.durable_end, end_offset)
        self.written_end = min(self.written_end, end_offset)
        while self.epochs and self.epochs[-1][1] >= end_offset:
            self.epochs.pop()

    def reset_to_snapshot(self, snapshot: OffsetAndEpoch) -> None:
        self.snapshot = snapshot
        self.log_start = snapshot.offset
        self.end = snapshot.offset
        self.durable_end = snapshot.offset
        self.written_end = snapshot.offset
        self.epochs = []

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch | None:
        """KIP-595: the largest epoch <= ``epoch`` this log knows and the offset where it ends
        (the start of the next epoch, or the log end). None if ``epoch`` is older than anything
        this log (and its snapshot) knows: the follower must fetch the snapshot."""
        for i in range(len(self.epochs) - 1, -1, -1):
            e, _start = self.epochs[i]
            if e <= epoch:
                end = self.epochs[i + 1][1] if i + 1 < len(self.epochs) else self.end
                return OffsetAndEpoch(end, e)
        if self.snapshot is not None:
            if self.snapshot.epoch <= epoch:
                return OffsetAndEpoch(self.snapshot.offset, self.snapshot.epoch)
            return None
        if self.log_start == 0:
            return OffsetAndEpoch(0, 0)
        return None

    def epoch_start(self, epoch: int) -> int | None:
        for e, start in self.epochs:
            if e == epoch:
                return start
        return None

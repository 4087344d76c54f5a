"""Storage interfaces (Protocols) and the bookkeeping the file and memory logs share.

The node runtime, the simulation and the tests program against :class:`LogStorage`,
:class:`SnapshotStorage` and :class:`QuorumStateStorage`; ``quorum.storage.log`` /
``snapshot`` / ``quorum_state`` implement them on disk and ``quorum.storage.memory`` in memory.
Both log implementations use :class:`LogBookkeeping` and :func:`validate_append` below, so the
checks and the :class:`~quorum.types.LogSummary` they produce cannot drift apart.

Log invariants (KIP-595): offsets are contiguous from ``log_start_offset`` to ``end_offset``;
batch epochs never decrease along the log; a batch is written, read, truncated and deleted
whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from quorum import records
from quorum.types import (
    BatchInfo,
    ControlRecord,
    ErrorCode,
    KraftError,
    LogSummary,
    OffsetAndEpoch,
    QuorumState,
)

__all__ = [
    "LogBookkeeping",
    "LogStorage",
    "QuorumStateStorage",
    "SnapshotStorage",
    "append_items",
    "encode_items",
    "validate_append",
]


@runtime_checkable
class LogStorage(Protocol):
    """The replicated log of one node (KIP-595), batches stored byte for byte."""

    @property
    def log_start_offset(self) -> int: ...
    @property
    def end_offset(self) -> int: ...
    @property
    def flushed_end_offset(self) -> int: ...
    @property
    def last_epoch(self) -> int: ...

    def append_batches(self, data: bytes | memoryview, infos: Sequence[BatchInfo]) -> None:
        """Follower path: append pre-encoded batches (already CRC-checked by the caller)."""

    def append(
        self,
        base_offset: int,
        epoch: int,
        items: Sequence[bytes] | Sequence[ControlRecord],
        append_time_ms: int | None = None,
    ) -> BatchInfo:
        """Leader path: encode one batch of data records or of control records and append it."""
        ...

    def flush(self) -> None:
        """Make everything appended durable (one fsync for many appends)."""

    def truncate_to(self, end_offset: int) -> None:
        """Drop every batch at or after ``end_offset`` (a batch boundary); durable on return."""

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from the batch holding ``offset``; at least one batch, b"" at the end."""
        ...

    def delete_before(self, offset: int) -> None:
        """Drop whole segments that end at or below ``offset`` (covered by a snapshot)."""

    def reset_to_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        """Replace the whole log with an empty one starting at the snapshot's end offset."""

    def summary(
        self, snapshot: OffsetAndEpoch | None = None, snapshot_controls: Sequence[ControlRecord] = ()
    ) -> LogSummary:
        """What the core needs at start (KIP-595 epoch cache, KIP-856 voter records)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class SnapshotStorage(Protocol):
    """KIP-630 snapshots: one file (or blob) per snapshot id, fetched in raw chunks."""

    def write(
        self,
        snapshot_id: OffsetAndEpoch,
        controls: Sequence[ControlRecord],
        state_chunks: Iterable[bytes],
        last_contained_log_timestamp: int = 0,
    ) -> str: ...
    def latest(self) -> OffsetAndEpoch | None: ...
    def snapshot_ids(self) -> list[OffsetAndEpoch]: ...
    def read_chunk(self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int) -> tuple[bytes, int]: ...
    def size(self, snapshot_id: OffsetAndEpoch) -> int: ...
    def begin_download(self, snapshot_id: OffsetAndEpoch) -> None: ...
    def write_chunk(self, snapshot_id: OffsetAndEpoch, position: int, data: bytes | memoryview) -> None: ...
    def finish_download(self, snapshot_id: OffsetAndEpoch) -> str: ...
    def abort_download(self, snapshot_id: OffsetAndEpoch) -> None: ...
    def controls(self, snapshot_id: OffsetAndEpoch) -> tuple[ControlRecord, ...]: ...
    def load(
        self, snapshot_id: OffsetAndEpoch, *, verify_crc: bool = True
    ) -> tuple[tuple[ControlRecord, ...], Sequence[bytes | memoryview]]: ...
    def delete_older_than(self, snapshot_id: OffsetAndEpoch) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class QuorumStateStorage(Protocol):
    """KIP-856 QuorumStateData, replaced atomically."""

    def load(self, cluster_id: str | None = None) -> QuorumState: ...
    def save(self, state: QuorumState) -> None: ...


def append_items(
    log: LogStorage,
    base_offset: int,
    epoch: int,
    items: Sequence[bytes] | Sequence[ControlRecord],
    append_time_ms: int | None,
) -> BatchInfo:
    """The leader path of every ``LogStorage.append``: check the offset, encode one batch of
    data records or of control records, and append it through ``append_batches``."""
    if base_offset != log.end_offset:
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"append at offset {base_offset} but the log ends at {log.end_offset}"
        )
    data = encode_items(base_offset, epoch, items, append_time_ms)
    controls = tuple(i for i in items if not isinstance(i, bytes | bytearray | memoryview))
    info = BatchInfo(base_offset, epoch, len(items), len(data), controls)
    log.append_batches(data, [info])
    return info


def encode_items(
    base_offset: int, epoch: int, items: Sequence[bytes] | Sequence[ControlRecord], append_time_ms: int | None
) -> bytes:
    """Encode the leader's batch: all ``bytes`` -> data batch, all control records -> control
    batch; anything else (empty, mixed) is INVALID_REQUEST."""
    if not items:
        raise KraftError(ErrorCode.INVALID_REQUEST, "a batch needs at least one record")
    if all(isinstance(i, bytes | bytearray | memoryview) for i in items):
        data = [bytes(i) for i in items if isinstance(i, bytes | bytearray | memoryview)]
        out = records.encode_batch(base_offset, epoch, data, append_time_ms)
    elif not any(isinstance(i, bytes | bytearray | memoryview) for i in items):
        controls = [i for i in items if not isinstance(i, bytes | bytearray | memoryview)]
        out = records.encode_control_batch(base_offset, epoch, controls, append_time_ms)
    else:
        raise KraftError(ErrorCode.INVALID_REQUEST, "a batch holds data records or control records, not both")
    if len(out) > records.MAX_BATCH_BYTES:
        raise KraftError(
            ErrorCode.PAYLOAD_TOO_LARGE, f"batch of {len(out)} bytes exceeds {records.MAX_BATCH_BYTES} bytes"
        )
    return out


def validate_append(
    end_offset: int, last_epoch: int, data: bytes | memoryview, infos: Sequence[BatchInfo]
) -> list[int]:
    """Check that ``data`` holds exactly the batches ``infos`` describe, starting at the log end,
    contiguous, with non-decreasing epochs not below the log's last epoch. Returns each batch's
    byte size. Raises INVALID_REQUEST (nothing is written) on any mismatch."""
    if not infos:
        if len(data):
            raise KraftError(ErrorCode.INVALID_REQUEST, f"{len(data)} bytes given with no batch infos")
        return []
    sizes: list[int] = []
    expected = end_offset
    epoch = last_epoch
    pos = 0
    view = memoryview(data)
    for info in infos:
        if info.base_offset != expected:
            what = "log end offset" if expected == end_offset else "end of the previous batch"
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"batch base offset {info.base_offset} does not follow the {what} {expected}",
            )
        if info.count < 1:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"batch at offset {info.base_offset} has no records")
        if info.epoch < epoch:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"batch at offset {info.base_offset} has epoch {info.epoch} below the log's epoch {epoch}",
            )
        if len(view) - pos < records.HEADER_SIZE:
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"data ends before the batch at offset {info.base_offset}"
            )
        base, total, hepoch, count = records.batch_header(view, pos)
        if (base, hepoch, count) != (info.base_offset, info.epoch, info.count) or (
            info.size_bytes and info.size_bytes != total
        ):
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"batch at position {pos} (offset {base}, epoch {hepoch}, {count} records, {total} bytes) "
                f"do not match its info {info}",
            )
        if total < records.HEADER_SIZE or pos + total > len(view):
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"batch at offset {base} runs past the end of the data"
            )
        sizes.append(total)
        pos += total
        expected = info.next_offset
        epoch = info.epoch
    if pos != len(view):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{len(view) - pos} bytes after the last batch")
    return sizes


class LogBookkeeping:
    """Epoch starts and control batches of the retained log, maintained on every append,
    truncation and reset, so that :meth:`summary` never reads data records."""

    def __init__(self) -> None:
        self.epoch_starts: list[tuple[int, int]] = []  # (epoch, first offset), ascending
        self.control_batches: list[BatchInfo] = []
        self.base_epoch = 0  # epoch of the snapshot the log starts after (reset_to_snapshot)

    @property
    def last_epoch(self) -> int:
        return self.epoch_starts[-1][0] if self.epoch_starts else self.base_epoch

    def on_append(self, info: BatchInfo) -> None:
        if not self.epoch_starts or self.epoch_starts[-1][0] != info.epoch:
            self.epoch_starts.append((info.epoch, info.base_offset))
        if info.controls:
            self.control_batches.append(info)

    def on_truncate(self, end_offset: int) -> None:
        while self.epoch_starts and self.epoch_starts[-1][1] >= end_offset:
            self.epoch_starts.pop()
        while self.control_batches and self.control_batches[-1].base_offset >= end_offset:
            self.control_batches.pop()

    def on_delete_before(self, log_start: int) -> None:
        # keep the epoch entry in effect at log_start: the epoch cache needs it (KIP-595)
        while len(self.epoch_starts) > 1 and self.epoch_starts[1][1] <= log_start:
            self.epoch_starts.pop(0)
        self.control_batches = [b for b in self.control_batches if b.base_offset >= log_start]

    def on_reset(self, snapshot_id: OffsetAndEpoch) -> None:
        self.epoch_starts = []
        self.control_batches = []
        self.base_epoch = snapshot_id.epoch

    def summary(
        self,
        log_start: int,
        end_offset: int,
        snapshot: OffsetAndEpoch | None,
        snapshot_controls: Sequence[ControlRecord],
    ) -> LogSummary:
        """``control_batches`` and ``epoch_starts`` cover the log after the snapshot: an epoch
        that began before the snapshot and continues after it starts at the snapshot offset."""
        cut = snapshot.offset if snapshot is not None else log_start
        starts: list[tuple[int, int]] = []
        for i, (epoch, start) in enumerate(self.epoch_starts):
            nxt = self.epoch_starts[i + 1][1] if i + 1 < len(self.epoch_starts) else end_offset
            if nxt > cut and start < end_offset:
                starts.append((epoch, max(start, cut)))
        if self.epoch_starts and end_offset > cut:
            last_epoch = self.epoch_starts[-1][0]
        elif snapshot is not None:
            last_epoch = snapshot.epoch
        else:
            last_epoch = self.last_epoch
        return LogSummary(
            log_start_offset=log_start,
            end_offset=end_offset,
            last_epoch=last_epoch,
            snapshot=snapshot,
            snapshot_controls=tuple(snapshot_controls),
            control_batches=[b for b in self.control_batches if b.base_offset >= cut],
            epoch_starts=starts,
        )

"""In-memory twins of the storage classes, for the simulation and fast tests: the ONE in-memory
log of the project (the driver's ``LogPort`` in ``tests/sim`` and ``tests/core``).

Same interfaces and the same semantics as the file implementations (the behavioural test
suite in ``tests/storage`` runs against both), plus two kinds of stop:

* ``crash()``, a power loss: whatever was not synced is gone (appended but not flushed, a
  quorum-state save a process crash interrupted before its directory fsync), as are snapshot
  downloads in progress;
* a process crash (the simulation just drops the node's process): nothing is lost, the page
  cache keeps every write, synced or not. ``reopen()`` then starts the next process, which
  syncs what it finds (``open_storage``'s rule) unless ``sync_on_open`` is off, which models
  the hole that rule closes: the new process takes unsynced bytes for durable ones.

State saves and truncations are otherwise durable at once, like their on-disk counterparts.

The only intended difference: the memory log has no segments, so ``delete_before`` drops
every batch that ends at or below the offset (the file log keeps the segment that holds it;
both keep every batch at or after the offset).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from quorum.storage.base import LogBookkeeping, append_items, validate_append
from quorum.storage.quorum_state import decode_quorum_state, encode_quorum_state
from quorum.storage.snapshot import (
    check_snapshot_id,
    encode_snapshot,
    header_controls,
    parse_snapshot,
    snapshot_file_name,
)
from quorum.types import (
    BatchInfo,
    ControlRecord,
    ErrorCode,
    KraftError,
    LogSummary,
    OffsetAndEpoch,
    QuorumState,
)

__all__ = ["MemoryLog", "MemoryQuorumStateStore", "MemorySnapshotStore"]


class MemoryLog:
    """:class:`~quorum.storage.base.LogStorage` held in lists of batch bytes."""

    def __init__(self) -> None:
        self._start = 0
        self._offsets: list[int] = []  # base offset of each batch
        self._batches: list[bytes] = []
        self._counts: list[int] = []
        self._meta = LogBookkeeping()
        self._flushed_end = 0  # what this process made durable, as far as it knows
        self._synced_end = 0  # what a power loss keeps (below the flushed end only without sync_on_open)
        self._closed = False
        self.sync_on_open = True

    @property
    def log_start_offset(self) -> int:
        return self._offsets[0] if self._offsets else self._start

    @property
    def end_offset(self) -> int:
        return self._offsets[-1] + self._counts[-1] if self._offsets else self._start

    @property
    def flushed_end_offset(self) -> int:
        return self._flushed_end

    @property
    def synced_end_offset(self) -> int:
        """The end of what a power loss would keep (the simulation's checks read it)."""
        return self._synced_end

    @property
    def last_epoch(self) -> int:
        return self._meta.last_epoch

    def _check_open(self) -> None:
        if self._closed:
            raise KraftError(ErrorCode.UNAVAILABLE, "memory log is closed")

    def append_batches(self, data: bytes | memoryview, infos: Sequence[BatchInfo]) -> None:
        self._check_open()
        sizes = validate_append(self.end_offset, self.last_epoch, data, infos)
        view = memoryview(data)
        pos = 0
        for info, size in zip(infos, sizes, strict=True):
            self._offsets.append(info.base_offset)
            self._counts.append(info.count)
            self._batches.append(bytes(view[pos : pos + size]))
            self._meta.on_append(info)
            pos += size

    def append(
        self,
        base_offset: int,
        epoch: int,
        items: Sequence[bytes] | Sequence[ControlRecord],
        append_time_ms: int | None = None,
    ) -> BatchInfo:
        self._check_open()
        return append_items(self, base_offset, epoch, items, append_time_ms)

    def flush(self) -> None:
        self._check_open()
        self._flushed_end = self._synced_end = self.end_offset

    def crash(self) -> None:
        """Power loss: drop every batch not synced."""
        keep = bisect.bisect_left(self._offsets, self._synced_end)
        self._drop_from(keep)
        self._meta.on_truncate(self.end_offset)
        self._flushed_end = self._synced_end = self.end_offset
        self._closed = False

    def _drop_from(self, index: int) -> None:
        if index == 0 and self._offsets:
            self._start = self._offsets[0]  # an emptied log keeps its start offset
        del self._offsets[index:]
        del self._counts[index:]
        del self._batches[index:]

    def truncate_to(self, end_offset: int) -> None:
        self._check_open()
        if end_offset == self.end_offset:
            return
        if end_offset > self.end_offset or end_offset < self.log_start_offset:
            raise KraftError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"truncate to {end_offset} outside the log [{self.log_start_offset}, {self.end_offset}]",
            )
        k = bisect.bisect_right(self._offsets, end_offset) - 1
        if self._offsets[k] != end_offset:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"truncate to {end_offset} falls inside the batch starting at offset {self._offsets[k]}",
            )
        self._drop_from(k)
        self._meta.on_truncate(end_offset)
        self._flushed_end = min(self._flushed_end, end_offset)
        self._synced_end = min(self._synced_end, end_offset)

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        self._check_open()
        end = self.end_offset
        if offset < self.log_start_offset or offset > end:
            raise KraftError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {offset} outside the log [{self.log_start_offset}, {end}]",
                log_start_offset=self.log_start_offset,
                end_offset=end,
            )
        limit = end if max_offset is None else min(max_offset, end)
        if offset >= limit:
            return b""
        i = bisect.bisect_right(self._offsets, offset) - 1
        out: list[bytes] = []
        size = 0
        while i < len(self._batches):
            b = self._batches[i]
            if self._offsets[i] + self._counts[i] > limit:
                break
            if out and size + len(b) > max_bytes:
                break
            out.append(b)
            size += len(b)
            i += 1
        return b"".join(out)

    def delete_before(self, offset: int) -> None:
        self._check_open()
        offset = min(offset, self.end_offset)
        k = 0
        while k < len(self._offsets) and self._offsets[k] + self._counts[k] <= offset:
            k += 1
        if k:
            self._start = self._offsets[k - 1] + self._counts[k - 1]
            del self._offsets[:k]
            del self._counts[:k]
            del self._batches[:k]
            self._meta.on_delete_before(self.log_start_offset)

    def reset_to_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        self._check_open()
        if snapshot_id.offset < 0 or snapshot_id.epoch < 0:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"invalid snapshot id {snapshot_id}")
        self._offsets, self._counts, self._batches = [], [], []
        self._start = snapshot_id.offset
        self._meta.on_reset(snapshot_id)
        self._flushed_end = self._synced_end = snapshot_id.offset

    def summary(
        self, snapshot: OffsetAndEpoch | None = None, snapshot_controls: Sequence[ControlRecord] = ()
    ) -> LogSummary:
        return self._meta.summary(self.log_start_offset, self.end_offset, snapshot, snapshot_controls)

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True

    def reopen(self) -> None:
        """After ``close()``, ``crash()`` or a process crash: usable again, as a restarted
        node's log, which takes what it finds for flushed (``SegmentedLog`` does the same),
        after syncing it unless ``sync_on_open`` is off."""
        self._closed = False
        self._flushed_end = self.end_offset
        if self.sync_on_open:
            self._synced_end = self.end_offset


class MemoryQuorumStateStore:
    """:class:`~quorum.storage.base.QuorumStateStorage` in memory; stores the same bytes the
    file store would write, so validation and round-tripping are identical."""

    def __init__(self, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        self._raw: bytes | None = None
        self._synced: bytes | None = None  # what a power loss keeps
        self.path = "memory://quorum-state"
        self.sync_on_open = True

    def load(self, cluster_id: str | None = None) -> QuorumState:
        if cluster_id is not None and cluster_id != self.cluster_id:
            raise KraftError(
                ErrorCode.INCONSISTENT_CLUSTER_ID, f"{self.path}: store is for cluster {self.cluster_id!r}"
            )
        if self._raw is None:
            return QuorumState(cluster_id=self.cluster_id)
        state = decode_quorum_state(self._raw, self.path)
        if state.cluster_id != self.cluster_id:  # pragma: no cover - save() refuses it already
            raise KraftError(ErrorCode.INCONSISTENT_CLUSTER_ID, f"{self.path}: cluster {state.cluster_id!r}")
        return state

    def save(self, state: QuorumState) -> None:
        if state.cluster_id != self.cluster_id:
            raise KraftError(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"{self.path}: quorum state is for cluster {state.cluster_id!r}, "
                f"this node is in {self.cluster_id!r}",
            )
        self._raw = self._synced = encode_quorum_state(state)

    def save_interrupted(self, state: QuorumState) -> None:
        """A save a process crash cut short after the rename, before the directory fsync: the
        new state is what the next process reads, the old one what a power loss leaves."""
        before = self._synced
        self.save(state)
        self._synced = before

    def crash(self) -> None:
        """Power loss: an interrupted save is undone (completed saves are durable)."""
        self._raw = self._synced

    def reopen(self) -> None:
        """A restarted process syncs the state it read (``open_storage``)."""
        if self.sync_on_open:
            self._synced = self._raw


class MemorySnapshotStore:
    """:class:`~quorum.storage.base.SnapshotStorage` holding each snapshot's file bytes."""

    def __init__(self) -> None:
        self._snaps: dict[OffsetAndEpoch, bytes] = {}
        self._downloads: dict[OffsetAndEpoch, bytearray] = {}

    def path(self, snapshot_id: OffsetAndEpoch) -> str:
        return "memory://" + snapshot_file_name(snapshot_id)

    def snapshot_ids(self) -> list[OffsetAndEpoch]:
        return sorted(self._snaps)

    def latest(self) -> OffsetAndEpoch | None:
        return max(self._snaps) if self._snaps else None

    def write(
        self,
        snapshot_id: OffsetAndEpoch,
        controls: Sequence[ControlRecord],
        state_chunks: Iterable[bytes],
        last_contained_log_timestamp: int = 0,
    ) -> str:
        check_snapshot_id(snapshot_id)
        if snapshot_id not in self._snaps:
            data = b"".join(
                encode_snapshot(snapshot_id, controls, state_chunks, last_contained_log_timestamp)
            )
            self._snaps[snapshot_id] = data
        return self.path(snapshot_id)

    def _get(self, snapshot_id: OffsetAndEpoch) -> bytes:
        data = self._snaps.get(snapshot_id)
        if data is None:
            raise KraftError(ErrorCode.SNAPSHOT_NOT_FOUND, f"no snapshot {snapshot_id} in memory")
        return data

    def size(self, snapshot_id: OffsetAndEpoch) -> int:
        return len(self._get(snapshot_id))

    def read_chunk(self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int) -> tuple[bytes, int]:
        data = self._get(snapshot_id)
        if position < 0 or position > len(data):
            raise KraftError(
                ErrorCode.POSITION_OUT_OF_RANGE,
                f"position {position} outside snapshot {snapshot_id} of {len(data)} bytes",
            )
        return data[position : position + max(0, max_bytes)], len(data)

    def begin_download(self, snapshot_id: OffsetAndEpoch) -> None:
        check_snapshot_id(snapshot_id)
        self._downloads[snapshot_id] = bytearray()

    def _download(self, snapshot_id: OffsetAndEpoch) -> bytearray:
        d = self._downloads.get(snapshot_id)
        if d is None:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"no download of snapshot {snapshot_id} in progress")
        return d

    def write_chunk(self, snapshot_id: OffsetAndEpoch, position: int, data: bytes | memoryview) -> None:
        buf = self._download(snapshot_id)
        if position != len(buf):
            raise KraftError(
                ErrorCode.POSITION_OUT_OF_RANGE,
                f"chunk of snapshot {snapshot_id} at position {position}, expected {len(buf)}",
            )
        buf += data

    def finish_download(self, snapshot_id: OffsetAndEpoch) -> str:
        buf = self._download(snapshot_id)
        try:
            parse_snapshot(memoryview(buf), snapshot_id, f"downloaded snapshot {snapshot_id}")
        except KraftError:
            self.abort_download(snapshot_id)
            raise
        del self._downloads[snapshot_id]
        self._snaps[snapshot_id] = bytes(buf)
        return self.path(snapshot_id)

    def abort_download(self, snapshot_id: OffsetAndEpoch) -> None:
        self._downloads.pop(snapshot_id, None)

    def controls(self, snapshot_id: OffsetAndEpoch) -> tuple[ControlRecord, ...]:
        return header_controls(self._get(snapshot_id), snapshot_id, self.path(snapshot_id))

    def load(
        self, snapshot_id: OffsetAndEpoch, *, verify_crc: bool = True
    ) -> tuple[tuple[ControlRecord, ...], list[bytes]]:
        return parse_snapshot(
            self._get(snapshot_id), snapshot_id, self.path(snapshot_id), ErrorCode.CORRUPT_LOG, verify_crc
        )

    def delete_older_than(self, snapshot_id: OffsetAndEpoch) -> None:
        latest = self.latest()
        for s in [s for s in self._snaps if s < snapshot_id and s != latest]:
            del self._snaps[s]

    def crash(self) -> None:
        """Power loss: downloads in progress are lost (their ``.part`` files are deleted on open)."""
        self._downloads.clear()

    def close(self) -> None:
        self._downloads.clear()

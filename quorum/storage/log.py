"""The segmented on-disk log (KIP-595 replicated log), with crash recovery on open.

Layout: files ``<base offset, 20 digits>.log`` in one directory, each holding encoded record
batches (``quorum.records``) back to back; a segment's name is the offset of its first batch
and segment ``i + 1`` starts exactly where segment ``i`` ends. The log start offset is the base
of the first segment (a log reset to a snapshot starts with an empty segment named by the
snapshot's end offset).

Index: for every segment, two ``array('q')`` columns (batch base offset, byte position),
rebuilt on open from the batch headers. It is dense (one entry per batch, 16 bytes) rather
than sparse: the core fetches and truncates at batch boundaries, and a dense index answers both
with one ``bisect`` and no file access. Reads are one ``os.pread`` on a cached descriptor of
whole batches; no per-record Python work, so catch-up copies bytes at disk speed. One segment's
index, byte I/O and preallocation live in ``quorum.storage.segment`` (with the test-only
power-loss mode); the active segment's file runs ahead of its data with a zero tail.

Recovery on open is :mod:`quorum.storage.logscan` (its rules are stated there); then the last
segment and the directory are fsynced (``logscan.sync_opened``): only after that is the log end also
its flushed end.

Why only the last segment can be torn: a roll makes the finished segment and its directory
entry durable before the new segment receives a byte (``_seal``), so the writes in flight at
a crash are always in the last segment.

Durability: ``append*`` write into the page cache; ``flush`` fsyncs every segment written since
the last flush (plus the directory when segments were created) and advances
``flushed_end_offset``; a follower's large appends (catch-up) then have their page cache freed
(``atomic.drop_synced``). ``truncate_to``, ``delete_before`` and ``reset_to_snapshot`` are durable
on return (they are rare, and a truncation that a crash undoes could resurrect divergent
batches).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from types import TracebackType

from quorum import records
from quorum.storage.atomic import CATCHUP_DROP_MIN_BYTES, FILE_MODE, drop_synced, ensure_dir, fsync_dir
from quorum.storage.base import LogBookkeeping, append_items, validate_append
from quorum.storage.dirlock import DataDirLock
from quorum.storage.logscan import open_segments, segment_files, sync_opened
from quorum.storage.segment import Segment, segment_name
from quorum.types import BatchInfo, ControlRecord, ErrorCode, KraftError, LogSummary, OffsetAndEpoch

__all__ = ["DEFAULT_SEGMENT_BYTES", "SegmentedLog", "segment_name"]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


class SegmentedLog:
    """The on-disk :class:`~quorum.storage.base.LogStorage`. Opening performs recovery (see the
    module docstring); ``summary()`` then describes the log for the core."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: bool = True,
        unflushed_in_memory: bool = False,
        sync_on_open: bool = True,
    ) -> None:
        if segment_bytes < records.HEADER_SIZE:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"segment_bytes {segment_bytes} is too small")
        self.directory = os.fspath(directory)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.unflushed_in_memory = unflushed_in_memory  # test-only power-loss mode (segment.py)
        if unflushed_in_memory:
            log.warning("%s: unflushed writes are kept in memory (test-only power-loss mode)", directory)
        self._meta = LogBookkeeping()
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._dirty: dict[int, Segment] = {}  # base -> segment written since the last flush
        self._dir_dirty = False
        # (segment, position, length) written by large follower appends (catch-up): their page
        # cache is freed once the next flush has fsynced them (``atomic.drop_synced``).
        self._drops: list[tuple[Segment, int, int]] = []
        self._closed = False
        # Descriptors of segments removed while a flush ran in a worker thread are closed
        # after it (the flush may still be writing or syncing them).
        self._flush_lock = threading.Lock()
        # Fetched batches are written in a worker thread (the driver's persist)
        # while the loop may delete a snapshotted prefix: those two take turns.
        self._struct_lock = threading.Lock()
        self._flushing = False
        self._deferred_close: list[int] = []
        self._dir_lock: DataDirLock | None = None  # the data directory's, from open_storage
        ensure_dir(self.directory, fsync=fsync)
        try:
            self._open()
            if fsync and sync_on_open:
                sync_opened(self.directory, self._segments)
        except BaseException:
            self._close_fds()
            raise
        # Only now may the flushed end be the log end: the core counts it as durable (a
        # follower's Fetch offset, the leader's own vote toward the high watermark).
        self._flushed_end = self.end_offset

    # -- properties ------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base

    @property
    def end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def flushed_end_offset(self) -> int:
        return self._flushed_end

    @property
    def last_epoch(self) -> int:
        return self._meta.last_epoch

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # -- open / recovery ---------------------------------------------------------------------

    def _open(self) -> None:
        found = segment_files(self.directory)
        if not found:
            self._segments.append(self._create_segment(0, now=True))
            self._bases.append(0)
            if self.fsync:
                fsync_dir(self.directory)
            return
        segs, bytes_ = self._segments, self.segment_bytes
        open_segments(self.directory, found, self._meta, segs, self.unflushed_in_memory, self.fsync, bytes_)
        self._bases.extend(seg.base for seg in self._segments)

    # -- writing -----------------------------------------------------------------------------

    def _create_segment(self, base: int, *, now: bool = False) -> Segment:
        self._dir_dirty = True
        if self.unflushed_in_memory and not now:
            # Power-loss mode: a rolled segment's file appears at the next flush, with its
            # bytes (a power cut before it loses the file's creation too).
            return Segment(self.directory, base, -1, unflushed_in_memory=True)
        path = os.path.join(self.directory, segment_name(base))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
        return Segment(self.directory, base, fd, self.unflushed_in_memory, self.segment_bytes)

    def _roll(self) -> Segment:
        self._seal(self._segments[-1])
        seg = self._create_segment(self.end_offset)
        self._segments.append(seg)
        self._bases.append(seg.base)
        return seg

    def _seal(self, seg: Segment) -> None:
        """Make a finished segment (and its directory entry) durable before the next segment
        receives a byte, so that a power cut can tear only the LAST segment, the one case
        recovery may repair. Without it, an append that rolls leaves the old segment's tail and
        the new segment in the page cache together, and a cut could tear a non-final segment:
        recovery would then refuse the log although nothing torn was ever acknowledged. Once
        per ``segment_bytes``, so the fsync on the caller's thread is rare."""
        seg.flush_pending()
        seg.trim()  # its preallocated zero tail: a sealed segment is data only
        if self.fsync:
            if seg.fd >= 0:
                os.fdatasync(seg.fd)
            if self._dir_dirty:
                fsync_dir(self.directory)
                self._dir_dirty = False

    def _write_run(self, seg: Segment, data: memoryview, drop: bool = False) -> None:
        if drop:
            self._drops.append((seg, seg.size, len(data)))
        seg.write(data)
        self._dirty[seg.base] = seg

    def _check_open(self) -> None:
        if self._closed:
            raise KraftError(ErrorCode.UNAVAILABLE, f"log {self.directory} is closed")

    def append_batches(self, data: bytes | memoryview, infos: Sequence[BatchInfo]) -> None:
        """Append pre-encoded batches (the follower path: Fetch bytes written unchanged).
        ``infos`` must describe ``data`` exactly and start at ``end_offset``; otherwise
        INVALID_REQUEST and nothing is written. May run in a worker thread."""
        with self._struct_lock:
            self._append_batches(data, infos)

    def _append_batches(self, data: bytes | memoryview, infos: Sequence[BatchInfo]) -> None:
        self._check_open()
        sizes = validate_append(self.end_offset, self.last_epoch, data, infos)
        view = memoryview(data)
        drop = self.fsync and len(view) >= CATCHUP_DROP_MIN_BYTES
        seg = self._segments[-1]
        run_start = 0  # start in `view` of the bytes not yet written to `seg`
        pos = 0
        pending: list[tuple[BatchInfo, int]] = []
        try:
            for info, size in zip(infos, sizes, strict=True):
                if (
                    seg.size + (pos - run_start) > 0
                    and seg.size + (pos - run_start) + size > self.segment_bytes
                ):
                    if pos > run_start:
                        self._write_run(seg, view[run_start:pos], drop)
                        self._index(seg, pending)
                        pending = []
                    run_start = pos
                    seg = self._roll()
                pending.append((info, size))
                pos += size
            if pos > run_start:
                self._write_run(seg, view[run_start:pos], drop)
                self._index(seg, pending)
        except OSError as e:
            raise KraftError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{seg.path}: write failed: {e}") from e

    def _index(self, seg: Segment, pending: list[tuple[BatchInfo, int]]) -> None:
        pos = seg.size
        for info, size in pending:
            seg.add(info.base_offset, pos, size, info.count)
            self._meta.on_append(info)
            pos += size

    def append(
        self,
        base_offset: int,
        epoch: int,
        items: Sequence[bytes] | Sequence[ControlRecord],
        append_time_ms: int | None = None,
    ) -> BatchInfo:
        """Encode and append one batch (the leader path). ``items`` are all data records
        (bytes) or all control records."""
        self._check_open()
        return append_items(self, base_offset, epoch, items, append_time_ms)

    def flush(self) -> None:
        """fsync every segment written since the last flush (one fsync each, however many
        appends), then the directory if segments were created, and advance
        ``flushed_end_offset`` to the end offset seen when the flush started.

        May run in a worker thread while the event loop keeps reading and appending (not
        truncating): appends made during the fsync stay dirty for the next flush."""
        self._check_open()
        end = self.end_offset
        dirty = list(self._dirty.values())
        self._dirty.clear()
        dir_dirty, self._dir_dirty = self._dir_dirty, False
        drops, self._drops = self._drops, []
        with self._flush_lock:
            self._flushing = True
        try:
            for seg in dirty:
                seg.flush_pending()
                if self.fsync and seg.fd >= 0:
                    os.fdatasync(seg.fd)
            if self.fsync and dir_dirty:
                fsync_dir(self.directory)
            for seg, start, length in drops:  # fsynced now (a removed segment's fd is -1)
                drop_synced(seg.fd, start, length)
        except BaseException:
            for seg in dirty:
                self._dirty.setdefault(seg.base, seg)
            self._dir_dirty = self._dir_dirty or dir_dirty
            raise
        finally:
            with self._flush_lock:
                self._flushing = False
                deferred, self._deferred_close = self._deferred_close, []
            for fd in deferred:
                os.close(fd)
        self._flushed_end = min(max(self._flushed_end, end), self.end_offset)

    # -- truncation and deletion -------------------------------------------------------------

    def _remove_segment(self, seg: Segment) -> None:
        fd, seg.fd = seg.fd, -1
        with self._flush_lock:
            if self._flushing:
                self._deferred_close.append(fd)
                fd = -1
        if fd >= 0:
            os.close(fd)
        seg.removed()
        with contextlib.suppress(FileNotFoundError):  # power-loss mode: maybe never created
            os.unlink(seg.path)
        self._dirty.pop(seg.base, None)
        self._dir_dirty = True

    def _sync_after_structural_change(self, segs: list[Segment]) -> None:
        if self.fsync:
            for seg in segs:
                if seg.fd >= 0:
                    os.fdatasync(seg.fd)
            if self._dir_dirty:
                fsync_dir(self.directory)
            self._dir_dirty = False

    def truncate_to(self, end_offset: int) -> None:
        """Drop every batch at or after ``end_offset`` (KIP-595 divergence). ``end_offset`` must
        be a batch boundary within [log start, end]; durable on return."""
        self._check_open()
        if end_offset == self.end_offset:
            return
        if end_offset > self.end_offset or end_offset < self.log_start_offset:
            raise KraftError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"truncate to {end_offset} outside the log [{self.log_start_offset}, {self.end_offset}]",
            )
        seg, idx = self._locate(end_offset)
        if seg.offsets[idx] != end_offset:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"truncate to {end_offset} falls inside the batch starting at offset {seg.offsets[idx]}",
            )
        while len(self._segments) > 1 and self._segments[-1].base >= end_offset:
            self._remove_segment(self._segments.pop())
            self._bases.pop()
        last = self._segments[-1]
        k = bisect.bisect_left(last.offsets, end_offset)
        if k < len(last.offsets):
            cut = last.positions[k]
            last.truncate(cut)
            del last.offsets[k:]
            del last.positions[k:]
            last.next_offset = end_offset
        self._meta.on_truncate(end_offset)
        self._flushed_end = min(self._flushed_end, end_offset)
        self._sync_after_structural_change([last])

    def delete_before(self, offset: int) -> None:
        """Delete whole segments whose batches all lie below ``offset`` (KIP-630: covered by a
        snapshot). The active segment is never deleted; the log start becomes the base of the
        first kept segment, so it may stay below ``offset``."""
        self._check_open()
        with self._struct_lock:
            offset = min(offset, self.end_offset)
            removed = False
            while len(self._segments) > 1 and self._segments[1].base <= offset:
                self._remove_segment(self._segments.pop(0))
                self._bases.pop(0)
                removed = True
            if removed:
                self._meta.on_delete_before(self.log_start_offset)
                self._sync_after_structural_change([])

    def reset_to_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        """Replace the log by an empty one starting at the snapshot's end offset (KIP-630: a
        follower installing a fetched snapshot). Segments are deleted newest first, so a crash
        part-way leaves a prefix of the old log, which ``open_storage`` resets again because it
        ends below the snapshot."""
        self._check_open()
        if snapshot_id.offset < 0 or snapshot_id.epoch < 0:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"invalid snapshot id {snapshot_id}")
        while self._segments:
            self._remove_segment(self._segments.pop())
        self._bases.clear()
        if self.fsync:
            fsync_dir(self.directory)
        self._segments.append(self._create_segment(snapshot_id.offset, now=True))
        self._bases.append(snapshot_id.offset)
        self._meta.on_reset(snapshot_id)
        self._flushed_end = snapshot_id.offset
        self._sync_after_structural_change([])

    # -- reading -----------------------------------------------------------------------------

    def _locate(self, offset: int) -> tuple[Segment, int]:
        """The segment and batch index holding ``offset`` (log_start <= offset < end)."""
        si = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segments[si]
        while not seg.offsets or offset >= seg.next_offset:  # empty segments share their base
            si += 1
            seg = self._segments[si]
        return seg, bisect.bisect_right(seg.offsets, offset) - 1

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches starting with the batch that holds ``offset`` (the core always asks at
        a batch boundary; inside a batch the whole batch is returned, as Kafka's Fetch does).

        At least one batch is returned even if it exceeds ``max_bytes``, all from one segment;
        ``max_offset`` (exclusive, e.g. the flushed end for a leader serving Fetch) limits the
        result to batches ending at or below it. b"" at the end; OFFSET_OUT_OF_RANGE below the
        log start or past the end."""
        self._check_open()
        end = self.end_offset
        if offset < self.log_start_offset or offset > end:
            raise KraftError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {offset} outside the log [{self.log_start_offset}, {end}]",
                log_start_offset=self.log_start_offset,
                end_offset=end,
            )
        limit_offset = end if max_offset is None else min(max_offset, end)
        if offset >= limit_offset:
            return b""
        seg, i = self._locate(offset)
        return seg.read_batches(i, max_bytes, limit_offset)

    def batch_infos(self) -> list[tuple[int, int, int]]:  # (offset, segment base, position): for tests
        return [(o, s.base, p) for s in self._segments for o, p in zip(s.offsets, s.positions, strict=True)]

    def summary(
        self, snapshot: OffsetAndEpoch | None = None, snapshot_controls: Sequence[ControlRecord] = ()
    ) -> LogSummary:
        return self._meta.summary(self.log_start_offset, self.end_offset, snapshot, snapshot_controls)

    # -- lifecycle ---------------------------------------------------------------------------

    def _close_fds(self) -> None:
        # the segment list stays, so offsets of a closed log can still be asked for
        for seg in self._segments:
            if seg.fd >= 0:
                try:
                    os.close(seg.fd)
                except OSError:
                    pass
                seg.fd = -1

    def hold_lock(self, lock: DataDirLock) -> None:  # kept until close (``open_storage``)
        self._dir_lock = lock

    def close(self) -> None:
        """Flush and close (a clean shutdown loses nothing); release the directory's lock."""
        if self._closed:
            return
        try:
            self.flush()
            if self._segments[-1].trim() and self.fsync:  # a clean stop leaves no zero tail
                os.fdatasync(self._segments[-1].fd)
        finally:
            self._closed = True
            self._close_fds()
            if self._dir_lock is not None:
                self._dir_lock.release()

    def __enter__(self) -> SegmentedLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

"""KIP-630 snapshots on disk: ``<end offset, 20 digits>-<epoch, 10 digits>.checkpoint``.

A snapshot file is a sequence of record batches (``quorum.records``), offsets counting from 0
inside the file and every batch carrying the snapshot's epoch:

1. a control batch: ``SnapshotHeader`` (KIP-630) followed by the voter-set control records
   the log held at the snapshot offset (KIP-856 ``AddVoter`` per voter, KIP-642
   ``TargetVoters``, KIP-704 ``LeaderRecovery``), so a replica that starts from the snapshot
   knows the voter set without the log prefix;
2. zero or more data batches, one per chunk of the state machine's serialized state (opaque
   bytes, returned by :meth:`SnapshotStore.load` exactly as they were written);
3. a control batch holding only ``SnapshotFooter`` (KIP-630): its presence proves the file is
   complete.

Writing goes to ``.checkpoint.part``, is fsynced and renamed, then the directory is fsynced;
a crash leaves at most a ``.part`` file, which opening the store deletes. A snapshot fetched
from the leader (FetchSnapshot) is assembled the same way and every batch is CRC-checked
before the rename, so a damaged chunk never becomes a snapshot.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence

from quorum import records
from quorum.storage.atomic import FILE_MODE, drop_synced, ensure_dir, fsync_dir
from quorum.storage.snapdownload import DownloadParse
from quorum.types import (
    ControlRecord,
    ErrorCode,
    KraftError,
    OffsetAndEpoch,
    SnapshotFooter,
    SnapshotHeader,
)

__all__ = [
    "SNAPSHOT_SUFFIX",
    "SnapshotStore",
    "encode_snapshot",
    "header_controls",
    "parse_snapshot",
    "snapshot_file_name",
]

SNAPSHOT_SUFFIX = ".checkpoint"
PART_SUFFIX = ".checkpoint.part"
_NAME_RE = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
MAX_CHUNK_BYTES = records.MAX_BATCH_BYTES - records.HEADER_SIZE - 4
# A download is fdatasynced each time it crosses a multiple of this: every 8 MiB chunk cost up
# to seconds per 512 MB on this project's virtual disks (a flush each), every 64 MiB about what
# one final fsync costs, and the final fsync then has at most 64 MiB left to write.
SYNC_EVERY_BYTES = 64 * 1024 * 1024
Chunk = bytes | memoryview  # a state chunk: a download's are views of the received bytes


def snapshot_file_name(snapshot_id: OffsetAndEpoch) -> str:
    return f"{snapshot_id.offset:020d}-{snapshot_id.epoch:010d}{SNAPSHOT_SUFFIX}"


def check_snapshot_id(snapshot_id: OffsetAndEpoch) -> None:
    if not (0 <= snapshot_id.offset < 10**20 and 0 <= snapshot_id.epoch < 2**31):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"invalid snapshot id {snapshot_id}")


def encode_snapshot(
    snapshot_id: OffsetAndEpoch,
    controls: Sequence[ControlRecord],
    state_chunks: Iterable[bytes],
    last_contained_log_timestamp: int = 0,
) -> Iterator[bytes]:
    """The snapshot's batches, one at a time (a large state is never held twice in memory)."""
    check_snapshot_id(snapshot_id)
    for c in controls:
        if isinstance(c, SnapshotHeader | SnapshotFooter):
            raise KraftError(ErrorCode.INVALID_REQUEST, "snapshot controls must not include header or footer")
    epoch = snapshot_id.epoch
    head: list[ControlRecord] = [SnapshotHeader(last_contained_log_timestamp), *controls]
    yield records.encode_control_batch(0, epoch, head, append_time_ms=last_contained_log_timestamp)
    offset = len(head)
    for chunk in state_chunks:
        if len(chunk) > MAX_CHUNK_BYTES:
            raise KraftError(
                ErrorCode.PAYLOAD_TOO_LARGE, f"snapshot chunk of {len(chunk)} bytes exceeds {MAX_CHUNK_BYTES}"
            )
        yield records.encode_batch(offset, epoch, [bytes(chunk)], append_time_ms=last_contained_log_timestamp)
        offset += 1
    yield records.encode_control_batch(
        offset, epoch, [SnapshotFooter()], append_time_ms=last_contained_log_timestamp
    )


def parse_snapshot(
    buf: bytes | memoryview,
    snapshot_id: OffsetAndEpoch,
    where: str,
    code: ErrorCode = ErrorCode.CORRUPT_RECORD,
    verify_crc: bool = True,
) -> tuple[tuple[ControlRecord, ...], list[bytes]]:
    """Validate a whole snapshot (every CRC, the header/footer framing, offsets, epochs) and
    return (voter-set controls, state chunks). Any defect raises ``code`` naming ``where``."""

    def bad(msg: str) -> KraftError:
        return KraftError(code, f"{where}: {msg}", file=where)

    try:
        batches, _ = records.decode_batches(buf, verify_crc=verify_crc, allow_torn_tail=False)
    except records.CorruptRecordError as e:
        raise bad(e.message) from None
    if len(batches) < 2:
        raise bad(f"a snapshot needs a header and a footer batch, found {len(batches)} batches")
    expected = 0
    for b in batches:
        if b.info.base_offset != expected:
            raise bad(f"batch at position {b.position} has offset {b.info.base_offset}, expected {expected}")
        if b.info.epoch != snapshot_id.epoch:
            raise bad(f"batch at position {b.position} has epoch {b.info.epoch}, not {snapshot_id.epoch}")
        expected = b.info.next_offset
    first, last = batches[0], batches[-1]
    if not first.info.controls or not isinstance(first.info.controls[0], SnapshotHeader):
        raise bad("first batch is not a control batch starting with SnapshotHeader")
    if last.info.controls != (SnapshotFooter(),):
        raise bad("last batch is not a SnapshotFooter control batch (incomplete snapshot)")
    controls = first.info.controls[1:]
    if any(isinstance(c, SnapshotHeader | SnapshotFooter) for c in controls):
        raise bad("snapshot header batch holds a second header or a footer")
    chunks: list[bytes] = []
    for b in batches[1:-1]:
        if b.info.controls:
            raise bad(f"unexpected control batch at offset {b.info.base_offset}")
        chunks.extend(records.data_records(b))
    return controls, chunks


def header_controls(
    head: bytes | memoryview, snapshot_id: OffsetAndEpoch, where: str
) -> tuple[ControlRecord, ...]:
    """The voter-set controls from the header batch at the start of ``head`` (which must hold
    at least that whole batch): what a starting node needs without reading the state."""
    try:
        batches, _ = records.decode_batches(head[: _first_batch_size(head, where)])
    except records.CorruptRecordError as e:
        raise KraftError(ErrorCode.CORRUPT_LOG, f"{where}: {e.message}", file=where) from None
    first = batches[0].info
    if (
        not first.controls
        or not isinstance(first.controls[0], SnapshotHeader)
        or first.epoch != snapshot_id.epoch
    ):
        raise KraftError(
            ErrorCode.CORRUPT_LOG, f"{where}: first batch is not this snapshot's header", file=where
        )
    return first.controls[1:]


def _first_batch_size(head: bytes | memoryview, where: str) -> int:
    if len(head) < records.HEADER_SIZE:
        raise KraftError(ErrorCode.CORRUPT_LOG, f"{where}: too short for a snapshot header batch", file=where)
    size = records.batch_header(head, 0)[1]
    if size < records.HEADER_SIZE or size > len(head):
        raise KraftError(
            ErrorCode.CORRUPT_LOG, f"{where}: header batch of {size} bytes is cut short", file=where
        )
    return size


def _parse_name(name: str) -> OffsetAndEpoch | None:
    m = _NAME_RE.match(name)
    return OffsetAndEpoch(int(m.group(1)), int(m.group(2))) if m else None


class SnapshotStore:
    """The on-disk :class:`~quorum.storage.base.SnapshotStorage` in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.directory = os.fspath(directory)
        self.fsync = fsync
        ensure_dir(self.directory, fsync=fsync)
        self._ids: list[OffsetAndEpoch] = []
        self._read_fds: dict[OffsetAndEpoch, int] = {}
        self._downloads: dict[OffsetAndEpoch, tuple[int, int]] = {}  # id -> (fd, bytes written)
        self._parses: dict[OffsetAndEpoch, DownloadParse] = {}  # id -> its batches checked so far
        # What ``finish_download`` just verified and parsed, for the ``load`` that follows it
        # (the install): a large snapshot is not read and parsed a second time.
        self._verified: tuple[OffsetAndEpoch, tuple[ControlRecord, ...], Sequence[Chunk]] | None = None
        removed = False
        for name in os.listdir(self.directory):
            if name.endswith(PART_SUFFIX):
                # an interrupted write or download: never a snapshot (KIP-630 "partial")
                os.unlink(os.path.join(self.directory, name))
                removed = True
                continue
            sid = _parse_name(name)
            if sid is not None:
                self._ids.append(sid)
        self._ids.sort()
        if removed and self.fsync:
            fsync_dir(self.directory)

    def path(self, snapshot_id: OffsetAndEpoch) -> str:
        return os.path.join(self.directory, snapshot_file_name(snapshot_id))

    def _part_path(self, snapshot_id: OffsetAndEpoch) -> str:
        return self.path(snapshot_id)[: -len(SNAPSHOT_SUFFIX)] + PART_SUFFIX

    def snapshot_ids(self) -> list[OffsetAndEpoch]:
        return list(self._ids)

    def latest(self) -> OffsetAndEpoch | None:
        return self._ids[-1] if self._ids else None

    def _commit(self, snapshot_id: OffsetAndEpoch, fd: int, drop: bool = False) -> str:
        if self.fsync:
            os.fsync(fd)
            if drop:  # a download: its content is in memory already (atomic.drop_synced)
                drop_synced(fd, 0, os.fstat(fd).st_size)
        os.close(fd)
        final = self.path(snapshot_id)
        stale = self._read_fds.pop(snapshot_id, None)  # a re-fetched id replaces the old inode
        if stale is not None:
            os.close(stale)
        os.replace(self._part_path(snapshot_id), final)
        if self.fsync:
            fsync_dir(self.directory)
        if snapshot_id not in self._ids:
            self._ids.append(snapshot_id)
            self._ids.sort()
        return final

    def write(
        self,
        snapshot_id: OffsetAndEpoch,
        controls: Sequence[ControlRecord],
        state_chunks: Iterable[bytes],
        last_contained_log_timestamp: int = 0,
    ) -> str:
        """Write a snapshot atomically; returns its path. An existing snapshot with the same id
        is kept as it is (snapshots of the same offset and epoch hold the same state)."""
        check_snapshot_id(snapshot_id)
        if snapshot_id in self._ids:
            return self.path(snapshot_id)
        part = self._part_path(snapshot_id)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            for batch in encode_snapshot(snapshot_id, controls, state_chunks, last_contained_log_timestamp):
                _write_all(fd, batch)
        except BaseException:
            os.close(fd)
            os.unlink(part)
            raise
        return self._commit(snapshot_id, fd)

    def _read_fd(self, snapshot_id: OffsetAndEpoch) -> int:
        fd = self._read_fds.get(snapshot_id)
        if fd is None:
            if snapshot_id not in self._ids:
                raise KraftError(
                    ErrorCode.SNAPSHOT_NOT_FOUND, f"no snapshot {snapshot_id} in {self.directory}"
                )
            try:
                fd = os.open(self.path(snapshot_id), os.O_RDONLY)
            except FileNotFoundError:
                raise KraftError(
                    ErrorCode.SNAPSHOT_NOT_FOUND, f"snapshot file {self.path(snapshot_id)} disappeared"
                ) from None
            self._read_fds[snapshot_id] = fd
        return fd

    def size(self, snapshot_id: OffsetAndEpoch) -> int:
        return os.fstat(self._read_fd(snapshot_id)).st_size

    def read_chunk(self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int) -> tuple[bytes, int]:
        """Raw file bytes ``[position, position + max_bytes)`` and the file size (FetchSnapshot,
        KIP-630). POSITION_OUT_OF_RANGE past the end; SNAPSHOT_NOT_FOUND for an unknown id."""
        fd = self._read_fd(snapshot_id)
        total = os.fstat(fd).st_size
        if position < 0 or position > total:
            raise KraftError(
                ErrorCode.POSITION_OUT_OF_RANGE,
                f"position {position} outside snapshot {snapshot_id} of {total} bytes",
            )
        n = max(0, min(max_bytes, total - position))
        return os.pread(fd, n, position), total

    def begin_download(self, snapshot_id: OffsetAndEpoch) -> None:
        """Start (or restart from zero) assembling a fetched snapshot in a ``.part`` file."""
        check_snapshot_id(snapshot_id)
        self.abort_download(snapshot_id)
        fd = os.open(self._part_path(snapshot_id), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        self._downloads[snapshot_id] = (fd, 0)
        self._parses[snapshot_id] = DownloadParse(snapshot_id)

    def _download(self, snapshot_id: OffsetAndEpoch) -> tuple[int, int]:
        d = self._downloads.get(snapshot_id)
        if d is None:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"no download of snapshot {snapshot_id} in progress")
        return d

    def write_chunk(self, snapshot_id: OffsetAndEpoch, position: int, data: bytes | memoryview) -> None:
        """Append the chunk at ``position``, which must be the number of bytes received so far
        (chunks arrive in order, KIP-630 FetchSnapshot); otherwise POSITION_OUT_OF_RANGE."""
        fd, written = self._download(snapshot_id)
        if position != written:
            raise KraftError(
                ErrorCode.POSITION_OUT_OF_RANGE,
                f"chunk of snapshot {snapshot_id} at position {position}, expected {written}",
            )
        _write_all(fd, data)
        self._downloads[snapshot_id] = (fd, written + len(data))
        self._parses[snapshot_id].feed(data)
        if self.fsync and (written + len(data)) // SYNC_EVERY_BYTES != written // SYNC_EVERY_BYTES:
            # Write the download back as it arrives (this runs in the driver's persist, while
            # the next chunk travels): left to the final fsync, a 1 GB snapshot would be written
            # to disk only after the last chunk, all of it on the catch-up's critical path
            # (the kernel starts writing dirty pages on its own only past ~10 % of memory).
            os.fdatasync(fd)
            # ... and reuse its page cache for the next chunks: the download's content stays
            # in memory until installed (DownloadParse), nothing reads it back.
            drop_synced(fd, 0, written + len(data))

    def finish_download(self, snapshot_id: OffsetAndEpoch) -> str:
        """Validate the assembled snapshot (every batch CRC, framing, epochs) and install it
        atomically. A defect raises CORRUPT_RECORD naming what is wrong; the partial file is
        removed and no snapshot is installed. When every chunk was checked and parsed as it
        arrived (``DownloadParse``), nothing is read back: only the fsync and rename remain."""
        fd, _ = self._download(snapshot_id)
        parse = self._parses.get(snapshot_id)
        chunks: Sequence[Chunk]
        if parse is not None and parse.complete():
            controls, chunks = parse.result()
        else:
            # Something looked wrong on arrival (or the download predates the check): verify
            # the whole file, which names the defect and its position.
            with open(self._part_path(snapshot_id), "rb") as f:
                buf = f.read()
            try:
                controls, chunks = parse_snapshot(buf, snapshot_id, f"downloaded snapshot {snapshot_id}")
            except KraftError:
                self.abort_download(snapshot_id)
                raise
            del buf
        del self._downloads[snapshot_id]
        self._parses.pop(snapshot_id, None)
        path = self._commit(snapshot_id, fd, drop=True)
        self._verified = (snapshot_id, controls, chunks)
        return path

    def abort_download(self, snapshot_id: OffsetAndEpoch) -> None:
        d = self._downloads.pop(snapshot_id, None)
        self._parses.pop(snapshot_id, None)
        if d is not None:
            os.close(d[0])
        try:
            os.unlink(self._part_path(snapshot_id))
        except FileNotFoundError:
            pass

    def controls(self, snapshot_id: OffsetAndEpoch) -> tuple[ControlRecord, ...]:
        """The voter-set control records of a stored snapshot, reading only its header batch."""
        fd = self._read_fd(snapshot_id)
        where = self.path(snapshot_id)
        head = os.pread(fd, records.HEADER_SIZE, 0)
        if len(head) == records.HEADER_SIZE:
            size = records.batch_header(head, 0)[1]
            if records.HEADER_SIZE <= size <= records.MAX_BATCH_BYTES:
                head = os.pread(fd, size, 0)
        return header_controls(head, snapshot_id, where)

    def load(
        self, snapshot_id: OffsetAndEpoch, *, verify_crc: bool = True
    ) -> tuple[tuple[ControlRecord, ...], Sequence[Chunk]]:
        """(voter-set controls, state chunks) of a stored snapshot; a damaged file raises
        CORRUPT_LOG naming it. ``verify_crc=False`` skips the CRCs (not the framing checks)
        for a snapshot ``finish_download`` has just verified: its parsed content is then
        handed over as it is, without reading the file again."""
        verified, self._verified = self._verified, None
        if not verify_crc and verified is not None and verified[0] == snapshot_id:
            return verified[1], verified[2]
        fd = self._read_fd(snapshot_id)
        size = os.fstat(fd).st_size
        buf = os.pread(fd, size, 0)
        return parse_snapshot(buf, snapshot_id, self.path(snapshot_id), ErrorCode.CORRUPT_LOG, verify_crc)

    def delete_older_than(self, snapshot_id: OffsetAndEpoch) -> None:
        """Delete snapshots older than ``snapshot_id``; the latest snapshot is always kept."""
        latest = self.latest()
        doomed = [s for s in self._ids if s < snapshot_id and s != latest]
        for s in doomed:
            fd = self._read_fds.pop(s, None)
            if fd is not None:
                os.close(fd)
            try:
                os.unlink(self.path(s))
            except FileNotFoundError:
                pass
            self._ids.remove(s)
        if doomed and self.fsync:
            fsync_dir(self.directory)

    def close(self) -> None:
        self._verified = None
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        for sid in list(self._downloads):
            self.abort_download(sid)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]

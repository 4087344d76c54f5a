"""Durable storage of a node: ``meta.properties`` (KIP-856 storage UUID), the quorum-state file
(KIP-856 QuorumStateData), the segmented log (KIP-595) and snapshots (KIP-630), each behind a
narrow interface with an in-memory twin (``quorum.storage.memory``).

Directory layout (``kraftkeeper format --dir DIR``)::

    DIR/meta.properties                              identity: cluster id, node id, storage UUID
    DIR/.lock                                        held (flock) by the process using DIR
    DIR/__cluster_metadata-0/quorum-state            epoch, leader, vote (JSON, replaced atomically)
    DIR/__cluster_metadata-0/<offset 20>.log         log segments
    DIR/__cluster_metadata-0/<offset 20>-<epoch 10>.checkpoint   snapshots

(``__cluster_metadata-0`` is the directory name Kafka's KRaft uses for the same data.)
Directories are created 0700 and files 0600: the node's alone.
"""

from __future__ import annotations

import os

from quorum.storage.atomic import atomic_write, ensure_dir, fsync_dir, fsync_existing, restrict_dir
from quorum.storage.base import LogStorage, QuorumStateStorage, SnapshotStorage
from quorum.storage.dirlock import LOCK_FILE, DataDirLock
from quorum.storage.log import DEFAULT_SEGMENT_BYTES, SegmentedLog
from quorum.storage.memory import MemoryLog, MemoryQuorumStateStore, MemorySnapshotStore
from quorum.storage.meta import META_FILE, MetaProperties, format_dir, load_meta
from quorum.storage.quorum_state import QUORUM_STATE_FILE, QuorumStateStore
from quorum.storage.snapshot import SnapshotStore
from quorum.types import ErrorCode, KraftError, LogSummary

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "LOCK_FILE",
    "METADATA_DIR",
    "DataDirLock",
    "LogStorage",
    "MemoryLog",
    "MemoryQuorumStateStore",
    "MemorySnapshotStore",
    "MetaProperties",
    "QuorumStateStorage",
    "QuorumStateStore",
    "SegmentedLog",
    "SnapshotStorage",
    "SnapshotStore",
    "atomic_write",
    "format_dir",
    "fsync_dir",
    "load_meta",
    "open_storage",
    "recover_log",
]

METADATA_DIR = "__cluster_metadata-0"


def recover_log(log: LogStorage, snapshots: SnapshotStorage) -> LogSummary:
    """Reconcile a log with the latest snapshot and describe both for the core (KIP-630):

    * a log that ends below the latest snapshot (a follower that crashed while installing a
      fetched snapshot, or a log lost behind one) is reset to start at the snapshot;
    * a log that starts above offset 0 needs a snapshot covering everything before its start,
      otherwise committed data is missing: CORRUPT_LOG.
    """
    latest = snapshots.latest()
    if latest is not None and (
        log.end_offset < latest.offset or log.log_start_offset == log.end_offset == latest.offset
    ):
        # (the second case re-creates an empty log at the snapshot so that it knows the
        # snapshot's epoch as its last epoch)
        log.reset_to_snapshot(latest)
    covered = latest.offset if latest is not None else 0
    if log.log_start_offset > covered:
        raise KraftError(
            ErrorCode.CORRUPT_LOG,
            f"the log starts at offset {log.log_start_offset} but "
            + (f"the latest snapshot {latest} ends at {covered}" if latest else "there is no snapshot")
            + ": committed records before it are missing",
        )
    controls = snapshots.controls(latest) if latest is not None else ()
    return log.summary(latest, controls)


def open_storage(
    directory: str | os.PathLike[str],
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    fsync: bool = True,
    unflushed_in_memory: bool = False,
    sync_on_open: bool = True,
) -> tuple[MetaProperties, QuorumStateStore, SegmentedLog, SnapshotStore, LogSummary]:
    """Open a formatted data directory for the node runtime: identity, quorum state store (its
    file already validated), recovered log, snapshots, and the summary the core starts from.
    ``unflushed_in_memory``: the test-only power-loss mode of ``quorum.storage.segment``.

    Every process that opens a data directory comes through here (the node, ``recover-unclean``,
    tools), and here it:

    * takes the directory's lock (``quorum.storage.dirlock``: one process per directory; a
      second one gets UNAVAILABLE naming the holder). The returned log holds it and releases
      it in ``close()``;
    * makes durable what a previous process may have left only in the page cache (it may have
      been killed): meta.properties, the quorum-state file, the log's last segment, and their
      directories, before anything reads them as the node's state. Without it this process
      would vote with an epoch, and claim log records in its Fetches, that a power cut can
      still take (``sync_on_open=False`` only shows that hole in tests and the bench).

    Raises NOT_FORMATTED for a directory never formatted (KIP-856: the node must not start),
    CORRUPT_LOG naming the file for damage that recovery must not paper over."""
    directory = os.fspath(directory)
    if not os.path.exists(os.path.join(directory, META_FILE)):
        load_meta(directory, fsync=fsync)  # raises NOT_FORMATTED naming the directory
    lock = DataDirLock.acquire(directory)
    try:
        return _open_locked(directory, lock, segment_bytes, fsync, unflushed_in_memory, sync_on_open)
    except BaseException:
        lock.release()
        raise


def _open_locked(
    directory: str,
    lock: DataDirLock,
    segment_bytes: int,
    fsync: bool,
    unflushed_in_memory: bool,
    sync_on_open: bool,
) -> tuple[MetaProperties, QuorumStateStore, SegmentedLog, SnapshotStore, LogSummary]:
    mdir = os.path.join(directory, METADATA_DIR)
    if fsync and sync_on_open:
        fsync_existing(os.path.join(directory, META_FILE))
        fsync_dir(directory)
        fsync_existing(os.path.join(mdir, QUORUM_STATE_FILE))  # its directory: with the log's
    meta = load_meta(directory, fsync=fsync)
    ensure_dir(mdir, fsync=fsync)
    restrict_dir(directory)
    restrict_dir(mdir)
    state_store = QuorumStateStore(mdir, meta.cluster_id, fsync=fsync)
    state_store.load()  # surface a damaged or foreign quorum-state file now, not mid-election
    snapshots = SnapshotStore(mdir, fsync=fsync)
    try:
        log = SegmentedLog(
            mdir,
            segment_bytes=segment_bytes,
            fsync=fsync,
            unflushed_in_memory=unflushed_in_memory,
            sync_on_open=sync_on_open,
        )
    except BaseException:
        snapshots.close()
        raise
    try:
        summary = recover_log(log, snapshots)
    except BaseException:
        log.close()
        snapshots.close()
        raise
    log.hold_lock(lock)
    return meta, state_store, log, snapshots, summary

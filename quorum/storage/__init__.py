"""Durable storage of a node: ``meta.properties`` (KIP-856 storage UUID), the quorum-state file
(KIP-856 QuorumStateData), the segmented log (KIP-595) and snapshots (KIP-630), each behind a
narrow interface with an in-memory twin (``quorum.storage.memory``).

Directory layout (``kraftkeeper format --dir DIR``)::

    DIR/meta.properties                              identity: cluster id, node id, storage UUID
    DIR/__cluster_metadata-0/quorum-state            epoch, leader, vote (JSON, replaced atomically)
    DIR/__cluster_metadata-0/<offset 20>.log         log segments
    DIR/__cluster_metadata-0/<offset 20>-<epoch 10>.checkpoint   snapshots

(``__cluster_metadata-0`` is the directory name Kafka's KRaft uses for the same data.)
"""

from __future__ import annotations

import os

from quorum.storage.atomic import atomic_write, ensure_dir, fsync_dir
from quorum.storage.base import LogStorage, QuorumStateStorage, SnapshotStorage
from quorum.storage.log import DEFAULT_SEGMENT_BYTES, SegmentedLog
from quorum.storage.memory import MemoryLog, MemoryQuorumStateStore, MemorySnapshotStore
from quorum.storage.meta import MetaProperties, format_dir, load_meta
from quorum.storage.quorum_state import QuorumStateStore
from quorum.storage.snapshot import SnapshotStore
from quorum.types import ErrorCode, KraftError, LogSummary

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "METADATA_DIR",
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
) -> tuple[MetaProperties, QuorumStateStore, SegmentedLog, SnapshotStore, LogSummary]:
    """Open a formatted data directory for the node runtime: identity, quorum state store (its
    file already validated), recovered log, snapshots, and the summary the core starts from.
    ``unflushed_in_memory``: the test-only power-loss mode of ``quorum.storage.segment``.

    Raises NOT_FORMATTED for a directory never formatted (KIP-856: the node must not start),
    CORRUPT_LOG naming the file for damage that recovery must not paper over."""
    meta = load_meta(directory, fsync=fsync)
    mdir = os.path.join(os.fspath(directory), METADATA_DIR)
    ensure_dir(mdir, fsync=fsync)
    state_store = QuorumStateStore(mdir, meta.cluster_id, fsync=fsync)
    state_store.load()  # surface a damaged or foreign quorum-state file now, not mid-election
    snapshots = SnapshotStore(mdir, fsync=fsync)
    try:
        log = SegmentedLog(
            mdir, segment_bytes=segment_bytes, fsync=fsync, unflushed_in_memory=unflushed_in_memory
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
    return meta, state_store, log, snapshots, summary

"""KIP-630 snapshots of the KV state machine: taking one (then letting the log start move past
it) and installing one a follower fetched from the leader."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from quorum.core.raft import RaftCore
from quorum.runtime.kv import KVStore
from quorum.runtime.metrics import Registry
from quorum.runtime.statemachine import Applier
from quorum.storage.base import LogStorage, SnapshotStorage
from quorum.types import KraftError, OffsetAndEpoch

__all__ = ["Snapshotter"]

log = logging.getLogger("kraftkeeper.node")


class Snapshotter:
    def __init__(
        self,
        core: RaftCore,
        store: SnapshotStorage,
        log_storage: LogStorage,
        applier: Applier,
        metrics: Registry,
        snapshot_bytes: int,
        wake: Callable[[], None],
    ) -> None:
        self.core = core
        self.store = store
        self.log = log_storage
        self.applier = applier
        self.metrics = metrics
        self.snapshot_bytes = snapshot_bytes
        self.wake = wake
        self.busy = False

    def due(self) -> bool:
        """Enough log applied since the last snapshot (``snapshot.max_bytes``) and none running."""
        return self.applier.bytes_since_snapshot >= self.snapshot_bytes and not self.busy

    async def take(self) -> None:
        """Snapshot the state machine at the applied offset, then let the log start move past
        it. The map is copied on the loop (cheap), serialized off it. A failure is logged and
        the log is kept (the next attempt comes with the next applied bytes)."""
        self.busy = True
        try:
            await self.take_or_raise()
        except Exception:
            log.exception("snapshot failed")
        finally:
            self.busy = False

    async def take_or_raise(self) -> OffsetAndEpoch:
        ap = self.applier
        sid = OffsetAndEpoch(ap.applied_end, ap.applied_epoch)
        controls = self.core.controls_at(sid.offset)
        copy = KVStore()
        copy.data = dict(ap.kv.data)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: self.store.write(sid, controls, copy.snapshot_chunks()))
        ap.bytes_since_snapshot = 0
        self.core.snapshot_taken(sid, sid.offset)
        self.log.delete_before(sid.offset)
        self.store.delete_older_than(sid)
        self.metrics.inc("snapshots", help="Snapshots taken")
        log.info("snapshot %s taken", sid)
        self.wake()
        return sid

    def write_chunk(self, sid: OffsetAndEpoch, position: int, data: bytes) -> None:
        if position == 0:
            self.store.begin_download(sid)
        self.store.write_chunk(sid, position, data)

    def install(self, sid: OffsetAndEpoch) -> None:
        """A fetched snapshot is complete: verify it, load it, reset the log to start at its
        end, tell the core (or tell it the snapshot was rejected)."""
        try:
            self.store.finish_download(sid)  # verifies every CRC before the rename
            controls, chunks = self.store.load(sid, verify_crc=False)
            self.applier.load_snapshot(sid, chunks)
        except KraftError as e:
            log.error("fetched snapshot %s rejected: %s", sid, e)
            self.core.snapshot_rejected(sid, str(e))
            return
        self.log.reset_to_snapshot(sid)
        self.core.snapshot_installed(sid, tuple(controls))
        log.info("installed snapshot %s", sid)

"""KIP-630 snapshots of the KV state machine: taking one, then letting the log start move past
it. (Installing a snapshot a follower fetched is the driver's work: ``quorum.driver``.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from quorum.core.raft import RaftCore
from quorum.runtime.kv import KVStore
from quorum.runtime.metrics import Registry
from quorum.runtime.statemachine import Applier
from quorum.storage.base import LogStorage, SnapshotStorage
from quorum.types import OffsetAndEpoch

__all__ = ["Snapshotter"]

log = logging.getLogger("kraftkeeper.node")

# A replica downloading a snapshot asks for its next chunk at once; this long without a chunk
# served, the download is over (or abandoned) and snapshots may be taken again.
DOWNLOAD_QUIET_MS = 5_000
# Deferring for a download stops here, so the log on disk stays bounded even if a replica
# keeps re-fetching: past this many times ``snapshot.max_bytes`` a snapshot is taken anyway.
DEFER_LIMIT = 8


class Snapshotter:
    def __init__(
        self,
        core: RaftCore,
        store: SnapshotStorage,
        log_storage: LogStorage,
        applier: Applier,
        position: Callable[[], OffsetAndEpoch],
        metrics: Registry,
        snapshot_bytes: int,
        wake: Callable[[], None],
    ) -> None:
        self.core = core
        self.store = store
        self.log = log_storage
        self.applier = applier
        self.position = position  # (applied end, its epoch): the driver's exact values
        self.metrics = metrics
        self.snapshot_bytes = snapshot_bytes
        self.wake = wake
        self.busy = False

    def due(self) -> bool:
        """Enough log applied since the last snapshot (``snapshot.max_bytes``) and none running,
        and no replica downloading the current one: a new snapshot would delete it (and the log
        before it) under the download, which would then start over."""
        applied = self.applier.bytes_since_snapshot
        if applied < self.snapshot_bytes or self.busy:
            return False
        downloading = self.core.snapshot_being_fetched(DOWNLOAD_QUIET_MS)
        return not downloading or applied >= DEFER_LIMIT * self.snapshot_bytes

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
        sid = self.position()
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

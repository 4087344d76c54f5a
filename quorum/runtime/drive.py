"""The node's Ready loop: pumps the pure core against real storage (the contract is in
``quorum/core/ready.py``).

One task owns the core's ``ready()`` / ``advance()``. RPC handlers, client requests and the
ticker step the core at any time and wake the loop. Group commit: the fsync (and the
quorum-state save) run in an executor, so requests keep arriving during it and the next Ready
carries a bigger batch. The leader's fast path (``core.appended``) sends Fetch answers for what
it just wrote before its own fsync, so followers fsync in parallel with it.

Invariants kept here:
* nothing in ``Ready.messages`` is sent before what it promises is durable (after the fsync);
* committed records are applied before the client waits complete (a write is acknowledged
  only once committed AND applied; a read is served only once its index is applied).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from quorum.core.raft import RaftCore
from quorum.core.ready import LeaderBatch, Ready
from quorum.runtime.metrics import Registry
from quorum.runtime.peers import Peers
from quorum.runtime.snapshots import Snapshotter
from quorum.runtime.statemachine import Applier
from quorum.runtime.tasks import Tasks
from quorum.runtime.unclean import verify_recovery
from quorum.runtime.view import NodeView
from quorum.runtime.waits import ClientWaits
from quorum.storage.base import LogStorage, QuorumStateStorage, SnapshotStorage
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch

__all__ = ["ReadyLoop", "StorageReader"]

log = logging.getLogger("kraftkeeper.node")


class StorageReader:
    """The core's ``LogReader``: the written log (flushed or not) and the snapshots.

    Serving unflushed batches is what Kafka's leader does: followers then fsync in parallel
    with the leader instead of after it. Safe because the high watermark counts the leader's
    own log end only once it is fsynced (``advance``) and a follower's fetch offset only once
    the follower has fsynced (it fetches again after its own flush)."""

    def __init__(self, log_storage: LogStorage, snapshots: SnapshotStorage) -> None:
        self.log = log_storage
        self.snapshots = snapshots

    def read(self, offset: int, max_bytes: int) -> bytes:
        if offset >= self.log.end_offset:
            return b""
        return self.log.read(offset, max_bytes)

    def read_snapshot(self, snapshot: OffsetAndEpoch, position: int, max_bytes: int) -> tuple[bytes, int]:
        return self.snapshots.read_chunk(snapshot, position, max_bytes)


class ReadyLoop:
    """Carries out the core's Ready in the documented order, forever (until ``stop``)."""

    def __init__(
        self,
        core: RaftCore,
        log_storage: LogStorage,
        qstore: QuorumStateStorage,
        peers: Peers,
        applier: Applier,
        snapshotter: Snapshotter,
        waits: ClientWaits,
        view: NodeView,
        metrics: Registry,
        tasks: Tasks,
        now_ms: Callable[[], int],
        wake_event: asyncio.Event,
    ) -> None:
        self.core = core
        self.log = log_storage
        self.qstore = qstore
        self.peers = peers
        self.applier = applier
        self.snapshotter = snapshotter
        self.waits = waits
        self.view = view
        self.metrics = metrics
        self.tasks = tasks
        self.now_ms = now_ms
        self.wake_event = wake_event  # set by anything that stepped the core
        self.stopping = False
        self.recovering = False  # a KIP-704 verification task is running
        self.busy_s = 0.0  # seconds spent handling Ready (poll-idle-ratio)

    def wake(self) -> None:
        self.wake_event.set()

    def stop(self) -> None:
        self.stopping = True
        self.wake_event.set()

    async def ticker(self, tick_ms: int) -> None:
        while not self.stopping:
            await asyncio.sleep(tick_ms / 1000)
            self.core.tick(self.now_ms())
            self.wake_event.set()

    async def run(self) -> None:
        while not self.stopping:
            await self.wake_event.wait()
            self.wake_event.clear()
            t0 = time.monotonic()
            try:
                progressed = await self.handle_ready()
            except KraftError as e:
                log.error("stopping: %s", e)
                raise
            self.busy_s += time.monotonic() - t0
            if progressed:
                self.wake_event.set()
                # Event.wait() returns without yielding when the event is already set: give
                # the handlers a turn so a busy core can never starve the network.
                await asyncio.sleep(0)

    async def handle_ready(self) -> bool:
        core = self.core
        rd: Ready = core.ready()
        if rd.is_empty():
            return False
        loop = asyncio.get_running_loop()
        self._write(rd)
        if rd.quorum_state is not None:
            await loop.run_in_executor(None, self.qstore.save, rd.quorum_state)
        if rd.append:
            # Fetch responses for what was just written go out before the leader's own fsync.
            for out in core.appended(self.log.end_offset, self.now_ms()):
                self.peers.dispatch(out)
        if rd.flush or rd.append:
            await loop.run_in_executor(None, self.log.flush)
        core.advance(rd, self.log.end_offset)
        for out in rd.messages:
            self.peers.dispatch(out)
        if rd.commit is not None:
            self._commit(rd.commit)
        self.waits.complete(rd.proposal_results, rd.reads, rd.admin_results)
        if rd.role_change is not None:
            self.view.publish(rd.role_change)
            if rd.role_change.election_latency_ms is not None:
                self.metrics.histogram("election_latency_seconds", "Time to elect a leader").observe(
                    rd.role_change.election_latency_ms / 1000
                )
        if rd.recovery_needed and not self.recovering:
            self.recovering = True
            self.tasks.spawn(self._recover())
        for e in rd.errors:
            log.warning("%s", e)
        return True

    def _write(self, rd: Ready) -> None:
        """Steps 1-3: truncate, snapshot chunks / install, append (into the page cache)."""
        if rd.truncate_to is not None:
            if self.applier.applied_end > rd.truncate_to:  # pragma: no cover - never truncates committed
                raise KraftError(
                    ErrorCode.CORRUPT_LOG,
                    f"truncation to {rd.truncate_to} below applied {self.applier.applied_end}",
                )
            self.log.truncate_to(rd.truncate_to)
        for ch in rd.snapshot_chunks:
            self.snapshotter.write_chunk(ch.snapshot_id, ch.position, ch.data)
        if rd.install_snapshot is not None:
            self.snapshotter.install(rd.install_snapshot)
        for b in rd.append:
            if isinstance(b, LeaderBatch):
                data = b.encode()
                self.log.append_batches(data, [b.info(len(data))])
                records = b.count
            else:
                data = b.data
                self.log.append_batches(data, list(b.infos))
                records = b.next_offset - b.base_offset
            self.metrics.inc("append-records", records, help="Records appended to the local log")
            self.metrics.inc("append-bytes", len(data), help="Bytes appended to the local log")

    def _commit(self, hw: int) -> None:
        self.view.high_watermark = max(self.view.high_watermark, hw)
        self.applier.apply_to(hw)
        if self.snapshotter.due():
            self.snapshotter.busy = True  # before the task starts: one snapshot at a time
            self.tasks.spawn(self.snapshotter.take())

    async def _recover(self) -> None:
        try:
            await verify_recovery(self.core, self.applier, self.snapshotter, self.now_ms)
        finally:
            self.recovering = False

"""The node's parts adapted to the driver's ports (``quorum.driver.ports``).

* :class:`CountingLog`: the segmented log as the driver's ``LogPort``, counting what is
  appended for the ``append-records`` / ``append-bytes`` metrics;
* :class:`NodeSink`: where the driver reports what it carried out: client completions go to the
  waiting futures, the role to the published view, applied progress to linearizable reads and
  the snapshot policy, ``recovery_needed`` to the KIP-704 verification task.

Everything here runs on the event loop except ``CountingLog.flush`` (the driver's persist
phase, in an executor).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from quorum.core.ready import AdminResult, ProposalResult, ReadResult, RoleChange
from quorum.runtime.metrics import Registry
from quorum.runtime.snapshots import Snapshotter
from quorum.runtime.statemachine import Applier
from quorum.runtime.tasks import Tasks
from quorum.runtime.view import NodeView
from quorum.runtime.waits import ClientWaits
from quorum.storage.base import LogStorage
from quorum.types import BatchInfo, ControlRecord, OffsetAndEpoch

__all__ = ["CountingLog", "NodeSink"]

log = logging.getLogger("kraftkeeper.node")


class CountingLog:
    """``LogPort`` over a :class:`~quorum.storage.base.LogStorage`, counting appends."""

    def __init__(self, inner: LogStorage, metrics: Registry) -> None:
        self.inner = inner
        self.metrics = metrics

    @property
    def end_offset(self) -> int:
        return self.inner.end_offset

    @property
    def flushed_end_offset(self) -> int:
        return self.inner.flushed_end_offset

    def _count(self, records: int, size: int) -> None:
        self.metrics.inc("append-records", records, help="Records appended to the local log")
        self.metrics.inc("append-bytes", size, help="Bytes appended to the local log")

    def append(
        self,
        base_offset: int,
        epoch: int,
        items: Sequence[bytes] | Sequence[ControlRecord],
        append_time_ms: int | None = None,
    ) -> BatchInfo:
        info = self.inner.append(base_offset, epoch, items, append_time_ms)
        self._count(info.count, info.size_bytes)
        return info

    def append_batches(self, data: bytes | memoryview, infos: Sequence[BatchInfo]) -> None:
        self.inner.append_batches(data, infos)
        if infos:
            self._count(infos[-1].next_offset - infos[0].base_offset, len(data))

    def flush(self) -> None:
        self.inner.flush()

    def truncate_to(self, end_offset: int) -> None:
        self.inner.truncate_to(end_offset)

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        return self.inner.read(offset, max_bytes, max_offset)

    def reset_to_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        self.inner.reset_to_snapshot(snapshot_id)


class NodeSink:
    """The driver's ``Sink`` for one node."""

    def __init__(
        self,
        waits: ClientWaits,
        view: NodeView,
        applier: Applier,
        snapshotter: Snapshotter,
        metrics: Registry,
        tasks: Tasks,
        verify_recovery: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        self.waits = waits
        self.view = view
        self.applier = applier
        self.snapshotter = snapshotter
        self.tasks = tasks
        self.verify_recovery = verify_recovery
        self.recovering = False  # a KIP-704 verification task is running
        self._election = metrics.histogram("election_latency_seconds", "Time to elect a leader")

    def proposal_done(self, result: ProposalResult) -> None:
        self.waits.proposal_done(result)

    def read_done(self, result: ReadResult) -> None:
        self.waits.read_done(result)

    def admin_done(self, result: AdminResult) -> None:
        self.waits.admin_done(result)

    def role_changed(self, view: RoleChange) -> None:
        self.view.publish(view)
        if view.election_latency_ms is not None:
            self._election.observe(view.election_latency_ms / 1000)

    def applied(self, applied_end: int, applied_epoch: int) -> None:
        self.applier.advanced(applied_end, applied_epoch)
        if self.snapshotter.due():
            self.snapshotter.busy = True  # before the task starts: one snapshot at a time
            self.tasks.spawn(self.snapshotter.take())

    def recovery_needed(self) -> None:
        if not self.recovering:
            self.recovering = True
            self.tasks.spawn(self._recover())

    async def _recover(self) -> None:
        try:
            await self.verify_recovery()
        finally:
            self.recovering = False

    def note(self, message: str) -> None:
        log.warning("%s", message)

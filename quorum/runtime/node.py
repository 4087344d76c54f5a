"""The node: one replica's storage, pure core (``quorum.core``), state machine and peers,
driven by the one driver (``quorum.driver``) behind the :class:`~quorum.runtime.api.NodeApi`
the HTTP server calls.

This module is the facade and the wiring; the work is in the seams: ``quorum.driver`` (the
Ready contract: storage writes, fsync in an executor while RPCs keep stepping the core, i.e.
group commit, persist-before-send, apply-after-commit), ``peers`` (RPCs through a
``transport.Transport``), ``ports`` (the node's parts as the driver's ports), ``waits``
(client futures), ``statemachine`` (the KV store, linearizable reads), ``snapshots``
(KIP-630), ``unclean`` (KIP-704 verification), ``view`` (the published role and leader).
``run.py`` builds the transport and the HTTP server.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from quorum.core.raft import RaftCore
from quorum.core.roles import Leader
from quorum.driver import AsyncRunner, Driver, Ports, StorageReader, load_latest_snapshot
from quorum.runtime import kv as kvmod
from quorum.runtime import wire
from quorum.runtime.config import NodeConfig
from quorum.runtime.metrics import Registry
from quorum.runtime.observe import Observer
from quorum.runtime.peers import InboundCheck, Peers
from quorum.runtime.ports import CountingLog, NodeSink
from quorum.runtime.snapshots import Snapshotter
from quorum.runtime.statemachine import Applier
from quorum.runtime.tasks import Tasks
from quorum.runtime.transport import Transport
from quorum.runtime.unclean import verify_recovery
from quorum.runtime.view import Clock, NodeView
from quorum.runtime.waits import ClientWaits
from quorum.storage import open_storage
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch, ReplicaKey

__all__ = ["Node"]

log = logging.getLogger("kraftkeeper.node")


class Node:
    """One replica. ``run(stop)`` drives it until ``stop`` is set; ``close()`` then closes its
    storage (after the server stopped calling it)."""

    def __init__(
        self,
        data_dir: str,
        listen: str,
        voters: dict[int, str],
        cfg: NodeConfig,
        transport: Transport,
        advertise: str | None = None,
        inbound_check: InboundCheck | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.listen = listen
        self.advertise = advertise or listen
        self.cfg = cfg
        self.meta, self.qstore, self.log, self.snapshots, summary = open_storage(
            data_dir, segment_bytes=cfg.segment_bytes, fsync=cfg.fsync, **cfg.log_options()
        )
        self.local = ReplicaKey(self.meta.node_id, self.meta.storage_uuid)
        self.metrics = Registry()
        self.clock = Clock()
        self.applier = Applier()
        applied_end, applied_epoch = load_latest_snapshot(self.snapshots, summary, self.applier)
        self.applier.advanced(applied_end, applied_epoch)
        self.core_config = cfg.core_config(voters, self.advertise, self.meta.initial_bootstrap)
        self.core = RaftCore(
            self.core_config,
            self.local,
            self.meta.cluster_id,
            self.qstore.load(self.meta.cluster_id),
            summary,
            StorageReader(self.log, self.snapshots),
            random.Random(),
            self.clock.now_ms(),
        )
        self.view = NodeView.restored(self.local.id, self.core)
        self.tasks = Tasks()
        self.waits = ClientWaits(self.view, self.metrics)
        self.peers = Peers(
            self.core,
            transport,
            self.tasks,
            self.metrics,
            self.clock.now_ms,
            self._wake,
            self.core_config.request_timeout_ms,
            inbound_check,
        )
        self.driver, self.runner = self._build_driver(applied_end, applied_epoch)
        self.observer = Observer(
            self.node_id, self.core, self.driver, self.runner, self.applier, self.metrics
        )

    def _build_driver(self, applied_end: int, applied_epoch: int) -> tuple[Driver, AsyncRunner]:
        """The one driver (``quorum.driver``) over this node's parts as its ports."""
        self.snapshotter = Snapshotter(
            self.core,
            self.snapshots,
            self.log,
            self.applier,
            lambda: OffsetAndEpoch(self.driver.applied_end, self.driver.applied_epoch),
            self.metrics,
            self.cfg.snapshot_bytes,
            self._wake,
        )
        sink = NodeSink(
            self.waits,
            self.view,
            self.applier,
            self.snapshotter,
            self.metrics,
            self.tasks,
            lambda: verify_recovery(self.core, self.log, self.applier, self.snapshotter, self.clock.now_ms),
        )
        ports = Ports(
            log=CountingLog(self.log, self.metrics),
            quorum_state=self.qstore,
            snapshots=self.snapshots,
            transport=self.peers,
            clock=self.clock,
            state_machine=self.applier,
            sink=sink,
        )
        driver = Driver(self.core, ports, applied_end, applied_epoch)
        return driver, AsyncRunner(driver, tick_ms=self.cfg.tick_ms)

    def _wake(self) -> None:
        self.runner.wake()

    @property
    def node_id(self) -> int:
        return self.local.id

    # ---- lifecycle --------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Drive the node until ``stop``; a driver failure is re-raised (the process exits
        non-zero: a node never serves with a dead loop)."""
        log.info(
            "node %s (%s) listening on %s, advertising %s",
            self.node_id,
            self.local.uuid,
            self.listen,
            self.advertise,
        )
        runner_stop = asyncio.Event()
        runner_task = asyncio.create_task(self.runner.run(runner_stop))
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([runner_task, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not runner_task.done():
                await self._graceful_shutdown()
            runner_stop.set()
            await runner_task
        finally:
            self.peers.stopping = True
            runner_stop.set()
            stopped.cancel()
            await self.tasks.cancel_all()
            await asyncio.gather(runner_task, stopped, return_exceptions=True)

    async def _graceful_shutdown(self) -> None:
        """KIP-595: a leader resigning on shutdown sends EndQuorumEpoch with its preferred
        successors so the next election starts at once instead of after a fetch timeout.
        Anything else (a follower's Fetch long-poll, up to ``fetch_max_wait_ms``) is not waited
        for: its answer is not needed, and the process's end is what a replaced disk's new pod
        waits for (the StatefulSet re-creates a pod only once the old one is gone)."""
        leading = isinstance(self.core.role, Leader)
        try:
            self.core.shutdown(self.clock.now_ms())
        except Exception:  # shutting down anyway: log it, do not mask the stop
            log.exception("resign on shutdown failed")
            return
        if not leading:
            return  # run() cancels the outstanding requests
        self._wake()
        # Let the EndQuorumEpoch requests go out (bounded: peers may be down).
        await asyncio.sleep(0.05)
        await self.tasks.wait(1.0)

    def close(self) -> None:
        """Flush and close the log (a clean shutdown loses nothing)."""
        self.log.close()

    # ---- client API ---------------------------------------------------------------------------
    def _check(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except KraftError as e:
            if e.code is ErrorCode.NOT_LEADER:
                raise self.view.error(e.code, e.message) from None
            raise

    async def _write(self, record: bytes) -> int:
        last = self._check(lambda: self.core.propose([record], self.clock.now_ms()))
        self.runner.wake()
        await self.waits.write(last, self.cfg.write_timeout_ms / 1000)
        self.metrics.inc("committed_writes", help="Client writes committed")
        return int(last)

    async def put(self, key: str, value: bytes) -> int:
        return await self._write(kvmod.encode_put(key, value))

    async def delete(self, key: str) -> int:
        return await self._write(kvmod.encode_delete(key))

    async def get(self, key: str) -> bytes | None:
        """Linearizable: the core confirms leadership with a majority after the call (read
        index), then the read waits until the state machine applied that index."""
        kvmod.check_key(key)
        rid = self.waits.next_id()
        fut = self.waits.read_future(rid)
        try:
            self._check(lambda: self.core.read_index(rid, self.clock.now_ms()))
            self._wake()
            timeout = self.cfg.write_timeout_ms / 1000
            index = await asyncio.wait_for(fut, timeout)
            await self.applier.wait_applied(index, timeout)
        except TimeoutError:
            raise KraftError(
                ErrorCode.REQUEST_TIMED_OUT, "leadership could not be confirmed in time"
            ) from None
        finally:
            self.waits.drop_read(rid)
        return self.applier.kv.get(key)

    async def handle_rpc(
        self, path: str, body: bytes, peer: object | None = None, decoded: object | None = None
    ) -> bytes | wire.Frame:
        return await self.peers.handle_rpc(path, body, peer, decoded)

    # ---- admin --------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Only the leader knows every replica's progress (KIP-595 DescribeQuorum goes to the
        leader); other nodes answer NOT_LEADER with the hint."""
        if self.view.role != "leader":
            raise self.view.error(ErrorCode.NOT_LEADER)
        d: dict[str, Any] = self.core.describe(self.clock.now_ms())
        return d

    async def _admin_call(self, start: Callable[[int], Any]) -> None:
        rid = self.waits.next_id()
        fut = self.waits.admin_future(rid)
        try:
            self._check(lambda: start(rid))
            self._wake()
            limit = (self.core_config.add_voter_timeout_ms + self.core_config.request_timeout_ms) / 1000
            await asyncio.wait_for(fut, limit)
        except TimeoutError:
            raise KraftError(ErrorCode.REQUEST_TIMED_OUT, "voter change not completed in time") from None
        finally:
            self.waits.drop_admin(rid)

    def _voters_view(self) -> dict[str, Any]:
        try:
            d = self.core.describe(self.clock.now_ms())
            return {"voters": [{"id": v["id"], "uuid": v["uuid"]} for v in d.get("voters", [])]}
        except KraftError:
            return {}

    async def add_voter(self, vid: int, uuid: str) -> dict[str, Any]:
        key = ReplicaKey(vid, uuid)
        await self._admin_call(lambda rid: self.core.add_voter(rid, key, self.clock.now_ms()))
        return self._voters_view()

    async def remove_voter(self, vid: int, uuid: str) -> dict[str, Any]:
        key = ReplicaKey(vid, uuid)
        await self._admin_call(lambda rid: self.core.remove_voter(rid, key, self.clock.now_ms()))
        return self._voters_view()

    async def reassign(self, ids: list[int] | None) -> dict[str, Any]:
        target = None if ids is None else tuple(ids)
        ls = self.core.leader_state()
        if target is not None and ls is not None:
            # A target id must be a voter or an observer the leader knows to be caught
            # up, so a reassignment cannot name replicas that do not exist ({"voters": [10**30]}).
            voters = self.core.voters().ids()
            ready = {k.id for k in ls.progress if self.core.caught_up(ls, k)}
            unknown = [i for i in target if i not in voters and i not in ready]
            if unknown:
                raise KraftError(
                    ErrorCode.REPLICA_NOT_CAUGHT_UP,
                    f"reassign: replica(s) {unknown} are neither voters nor caught-up observers",
                )
        await self._admin_call(lambda rid: self.core.reassign(rid, target, self.clock.now_ms()))
        return {"target_voters": ids, **self._voters_view()}

    # ---- observability ------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]:
        return self.observer.health()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return self.view.readiness()

    def log_state(self) -> dict[str, Any]:
        """What Raft's election compares, for choosing an unclean-recovery survivor:
        the local log's last batch epoch and end offset, plus this node's view. No storage
        UUID (nothing that helps impersonation is served unauthenticated)."""
        v = self.view
        return {
            "node_id": self.node_id,
            "last_epoch": self.log.last_epoch,
            "end_offset": self.log.end_offset,
            "high_watermark": self.core.high_watermark,
            "role": v.role,
            "leader_id": v.leader_id,
            "epoch": v.epoch,
        }

    def metrics_text(self) -> str:
        return self.observer.metrics_text()

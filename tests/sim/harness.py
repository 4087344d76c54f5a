"""Seeded, deterministic simulation of N replicas, each a real ``RaftCore`` carried out by the
real driver (``quorum.driver``) over the in-memory storage (``quorum.storage.memory``).

What it models: a network (delay, drop, duplicate, partitions, refused connections); fsyncs
that take time, during which arriving messages keep stepping the core (``interleave``: the
node's executor fsync); process crashes (``kill_many``: the process dies, also in the middle of
an fsync, and its unsynced writes stay in the page cache for the next process to find);
power loss on any subset of nodes at once, running or already dead (``MemoryLog.crash``: all
that was not synced is gone, and so is a quorum-state save a crash interrupted); disk
replacements (a node returns with an empty directory and a new storage UUID); a small KV state
machine. ``sync_on_open=False`` restarts processes without ``open_storage``'s fsync of what
they find, the hole that fsync closes, so a test can show the checks see it.

The invariants of :mod:`tests.sim.checks` are checked after every event; a violation
raises ``InvariantError`` naming the invariant, the seed and the simulated time. Everything is
drawn from one ``random.Random(seed)``: ``SIM_SEED=N pytest tests/sim`` reruns a seed.

``core_cls`` lets a test run the pre-fix core (``tests.core.old_core``) to show that the
checks find the Fetch-offset durability hole.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from quorum.core.config import CoreConfig
from quorum.core.messages import Message, RpcFailed, is_request
from quorum.core.raft import RaftCore
from quorum.driver import Driver, Ports, StorageReader, load_latest_snapshot
from quorum.driver.memory import DictStateMachine
from quorum.storage import recover_log
from quorum.storage.memory import MemoryLog, MemoryQuorumStateStore, MemorySnapshotStore
from quorum.types import OffsetAndEpoch
from tests.sim.checks import CLUSTER, Checks, InvariantError
from tests.sim.clients import ClientOps
from tests.sim.nodes import (
    Delivery,
    Node,
    SimClock,
    SimQuorumState,
    SimSink,
    SimTransport,
    counting,
    uuid_for,
)

__all__ = ["CLUSTER", "InvariantError", "Sim"]


class Sim(Checks, ClientOps):
    crash_points = False  # power loss also at fsync completion (chaos runs)
    kill_points = 0.0  # chance of a process crash at each fsync completion instead

    def __init__(
        self,
        seed: int,
        voters: int = 3,
        spares: int = 0,
        drop: float = 0.0,
        duplicate: float = 0.0,
        pre_vote: bool = True,
        snapshot_every: int = 0,
        config: dict[str, Any] | None = None,
        interleave: bool = True,
        fsync_ms: int = 25,
        core_cls: type[RaftCore] = RaftCore,
        sync_on_open: bool = True,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.step_ms = 10
        self.drop = drop
        self.duplicate = duplicate
        self.snapshot_every = snapshot_every
        self.interleave = interleave
        self.fsync_ms = fsync_ms
        self.core_cls = counting(core_cls)
        self.sync_on_open = sync_on_open
        bootstrap = {i: f"node{i}:9000" for i in range(1, voters + 1)}
        self.base_config = dict(
            bootstrap_voters=bootstrap,
            election_timeout_ms=300,
            election_backoff_max_ms=300,
            fetch_timeout_ms=600,
            request_timeout_ms=600,
            fetch_max_wait_ms=200,
            catch_up_recent_ms=600,
            add_voter_timeout_ms=5000,
            pre_vote=pre_vote,
            fetch_max_bytes=64 * 1024,
        )
        self.base_config.update(config or {})
        self.nodes: dict[int, Node] = {}
        for i in range(1, voters + spares + 1):
            self.nodes[i] = Node(i, uuid_for(self.rng))
            self.set_open_rule(self.nodes[i])
        self.net: list[Delivery] = []
        self.persists: list[tuple[int, int, int, int]] = []  # (at, seq, node id, incarnation)
        self.seq = 0
        self.blocked: set[frozenset[int]] = set()
        self.scheduled: list[tuple[int, int, Callable[[], None]]] = []
        self.proposals: dict[tuple[int, str, int, int], list[str]] = {}
        self.reads: dict[int, int] = {}
        self.read_seq = 0
        self.admin_results: dict[int, Any] = {}
        self.admin_seq = 0
        self.client_seq = 0
        self.errors: list[str] = []
        self.trace: list[str] = []
        self.recovery_needed: set[int] = set()
        self.init_checks()
        for n in self.nodes.values():
            self.start(n)

    # ------------------------------------------------------------------ lifecycle

    def config_for(self, n: Node) -> CoreConfig:
        return CoreConfig(local_endpoint=n.endpoint, initial_bootstrap=n.initial, **self.base_config)  # type: ignore[arg-type]

    def set_open_rule(self, n: Node) -> None:
        n.log.sync_on_open = n.qstore.sync_on_open = self.sync_on_open

    def start(self, n: Node) -> None:
        n.incarnation += 1
        n.inbound.clear()
        n.pending = None
        n.log.reopen()
        n.qstore.reopen()
        summary = recover_log(n.log, n.snapshots)
        n.sm = DictStateMachine()
        applied_end, applied_epoch = load_latest_snapshot(n.snapshots, summary, n.sm)
        n.applied = applied_end
        qs = n.qstore.load()
        n.persisted_epoch = qs.leader_epoch
        n.core = self.core_cls(
            self.config_for(n),
            n.key,
            CLUSTER,
            qs,
            summary,
            StorageReader(n.log, n.snapshots),
            random.Random(self.rng.getrandbits(32)),
            self.now,
        )
        ports = Ports(
            n.log,
            SimQuorumState(n),
            n.snapshots,
            SimTransport(self, n),
            SimClock(self),
            n.sm,
            SimSink(self, n),
        )
        n.driver = Driver(n.core, ports, applied_end, applied_epoch)
        n.last_hw_seen = n.core.hw
        self.pump(n)

    def crash(self, n: Node) -> None:
        """Power loss: the process dies and everything not fsynced is gone."""
        self.crash_many([n])

    def crash_many(self, nodes: list[Node]) -> None:
        """Power loss on several nodes at the same instant. A node whose process is already
        dead (``kill_many``) loses what its page cache still held."""
        for n in nodes:
            if n.core is None and n.log.end_offset == n.log.synced_end_offset:
                continue
            state = "down, " if n.core is None else ""
            during = " during fsync" if n.pending is not None else ""
            synced = f"synced to {n.log.synced_end_offset} of {n.log.end_offset}"
            self.note(f"power loss {n.key} ({state}{synced}){during}")
            if n.log.end_offset > n.log.synced_end_offset:
                self.cuts_with_unsynced += 1
            n.core, n.driver, n.pending = None, None, None
            n.log.crash()
            n.qstore.crash()
            n.snapshots.crash()
        self.check_acked_durable()

    def kill_many(self, nodes: list[Node]) -> None:
        """Process crash (SIGKILL, OOM kill) of several nodes: nothing on disk is lost, and
        what was written but not synced stays in the page cache. A node killed while its
        persist ran had done the writes of that persist, not its fsync: the fetched batches
        are in the log, and a quorum-state save may have been renamed into place without its
        directory fsync."""
        for n in nodes:
            p = n.pending
            if n.core is None:
                continue
            self.note(f"process crash {n.key}" + (" during fsync" if p is not None else ""))
            if p is not None:
                for b in p.raw:
                    n.log.append_batches(b.data, b.infos)
                if p.quorum_state is not None and self.rng.random() < 0.5:
                    n.qstore.save_interrupted(p.quorum_state)
            if n.log.end_offset > n.log.synced_end_offset:
                self.kills_with_unsynced += 1
            n.core, n.driver, n.pending = None, None, None
            n.snapshots.crash()  # a download in progress starts again (its .part is deleted on open)

    def replace_disk(self, n: Node) -> str:
        """The node loses its directory and comes back formatted with a new storage UUID."""
        self.crash(n)
        self.retired.append(replace(n))
        n.uuid = uuid_for(self.rng)
        n.log = MemoryLog()
        n.qstore = MemoryQuorumStateStore(CLUSTER)
        n.snapshots = MemorySnapshotStore()
        self.set_open_rule(n)
        n.last_epoch_seen = 0
        n.initial = False
        self.note(f"replace disk of node {n.id}: new uuid {n.uuid}")
        self.start(n)
        return n.uuid

    def reattach_old_disk(self, n: Node) -> None:
        """The disk node ``n`` lost comes back (an operator re-attaches the old volume): the
        node restarts under its OLD (id, UUID) with the old log and its stale voter set."""
        old = next(r for r in reversed(self.retired) if r.id == n.id)
        self.crash(n)
        n.uuid, n.log, n.qstore, n.snapshots = old.uuid, old.log, old.qstore, old.snapshots
        n.initial = old.initial
        n.last_epoch_seen = 0
        self.note(f"re-attach the old disk of node {n.id}: uuid {n.uuid}")
        self.start(n)

    def note(self, s: str) -> None:
        self.trace.append(f"t={self.now} {s}")
        if len(self.trace) > 400:
            del self.trace[:200]

    # ------------------------------------------------------------------ the driver

    def pump(self, n: Node) -> None:
        """Carry out the node's Readies until it is idle or an fsync is in flight; while one
        is, send what needs no persist (``Driver.send_now``, as the node's runner does)."""
        for _ in range(200):
            core, driver = n.core, n.driver
            if core is None or driver is None:
                return
            if n.pending is not None:
                driver.send_now()
                return
            r = core.ready()
            if r.is_empty():
                self.check_published(n)
                return
            if r.append and not r.flush:
                self.deferred_fsyncs += 1
            p = driver.begin(r)
            if p.needs_persist and self.interleave:
                n.pending = p
                self.seq += 1
                at = self.now + self.rng.randint(1, self.fsync_ms)
                heapq.heappush(self.persists, (at, self.seq, n.id, n.incarnation))
                return
            if p.needs_persist:
                driver.persist(p)
            driver.finish(p)
        self.fail("driver-progress", f"node {n.id} produced Ready forever")

    def complete_persist(self, n: Node) -> None:
        p, driver = n.pending, n.driver
        if p is None or driver is None:
            return
        if self.crash_points and self.rng.random() < 0.002:
            self.crash(n)  # before the fsync completed: its batches and state save are lost
            self.at(self.rng.randint(100, 2000), lambda: self.restart(n))
            return
        if self.kill_points and self.rng.random() < self.kill_points:
            self.kill_many([n])  # its writes are in the page cache, unsynced
            self.at(self.rng.randint(100, 2000), lambda: self.restart(n))
            return
        n.pending = None
        driver.persist(p)
        driver.finish(p)
        self.pump(n)

    def restart(self, n: Node) -> None:
        if n.core is None:
            self.note(f"restart node {n.id}")
            self.start(n)

    # ------------------------------------------------------------------ network

    def send(self, n: Node, dest: int, msg: Message) -> None:
        if is_request(msg):
            copies = 2 if self.rng.random() < self.duplicate else 1
            for _ in range(copies):
                self._enqueue(n.id, dest, msg)
        else:
            # A response: map the node-local correlation id back to the requester's.
            src_corr = n.inbound.pop(msg.correlation_id, None)
            if src_corr is None:
                return
            requester, orig = src_corr
            self._enqueue(n.id, requester, replace(msg, correlation_id=orig))

    def _enqueue(self, src: int, dest: int, msg: Message) -> None:
        if frozenset((src, dest)) in self.blocked or self.rng.random() < self.drop or dest not in self.nodes:
            if is_request(msg) and self.rng.random() < 0.5:
                # connection refused: the sender's transport reports it quickly
                self.seq += 1
                failed = RpcFailed(msg.correlation_id, dest, "unreachable")
                heapq.heappush(
                    self.net, Delivery(self.now + 5, self.seq, src, src, self.nodes[src].incarnation, failed)
                )
            return
        self.seq += 1
        delay = self.rng.randint(1, 15)
        inc = self.nodes[dest].incarnation
        heapq.heappush(self.net, Delivery(self.now + delay, self.seq, dest, src, inc, msg))

    def process_events(self) -> None:
        """Deliveries and fsync completions due by now, in time order."""
        while True:
            d_at = self.net[0].at if self.net else None
            p_at = self.persists[0][0] if self.persists else None
            if p_at is not None and p_at <= self.now and (d_at is None or p_at <= d_at):
                _at, _s, nid, inc = heapq.heappop(self.persists)
                n = self.nodes[nid]
                if n.incarnation == inc and n.core is not None:
                    self.complete_persist(n)
                    self.check(n)
            elif d_at is not None and d_at <= self.now:
                self.deliver(heapq.heappop(self.net))
            else:
                return

    def deliver(self, d: Delivery) -> None:
        n = self.nodes[d.dest]
        if n.core is None or d.incarnation != n.incarnation:
            return
        msg = d.message
        if is_request(msg):
            n.next_in += 1
            n.inbound[n.next_in] = (d.src, msg.correlation_id)
            msg = replace(msg, correlation_id=n.next_in)
        n.core.step(msg, self.now)  # also while an fsync is in flight: the next Ready's
        self.pump(n)
        self.check(n)

    # ------------------------------------------------------------------ time

    def run(self, ms: int, action: Callable[[Sim], None] | None = None) -> None:
        end = self.now + ms
        while self.now < end:
            self.now += self.step_ms
            self.process_events()
            for n in self.nodes.values():
                if n.core is not None:
                    n.core.tick(self.now)
                    self.pump(n)
                    self.check(n)
            while self.scheduled and self.scheduled[0][0] <= self.now:
                _t, _s, fn = heapq.heappop(self.scheduled)
                fn()
            if action is not None:
                action(self)
            if self.snapshot_every:
                self.maybe_snapshot()
            self.check_acked_durable()

    def at(self, delay_ms: int, fn: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.scheduled, (self.now + delay_ms, self.seq, fn))

    def heal(self) -> None:
        self.blocked.clear()
        self.drop = 0.0
        for n in self.nodes.values():
            if n.core is None:
                self.start(n)

    def maybe_snapshot(self) -> None:
        for n in self.nodes.values():
            core, driver = n.core, n.driver
            if (
                core is None
                or driver is None
                or driver.applied_end - n.log.log_start_offset < self.snapshot_every
            ):
                continue
            if self.rng.random() > 0.05:
                continue
            off = min(driver.applied_end, core.hw)
            latest = n.snapshots.latest()
            if off <= (latest.offset if latest is not None else 0):
                continue
            # The state machine holds exactly the applied prefix (the driver applies in order).
            sid = OffsetAndEpoch(off, core.epoch_at(off - 1))
            n.snapshots.write(sid, core.controls_at(off), n.sm.snapshot_chunks())
            n.log.delete_before(off)
            core.snapshot_taken(sid, min(n.log.log_start_offset, off))
            n.snapshots.delete_older_than(sid)
            self.note(f"node {n.id} snapshot {sid} log start {n.log.log_start_offset}")

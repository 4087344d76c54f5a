"""Seeded, deterministic simulation of N RaftCore replicas (tests/sim).

Real ``RaftCore`` instances with an in-memory log (``quorum.core.memlog.MemoryLog``, which
loses unflushed batches on a crash), a simulated network (delay, drop, duplicate, partitions),
crashes / restarts, disk replacements (a node returns with an empty log and a new storage UUID)
and a tiny KV state machine applying committed records. After every step, named invariants are
checked (``check_invariants``); a violation raises ``InvariantError`` naming the invariant, the
seed and the simulated time. Everything is driven by one ``random.Random(seed)``: a failing
seed reruns identically with ``SIM_SEED=N pytest tests/sim``.
"""

from __future__ import annotations

import heapq
import json
import random
import uuid as _uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from quorum.core.config import CoreConfig
from quorum.core.memlog import MemoryLog
from quorum.core.messages import Message, RpcFailed, is_request
from quorum.core.raft import RaftCore
from quorum.core.ready import Ready
from quorum.records import decode_control, encode_control
from quorum.types import (
    AddVoter,
    ControlRecord,
    KraftError,
    LeaderRecovery,
    OffsetAndEpoch,
    QuorumState,
    RemoveVoter,
    ReplicaKey,
)

CLUSTER = "sim-cluster"


class InvariantError(AssertionError):
    pass


def uuid_for(rng: random.Random) -> str:
    return str(_uuid.UUID(int=rng.getrandbits(128), version=4))


@dataclass
class Node:
    id: int
    uuid: str
    log: MemoryLog = field(default_factory=MemoryLog)
    qs: QuorumState = field(default_factory=lambda: QuorumState(CLUSTER))
    core: RaftCore | None = None
    kv: dict[str, str] = field(default_factory=dict)
    applied: int = 0
    inbound: dict[int, tuple[int, int]] = field(default_factory=dict)  # local corr -> (src, orig corr)
    next_in: int = 0
    incarnation: int = 0
    last_epoch_seen: int = 0
    last_hw_seen: int = 0
    initial: bool = True  # formatted for the new cluster (False: a replacement disk)

    @property
    def key(self) -> ReplicaKey:
        return ReplicaKey(self.id, self.uuid)

    @property
    def endpoint(self) -> str:
        return f"node{self.id}:9000"


@dataclass(order=True)
class Delivery:
    at: int
    seq: int
    dest: int = field(compare=False)
    src: int = field(compare=False)
    incarnation: int = field(compare=False)  # of the destination when sent (requests) or of the sender
    message: Message = field(compare=False)


class Sim:
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
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.step_ms = 10
        self.drop = drop
        self.duplicate = duplicate
        self.snapshot_every = snapshot_every
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
        self.net: list[Delivery] = []
        self.seq = 0
        self.blocked: set[frozenset[int]] = set()
        # invariant state
        self.leaders: dict[int, ReplicaKey] = {}
        self.committed: dict[int, tuple[int, str]] = {}
        self.committed_end = 0
        self.committed_voters: list[tuple[int, frozenset[ReplicaKey]]] = []
        self.cv_current: frozenset[ReplicaKey] | None = None
        self.cv_batch: tuple[int, frozenset[ReplicaKey] | None, bool] | None = None
        self.proposals: dict[tuple[int, str, int, int], list[str]] = {}
        self.acked_writes: dict[str, int] = {}
        self.max_acked = 0
        self.reads: dict[int, int] = {}
        self.read_seq = 0
        self.read_results: list[tuple[int, int]] = []
        self.admin_results: dict[int, Any] = {}
        self.admin_seq = 0
        self.client_seq = 0
        self.errors: list[str] = []
        self.trace: list[str] = []
        self.scheduled: list[tuple[int, int, Callable[[], None]]] = []
        self.recovery_needed: set[int] = set()
        self.unclean = False  # set by an unclean recovery: committed data may be lost on purpose
        for n in self.nodes.values():
            self.start(n)

    # ------------------------------------------------------------------ lifecycle

    def config_for(self, n: Node) -> CoreConfig:
        return CoreConfig(local_endpoint=n.endpoint, initial_bootstrap=n.initial, **self.base_config)  # type: ignore[arg-type]

    def start(self, n: Node) -> None:
        n.incarnation += 1
        n.inbound.clear()
        snap = n.log.snapshot
        if snap is not None:
            state = json.loads(snap.data)
            n.kv = dict(state["kv"])
            n.applied = snap.snapshot_id.offset
        else:
            n.kv, n.applied = {}, n.log.log_start
        n.core = RaftCore(
            self.config_for(n),
            n.key,
            CLUSTER,
            replace(n.qs),
            n.log.summary(),
            n.log,
            random.Random(self.rng.getrandbits(32)),
            self.now,
        )
        n.last_hw_seen = n.core.hw
        self.pump(n)

    def crash(self, n: Node) -> None:
        if n.core is None:
            return
        self.note(f"crash {n.key}")
        n.core = None
        n.log.crash()

    def replace_disk(self, n: Node) -> str:
        """The node loses its directory and comes back formatted with a new storage UUID."""
        self.crash(n)
        n.uuid = uuid_for(self.rng)
        n.log = MemoryLog()
        n.qs = QuorumState(CLUSTER)
        n.last_epoch_seen = 0
        n.initial = False
        self.note(f"replace disk of node {n.id}: new uuid {n.uuid}")
        self.start(n)
        return n.uuid

    def note(self, s: str) -> None:
        self.trace.append(f"t={self.now} {s}")
        if len(self.trace) > 400:
            del self.trace[:200]

    def fail(self, name: str, detail: str) -> None:
        tail = "\n".join(self.trace[-40:])
        raise InvariantError(
            f"invariant {name} violated: {detail}\nseed={self.seed} t={self.now} "
            f"(rerun: SIM_SEED={self.seed} pytest tests/sim)\n{tail}"
        )

    # ------------------------------------------------------------------ the driver

    def pump(self, n: Node, crash_point: bool = False) -> None:
        for _ in range(100):
            core = n.core
            if core is None:
                return
            r = core.ready()
            if r.is_empty():
                return
            self.handle(n, core, r, crash_point)
        self.fail("driver-progress", f"node {n.id} produced Ready forever")

    def handle(self, n: Node, core: RaftCore, r: Ready, crash_point: bool) -> None:
        log = n.log
        if r.truncate_to is not None:
            log.truncate(r.truncate_to)
        for ch in r.snapshot_chunks:
            if ch.position == 0:
                log.pending_snapshot = bytearray()
            log.pending_snapshot[ch.position : ch.position + len(ch.data)] = ch.data
        if r.install_snapshot is not None:
            data = bytes(log.pending_snapshot)
            state = json.loads(data)
            controls = tuple(decode_control(bytes.fromhex(h)) for h in state["controls"])
            log.install_snapshot(r.install_snapshot, data, controls)
            n.kv = dict(state["kv"])
            n.applied = r.install_snapshot.offset
            core.snapshot_installed(r.install_snapshot, controls)
        for b in r.append:
            log.append(b)
        if crash_point and r.append and self.rng.random() < 0.0015:
            self.crash(n)  # before fsync: the appended batches are lost
            return
        if r.quorum_state is not None:
            n.qs = replace(r.quorum_state)
        if r.append:
            # The driver's fast path: Fetch responses for what was just written leave before
            # the leader's own fsync, so a crash below can take back records a follower has.
            for ob in core.appended(log.end_offset, self.now):
                self.send(n, ob.destination_id, ob.message)
            if crash_point and self.rng.random() < 0.0015:
                self.crash(n)
                return
        if r.flush:
            log.flush()
        core.advance(r, log.durable_end)
        for ob in r.messages:
            self.send(n, ob.destination_id, ob.message)
        if r.commit is not None:
            self.apply(n, r.commit)
        if r.role_change is not None:
            rc = r.role_change
            self.note(f"node {n.id} -> {rc.role} epoch {rc.epoch} leader {rc.leader_id}")
            if rc.role == "leader":
                prev = self.leaders.get(rc.epoch)
                if prev is not None and prev != n.key:
                    self.fail("one-leader-per-epoch", f"epoch {rc.epoch}: {prev} and {n.key}")
                self.leaders[rc.epoch] = n.key
                self.check_leader_completeness(n)
        for pr in r.proposal_results:
            recs = self.proposals.pop((n.id, n.uuid, pr.last_offset, pr.epoch), None)
            if recs is None:
                continue
            if pr.error.value == "NONE":
                first = pr.last_offset - len(recs) + 1
                for i, rec in enumerate(recs):
                    got = self.committed.get(first + i)
                    if got is None or got[1] != rec:
                        self.fail(
                            "acked-write-committed", f"offset {first + i}: acked {rec!r}, committed {got}"
                        )
                self.max_acked = max(self.max_acked, pr.last_offset + 1)
        for rr in r.reads:
            start_acked = self.reads.pop(rr.read_id, None)
            if start_acked is not None and rr.error.value == "NONE":
                if rr.index < start_acked:
                    self.fail(
                        "linearizable-read", f"read {rr.read_id} index {rr.index} < acked {start_acked}"
                    )
                self.read_results.append((rr.read_id, rr.index))
        for ar in r.admin_results:
            self.admin_results[ar.request_id] = ar
            self.note(f"admin {ar.request_id} -> {ar.error.value} {ar.message}")
        for e in r.errors:
            self.errors.append(f"node {n.id}: {e}")
        if r.recovery_needed:
            self.recovery_needed.add(n.id)

    def apply(self, n: Node, commit: int) -> None:
        upto = min(commit, n.log.end_offset)
        if upto <= n.applied:
            return
        for off, epoch, rec, base in n.log.records_between(n.applied, upto):
            rep = rec.decode() if isinstance(rec, bytes) else repr(rec)
            got = self.committed.get(off)
            if got is None:
                if off != self.committed_end:
                    self.fail(
                        "committed-prefix",
                        f"node {n.id} commits offset {off} but global end {self.committed_end}",
                    )
                self.committed[off] = (epoch, rep)
                self.committed_end = off + 1
                if not isinstance(rec, bytes):
                    self.on_committed_control(base, rec)
            elif got != (epoch, rep):
                self.fail("committed-never-changes", f"node {n.id} offset {off}: {got} vs {(epoch, rep)}")
            if isinstance(rec, bytes):
                cmd = json.loads(rec)
                n.kv[cmd["k"]] = cmd["v"]
        n.applied = upto

    def on_committed_control(self, base: int, rec: ControlRecord) -> None:
        """Invariant single-voter-change: two consecutive committed voter sets (batch by batch)
        differ by at most one voter, except the bootstrap batch and an unclean recovery."""
        if self.cv_batch is None or self.cv_batch[0] != base:
            self.finish_voter_batch()
            self.cv_batch = (base, self.cv_current, False)
        if isinstance(rec, LeaderRecovery):
            self.cv_batch = (base, self.cv_batch[1], True)
        if isinstance(rec, AddVoter):
            self.cv_current = (self.cv_current or frozenset()) | {rec.voter}
        elif isinstance(rec, RemoveVoter):
            self.cv_current = (self.cv_current or frozenset()) - {rec.voter}

    def finish_voter_batch(self) -> None:
        if self.cv_batch is None:
            return
        base, before, recovery = self.cv_batch
        after = self.cv_current
        if before is not None and after is not None and len(before ^ after) > 1 and not recovery:
            self.fail(
                "single-voter-change", f"committed voter sets {sorted(before)} -> {sorted(after)} at {base}"
            )
        if after != before:
            self.committed_voters.append((base, after or frozenset()))
        self.cv_batch = (base, after, recovery)

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
                # connection refused: the sender's driver reports it quickly
                self.seq += 1
                heapq.heappush(
                    self.net,
                    Delivery(
                        self.now + 5,
                        self.seq,
                        src,
                        src,
                        self.nodes[src].incarnation,
                        RpcFailed(msg.correlation_id, dest, "unreachable"),
                    ),
                )
            return
        self.seq += 1
        delay = self.rng.randint(1, 15)
        target = self.nodes[dest]
        inc = target.incarnation if is_request(msg) else self.nodes[dest].incarnation
        heapq.heappush(self.net, Delivery(self.now + delay, self.seq, dest, src, inc, msg))

    def deliver_due(self) -> None:
        while self.net and self.net[0].at <= self.now:
            d = heapq.heappop(self.net)
            n = self.nodes[d.dest]
            if n.core is None or d.incarnation != n.incarnation:
                continue
            msg = d.message
            if is_request(msg):
                n.next_in += 1
                n.inbound[n.next_in] = (d.src, msg.correlation_id)
                msg = replace(msg, correlation_id=n.next_in)
            n.core.step(msg, self.now)
            self.pump(n, crash_point=self.crash_points)
            self.check(n)

    crash_points = False

    # ------------------------------------------------------------------ time

    def run(self, ms: int, action: Callable[[Sim], None] | None = None) -> None:
        end = self.now + ms
        while self.now < end:
            self.now += self.step_ms
            self.deliver_due()
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
            core = n.core
            if core is None or n.applied - n.log.log_start < self.snapshot_every:
                continue
            if self.rng.random() > 0.05:
                continue
            off = min(n.applied, core.hw)
            if off <= (n.log.snapshot.snapshot_id.offset if n.log.snapshot else 0):
                continue
            sid = OffsetAndEpoch(off, core.epoch_at(off - 1))
            controls = core.controls_at(off)
            kv = self.kv_at(n, off)
            data = json.dumps({"kv": kv, "controls": [encode_control(c).hex() for c in controls]}).encode()
            start = n.log.take_snapshot(sid, data, controls)
            core.snapshot_taken(sid, min(start, off))
            self.note(f"node {n.id} snapshot {sid} log start {start}")

    def kv_at(self, n: Node, off: int) -> dict[str, str]:
        assert off == n.applied or off <= n.applied
        if off == n.applied:
            return dict(n.kv)
        kv: dict[str, str] = {}
        for o in range(0, off):
            got = self.committed.get(o)
            if got is not None and got[1].startswith("{"):
                cmd = json.loads(got[1])
                kv[cmd["k"]] = cmd["v"]
        return kv

    # ------------------------------------------------------------------ clients & admin

    def leader(self) -> Node | None:
        best: Node | None = None
        for n in self.nodes.values():
            if n.core is not None and n.core.role_name == "leader":
                if best is None or n.core.epoch > best.core.epoch:  # type: ignore[union-attr]
                    best = n
        return best

    def write(self, count: int = 1) -> bool:
        ld = self.leader()
        if ld is None or ld.core is None:
            return False
        recs = []
        for _ in range(count):
            self.client_seq += 1
            recs.append(json.dumps({"k": f"k{self.client_seq % 17}", "v": f"v{self.client_seq}"}))
        try:
            last = ld.core.propose([r.encode() for r in recs], self.now)
        except KraftError:
            return False
        self.proposals[(ld.id, ld.uuid, last, ld.core.epoch)] = recs
        self.pump(ld)
        return True

    def read(self) -> int | None:
        ld = self.leader()
        if ld is None or ld.core is None:
            return None
        self.read_seq += 1
        try:
            ld.core.read_index(self.read_seq, self.now)
        except KraftError:
            return None
        self.reads[self.read_seq] = self.max_acked
        self.pump(ld)
        return self.read_seq

    def admin(self, op: str, arg: Any) -> int | None:
        ld = self.leader()
        if ld is None or ld.core is None:
            return None
        self.admin_seq += 1
        rid = self.admin_seq
        self.note(f"admin {rid}: {op} {arg} at leader {ld.id}")
        if op == "add":
            ld.core.add_voter(rid, arg, self.now)
        elif op == "remove":
            ld.core.remove_voter(rid, arg, self.now)
        else:
            ld.core.reassign(rid, arg, self.now)
        self.pump(ld)
        return rid

    def wait_admin(self, rid: int | None, ms: int = 8000) -> Any:
        if rid is None:
            return None
        end = self.now + ms
        while self.now < end and rid not in self.admin_results:
            self.run(self.step_ms)
        return self.admin_results.get(rid)

    def until(self, cond: Callable[[], bool], ms: int, action: Callable[[Sim], None] | None = None) -> bool:
        end = self.now + ms
        while self.now < end:
            if cond():
                return True
            self.run(self.step_ms, action)
        return cond()

    # ------------------------------------------------------------------ invariants

    def check(self, n: Node) -> None:
        core = n.core
        if core is None:
            return
        if core.epoch < n.last_epoch_seen:
            self.fail("epoch-monotonic", f"node {n.id} epoch {core.epoch} < {n.last_epoch_seen}")
        n.last_epoch_seen = core.epoch
        if core.hw < n.last_hw_seen:
            self.fail("hw-monotonic", f"node {n.id} hw {core.hw} < {n.last_hw_seen}")
        n.last_hw_seen = core.hw
        changes = [c for c in core.history.voter_changes_from(core.hw) if c.op != "bootstrap"]
        if len({c.offset for c in changes}) > 1:
            # A restarted replica does not know the high watermark yet: changes that are
            # committed cluster-wide (same record at that offset) do not count as pending.
            changes = [c for c in changes if not self._is_committed_here(n, c.offset)]
        offsets = {c.offset for c in changes}
        if len(offsets) > 1:
            self.fail("one-uncommitted-voter-change", f"node {n.id} hw {core.hw}: {changes}")

    def check_leader_completeness(self, n: Node) -> None:
        """Raft's Leader Completeness: a new leader's log holds every committed entry (those
        below its log start are in its snapshot). Unclean recovery is exempt by design."""
        if self.unclean:
            return
        start = n.log.log_start
        if n.log.snapshot is not None:
            start = max(start, n.log.snapshot.snapshot_id.offset)
        end = self.committed_end
        if n.log.end_offset < end:
            self.fail(
                "leader-completeness", f"leader {n.key} log ends at {n.log.end_offset} < committed {end}"
            )
        for off, epoch, rec, _base in n.log.records_between(start, end):
            rep = rec.decode() if isinstance(rec, bytes) else repr(rec)
            if self.committed.get(off) != (epoch, rep):
                self.fail(
                    "leader-completeness",
                    f"leader {n.key} offset {off}: {(epoch, rep)} vs {self.committed.get(off)}",
                )

    def _is_committed_here(self, n: Node, off: int) -> bool:
        got = self.committed.get(off)
        if got is None:
            return False
        recs = n.log.records_between(off, off + 1)
        return bool(recs) and (recs[0][1], repr(recs[0][2])) == got

    def assert_converged(self) -> None:
        live = [n for n in self.nodes.values() if n.core is not None]
        ld = self.leader()
        if ld is None:
            self.fail("liveness", "no leader after healing")
        assert ld is not None and ld.core is not None
        vs = ld.core.voters()
        for n in live:
            if n.core is not None and vs.contains(n.key) and n.core.hw < ld.core.hw:
                self.fail("liveness", f"voter {n.id} hw {n.core.hw} behind leader {ld.core.hw}")

    def summary(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "now": self.now,
            "committed": self.committed_end,
            "leaders": len(self.leaders),
            "errors": len(self.errors),
        }

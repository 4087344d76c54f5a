"""The simulation's invariants (mixed into :class:`tests.sim.harness.Sim`), checked after every
event. Each failure names the invariant:

* ``acked-write-durable``: every acknowledged write (``ProposalResult`` NONE delivered to a
  client) is durable (fsynced, or inside a snapshot) on a majority of the voters the leader
  counted, at the moment it is acknowledged and, in runs without disk replacement
  (``check_durable``), at every later step, across power losses;
* ``acked-write-committed``, ``committed-prefix``, ``committed-never-changes``: what a state
  machine applies is one global committed sequence and an acknowledged write is in it;
* ``one-leader-per-epoch``, ``leader-completeness``, ``epoch-monotonic``, ``hw-monotonic``,
  ``linearizable-read``, ``single-voter-change``, ``one-uncommitted-voter-change``;
* ``published-view``: once a node is idle, the role / leader / epoch its driver published (what
  the node serves on /readyz and in NOT_LEADER hints) are its core's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quorum.core.ready import ProposalResult, ReadResult, RoleChange
from quorum.driver.memory import read_records
from quorum.records import batch_header
from quorum.types import AddVoter, ControlRecord, ErrorCode, LeaderRecovery, RemoveVoter, ReplicaKey

if TYPE_CHECKING:
    from tests.sim.nodes import Node

CLUSTER = "sim-cluster"


class InvariantError(AssertionError):
    pass


class Checks:
    seed: int
    now: int
    trace: list[str]
    nodes: dict[int, Node]
    proposals: dict[tuple[int, str, int, int], list[str]]
    reads: dict[int, int]

    def init_checks(self) -> None:
        self.leaders: dict[int, ReplicaKey] = {}
        self.committed: dict[int, tuple[int, str]] = {}
        self.committed_end = 0
        self.committed_voters: list[tuple[int, frozenset[ReplicaKey]]] = []
        self.cv_current: frozenset[ReplicaKey] | None = None
        self.cv_batch: tuple[int, frozenset[ReplicaKey] | None, bool] | None = None
        self.max_acked = 0
        self.read_results: list[tuple[int, int]] = []
        # The highest acknowledged write: (offset, epoch, the voters its leader counted).
        self.acked_top: tuple[int, int, frozenset[ReplicaKey]] | None = None
        self.check_durable = True  # off in runs that replace disks (a lost disk may hold it)
        # Disks replaced (lost) as they were when lost: an acknowledgement that happens after
        # its record committed and one of its holders lost its disk still counts that holder.
        self.retired: list[Node] = []
        self.acked_checks = 0
        # Fetches that claimed committed, not yet fsynced records (the pipelining rule).
        self.pipelined_fetches = 0
        # Readies that handed over fetched batches without an fsync (the batched catch-up
        # fsync), and power cuts that hit a node holding written, not yet fsynced records.
        self.deferred_fsyncs = 0
        self.cuts_with_unsynced = 0
        self.kills_with_unsynced = 0  # process crashes that left unsynced writes in the page cache
        self.unclean = False  # set by an unclean recovery: committed data may be lost on purpose

    def fail(self, name: str, detail: str) -> None:
        tail = "\n".join(self.trace[-40:])
        raise InvariantError(
            f"invariant {name} violated: {detail}\nseed={self.seed} t={self.now} "
            f"(rerun: SIM_SEED={self.seed} pytest tests/sim)\n{tail}"
        )

    # ------------------------------------------------------------------ durability

    def holds_durably(self, n: Node, offset: int, epoch: int) -> bool:
        """``n``'s storage would still hold the record (offset, epoch) after a power loss."""
        latest = n.snapshots.latest()
        if latest is not None and latest.offset > offset:
            return True
        log = n.log
        if offset < log.log_start_offset or offset >= log.synced_end_offset:
            return False
        _base, _size, got, _count = batch_header(log.read(offset, 1))
        return got == epoch

    def durable_count(self, offset: int, epoch: int, voters: frozenset[ReplicaKey]) -> int:
        count = 0
        for k in voters:
            for n in [*self.nodes.values(), *self.retired]:
                # A uuid-less bootstrap key stands for the disk formatted with the cluster.
                if n.id == k.id and (n.uuid == k.uuid if k.uuid is not None else n.initial):
                    count += self.holds_durably(n, offset, epoch)
        return count

    def check_acked_durable(self) -> None:
        top = self.acked_top
        if top is None or not self.check_durable or self.unclean:
            return
        offset, epoch, voters = top
        if self.durable_count(offset, epoch, voters) < len(voters) // 2 + 1:
            self.fail("acked-write-durable", f"acked offset {offset} (epoch {epoch}) lost its majority")

    # ------------------------------------------------------------------ driver callbacks

    def on_proposal(self, n: Node, pr: ProposalResult) -> None:
        recs = self.proposals.pop((n.id, n.uuid, pr.last_offset, pr.epoch), None)
        if recs is None or pr.error is not ErrorCode.NONE:
            return
        first = pr.last_offset - len(recs) + 1
        for i, rec in enumerate(recs):
            got = self.committed.get(first + i)
            if got is None or got[1] != rec:
                self.fail("acked-write-committed", f"offset {first + i}: acked {rec!r}, committed {got}")
        assert n.core is not None
        # The voter set the leader counted when its high watermark crossed the offset (strict:
        # not any set in force since, which could hide a leader counting a stale set).
        counted = [vs for lo, hi, vs in getattr(n.core, "counted", []) if lo <= pr.last_offset < hi]
        if not counted and not self.unclean:
            self.fail(
                "acked-write-counted",
                f"node {n.id} acknowledged offset {pr.last_offset} but its high watermark never "
                f"crossed it while leading",
            )
        sets = counted[:1]
        self.acked_checks += 1
        held = [vs for vs in sets if self.durable_count(pr.last_offset, pr.epoch, vs) >= len(vs) // 2 + 1]
        if not self.unclean and not held:
            vs = sets[0]
            self.fail(
                "acked-write-durable",
                f"node {n.id} acknowledged offset {pr.last_offset} (epoch {pr.epoch}) "
                f"synced on fewer than a majority of the voters it counted {sorted(map(str, vs))}: "
                + ", ".join(
                    f"node {m.id} synced up to {m.log.synced_end_offset} (flushed {m.log.flushed_end_offset})"
                    for m in self.nodes.values()
                ),
            )
        voters = held[0] if held else frozenset(n.core.voters().voters)
        if self.acked_top is None or pr.last_offset > self.acked_top[0]:
            self.acked_top = (pr.last_offset, pr.epoch, voters)
        self.max_acked = max(self.max_acked, pr.last_offset + 1)

    def on_read(self, rr: ReadResult) -> None:
        start_acked = self.reads.pop(rr.read_id, None)
        if start_acked is not None and rr.error is ErrorCode.NONE:
            if rr.index < start_acked:
                self.fail("linearizable-read", f"read {rr.read_id} index {rr.index} < acked {start_acked}")
            self.read_results.append((rr.read_id, rr.index))

    def on_role(self, n: Node, rc: RoleChange) -> None:
        self.note(f"node {n.id} -> {rc.role} epoch {rc.epoch} leader {rc.leader_id}")
        if rc.role == "leader":
            prev = self.leaders.get(rc.epoch)
            if prev is not None and prev != n.key:
                self.fail("one-leader-per-epoch", f"epoch {rc.epoch}: {prev} and {n.key}")
            self.leaders[rc.epoch] = n.key
            self.check_leader_completeness(n)

    def on_applied(self, n: Node, applied_end: int) -> None:
        """Compare what the driver applied with the global committed sequence."""
        latest = n.snapshots.latest()
        start = max(n.applied, n.log.log_start_offset, latest.offset if latest is not None else 0)
        for off, epoch, rec, base in read_records(n.log, start, applied_end):
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
        n.applied = max(n.applied, applied_end)

    def on_committed_control(self, base: int, rec: ControlRecord) -> None:
        """Two consecutive committed voter sets (batch by batch) differ by at most one voter,
        except the bootstrap batch and an unclean recovery."""
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

    # ------------------------------------------------------------------ per-node checks

    def check(self, n: Node) -> None:
        core = n.core
        if core is None:
            return
        # The persisted epoch never goes back, and the core never runs below it (an epoch
        # held only in memory may be lost with power: nothing promised it yet).
        persisted = n.persisted_epoch
        if persisted < n.last_epoch_seen or core.epoch < persisted:
            self.fail(
                "epoch-monotonic",
                f"node {n.id} persisted epoch {persisted} (before {n.last_epoch_seen}), "
                f"core epoch {core.epoch}",
            )
        n.last_epoch_seen = persisted
        if core.hw < n.last_hw_seen:
            self.fail("hw-monotonic", f"node {n.id} hw {core.hw} < {n.last_hw_seen}")
        n.last_hw_seen = core.hw
        changes = [c for c in core.history.voter_changes_from(core.hw) if c.op != "bootstrap"]
        if len({c.offset for c in changes}) > 1:
            # A restarted replica does not know the high watermark yet: changes that are
            # committed cluster-wide (same record at that offset) do not count as pending.
            changes = [c for c in changes if not self._is_committed_here(n, c.offset)]
        if len({c.offset for c in changes}) > 1:
            self.fail("one-uncommitted-voter-change", f"node {n.id} hw {core.hw}: {changes}")

    def check_published(self, n: Node) -> None:
        """Called when the node is idle (no Ready in flight, nothing queued)."""
        core, driver = n.core, n.driver
        if core is None or driver is None:
            return
        pub = driver.published
        if (pub.role, pub.epoch, pub.leader_id) != (core.role.name, core.epoch, core.leader_id()):
            self.fail(
                "published-view",
                f"node {n.id} published {pub.role}/{pub.epoch}/leader {pub.leader_id}, core is "
                f"{core.role.name}/{core.epoch}/leader {core.leader_id()}",
            )

    def check_leader_completeness(self, n: Node) -> None:
        """Raft's Leader Completeness: a new leader's log holds every committed entry (those
        below its log start are in its snapshot). Unclean recovery is exempt by design."""
        if self.unclean:
            return
        latest = n.snapshots.latest()
        start = max(n.log.log_start_offset, latest.offset if latest is not None else 0)
        end = self.committed_end
        if n.log.end_offset < end:
            self.fail(
                "leader-completeness", f"leader {n.key} log ends at {n.log.end_offset} < committed {end}"
            )
        for off, epoch, rec, _base in read_records(n.log, start, end):
            rep = rec.decode() if isinstance(rec, bytes) else repr(rec)
            if self.committed.get(off) != (epoch, rep):
                self.fail(
                    "leader-completeness",
                    f"leader {n.key} offset {off}: {(epoch, rep)} vs {self.committed.get(off)}",
                )

    def _is_committed_here(self, n: Node, off: int) -> bool:
        got = self.committed.get(off)
        if got is None or off < n.log.log_start_offset:
            return False
        recs = read_records(n.log, off, off + 1)
        return bool(recs) and (recs[0][1], repr(recs[0][2])) == got

    def note(self, s: str) -> None:  # the harness keeps the trace
        self.trace.append(f"t={self.now} {s}")

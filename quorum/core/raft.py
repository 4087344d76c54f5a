"""``RaftCore``: the pure KRaft-style consensus core (see docs/design.md, "The core contract").

The driver owns all I/O. It calls ``step`` with inbound requests / responses, ``tick`` as time
passes, ``propose`` / ``read_index`` / admin calls for clients, and repeatedly takes
``ready()``, handles it in the documented order and calls ``advance``. Behaviour is split over
mixins: :mod:`election` (roles, Vote, BeginQuorumEpoch, EndQuorumEpoch, pre-vote, zombie
leader), :mod:`replication` (Fetch, FetchSnapshot, high watermark, long polling),
:mod:`membership` (KIP-856 AddVoter / RemoveVoter, bootstrapping, KIP-642 reassignment,
KIP-704 recovery hand-off) and :mod:`describe`. The role classes and the transition table are
in :mod:`roles`.

Snapshot handshake (KIP-630):

* taking one locally: the driver snapshots the state machine at an applied offset ``o <= hw``
  embedding ``core.controls_at(o)`` (voter set, removed keys, target voters, recovery state),
  then calls ``core.snapshot_taken(OffsetAndEpoch(o, epoch_of(o - 1)), new_log_start)`` and may
  delete the log below ``new_log_start``; Fetches below the log start are then answered with
  the snapshot id;
* installing a fetched one: see :mod:`ready` (``snapshot_chunks``, ``install_snapshot``, then
  ``snapshot_installed(id, controls)`` or ``snapshot_rejected(id, reason)``).
"""

from __future__ import annotations

import random

from quorum.core.base import CoreBase, InFlight
from quorum.core.config import CoreConfig
from quorum.core.describe import DescribeMixin
from quorum.core.logmeta import LogMeta
from quorum.core.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    RpcFailed,
    VoteRequest,
    VoteResponse,
)
from quorum.core.progress import LeaderState
from quorum.core.ready import LogReader, Outbound, ProposalResult, ReadResult, Ready
from quorum.core.roles import Follower, Leader, Resigned, Unattached, Voted
from quorum.core.voters import ControlHistory, ControlState
from quorum.types import (
    AddVoter,
    ControlRecord,
    ErrorCode,
    KraftError,
    LogSummary,
    OffsetAndEpoch,
    QuorumState,
    ReplicaKey,
)


class RaftCore(DescribeMixin, CoreBase):
    def __init__(
        self,
        config: CoreConfig,
        local: ReplicaKey,
        cluster_id: str,
        quorum_state: QuorumState,
        log_summary: LogSummary,
        log_reader: LogReader,
        rng: random.Random,
        now_ms: int,
    ) -> None:
        if quorum_state.cluster_id and quorum_state.cluster_id != cluster_id:
            raise KraftError(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"quorum state belongs to cluster {quorum_state.cluster_id!r}, not {cluster_id!r}",
            )
        meta = LogMeta(log_summary)
        base = ControlState.bootstrap(config.bootstrap_voters, config.initial_bootstrap)
        for c in log_summary.snapshot_controls:
            base = base.apply(c)
        snap = log_summary.snapshot
        history = ControlHistory(base, snap.offset - 1 if snap is not None else -1)
        for b in log_summary.control_batches:
            if snap is None or b.base_offset >= snap.offset:  # older ones are in the snapshot
                history.apply_batch(b.base_offset, b.controls)
        self._init_base(config, local, cluster_id, quorum_state, meta, history, log_reader, rng, now_ms)
        self.hw = max(self.hw, snap.offset if snap is not None else 0)
        for c in (
            *log_summary.snapshot_controls,
            *(c for b in log_summary.control_batches for c in b.controls),
        ):
            if isinstance(c, AddVoter) and c.endpoint:
                self.learn_endpoint(c.voter.id, c.endpoint, c.voter.uuid)
        self._restore_role(quorum_state, now_ms)

    def _restore_role(self, qs: QuorumState, now_ms: int) -> None:
        epoch = max(qs.leader_epoch, self.meta.last_epoch())
        single = self.voters().find(self.local) is not None and len(self.voters().voters) == 1
        deadline = now_ms if single else self.election_deadline()
        if epoch > qs.leader_epoch:
            self.persist(-1, epoch, None)
            self.role = Unattached(epoch, deadline)
        elif qs.leader_id == self.local.id:
            # A restarted leader cannot lead its old epoch again (KIP-595 Resigned).
            self.role = Resigned(epoch, deadline)
        elif qs.leader_id >= 0:
            self.role = Follower(epoch, qs.leader_id, now_ms + self.config.fetch_timeout_ms)
        elif qs.voted_id >= 0 and qs.voted_id != self.local.id:
            self.role = Voted(epoch, ReplicaKey(qs.voted_id, qs.voted_uuid), deadline)
        else:
            self.role = Unattached(epoch, deadline)
        # The first Ready publishes the restored role: a restarted follower must not report
        # "unattached, leader -1" until its next transition.
        self._role_change = self.role_view()

    # ------------------------------------------------------------------ driver entry points

    def step(self, message: Message, now_ms: int) -> None:
        """Handle one inbound request or response (or ``RpcFailed``)."""
        self.now = max(self.now, now_ms)
        if isinstance(message, VoteRequest):
            self.handle_vote_request(message)
        elif isinstance(message, BeginQuorumEpochRequest):
            self.handle_begin_request(message)
        elif isinstance(message, EndQuorumEpochRequest):
            self.handle_end_request(message)
        elif isinstance(message, FetchRequest):
            self.handle_fetch_request(message)
        elif isinstance(message, FetchSnapshotRequest):
            self.handle_fetch_snapshot_request(message)
        else:
            inf = self.inflight.pop(message.correlation_id, None)
            if inf is None:
                return  # late answer to a request already timed out or superseded
            if isinstance(message, RpcFailed):
                self.on_rpc_failed(inf)
            elif isinstance(message, VoteResponse):
                self.handle_vote_response(message, inf)
            elif isinstance(message, BeginQuorumEpochResponse):
                self.handle_begin_response(message, inf)
            elif isinstance(message, EndQuorumEpochResponse):
                self.handle_end_response(message, inf)
            elif isinstance(message, FetchResponse):
                self.handle_fetch_response(message, inf)
            elif isinstance(message, FetchSnapshotResponse):
                self.handle_fetch_snapshot_response(message, inf)
        self._pump()

    def on_rpc_failed(self, inf: InFlight) -> None:
        if inf.kind in ("fetch", "fetch_snapshot"):
            self.fetch_failed(inf)
        elif inf.kind == "begin":
            self.begin_failed(inf)

    def tick(self, now_ms: int) -> None:
        """Time passes: election / fetch / long-poll / admin / request timeouts."""
        self.now = max(self.now, now_ms)
        for corr, inf in list(self.inflight.items()):
            if inf.deadline <= self.now:
                del self.inflight[corr]
                self.on_rpc_failed(inf)
        self.tick_election()
        ls = self.leader_state()
        if ls is not None:
            self.release_parked(ls, everything=False)
            cfg = self.config
            ls.forget_observers(self.voters(), self.now, cfg.observer_expiry_ms, cfg.max_observers)
        self._pump()

    def _pump(self) -> None:
        ls = self.leader_state()
        if ls is not None:
            self.tick_membership()
            ls2 = self.leader_state()
            if ls2 is not None:
                self.check_reads(ls2)
        self.tick_fetch()

    def propose(self, data_records: list[bytes], now_ms: int) -> int:
        """Leader only: append opaque records (group-committed into one batch at the next
        ``ready()``); returns the offset of the last one. Completion comes as a
        ``ProposalResult`` keyed by that offset."""
        self.now = max(self.now, now_ms)
        ls = self._leader_for_clients()
        if not data_records:
            raise KraftError(ErrorCode.INVALID_REQUEST, "propose needs at least one record")
        if not self.writes_allowed(ls):
            raise KraftError(
                ErrorCode.UNAVAILABLE,
                "the leader has not yet written the bootstrap voter set to every voter (KIP-856)",
            )
        if not self._pending_records:
            self._pending_base = self.meta.end
        self._pending_records.extend(data_records)
        self.meta.append(self.meta.end, self.epoch, len(data_records))
        last = self.meta.end - 1
        ls.proposals.append((last, self.epoch))
        return last

    def read_index(self, read_id: int, now_ms: int) -> None:
        """Linearizable read: completes with ``ReadResult(read_id, hw)`` once a majority of
        voters fetched after this call (leadership confirmed) and this epoch's
        LeaderChangeMessage is committed."""
        self.now = max(self.now, now_ms)
        ls = self._leader_for_clients()
        ls.read_round += 1
        ls.pending_reads.append((read_id, ls.read_round))
        # Answer parked long polls now so the followers fetch again at once.
        self.release_parked(ls, everything=True)
        self.check_reads(ls)

    def _leader_for_clients(self) -> LeaderState:
        ls = self.leader_state()
        if ls is None:
            raise KraftError(
                ErrorCode.NOT_LEADER,
                "not the leader",
                leader_id=self.leader_id(),
                leader_epoch=self.epoch,
                leader_endpoint=self.leader_endpoint(),
            )
        if self.recovering():
            raise KraftError(
                ErrorCode.LEADER_RECOVERING, "the leader was elected uncleanly and is recovering (KIP-704)"
            )
        return ls

    def check_reads(self, ls: LeaderState) -> None:
        if not ls.pending_reads or not self.leader_change_committed(ls):
            return
        confirmed = ls.confirmed_round(self.voters(), self.local)
        done = [r for r in ls.pending_reads if r[1] <= confirmed]
        if done:
            ls.pending_reads = [r for r in ls.pending_reads if r[1] > confirmed]
            self._reads.extend(ReadResult(read_id, self.hw) for read_id, _r in done)

    def on_hw_advanced(self) -> None:
        ls = self.leader_state()
        if ls is None:
            return
        n = 0
        for last, epoch in ls.proposals:
            if last >= self.hw:
                break
            self._proposal_results.append(ProposalResult(last, epoch))
            n += 1
        if n:
            del ls.proposals[:n]

    def on_replica_progress(self, ls: LeaderState, key: ReplicaKey) -> None:
        self.check_reads(ls)

    def on_voters_changed(self, before: ControlState) -> None:
        ls = self.leader_state()
        if ls is not None:
            for v in self.other_voters():
                if v not in before.voters:
                    ls.begin_epoch_due[v] = self.now
            self.update_leader_hw()

    def resign(self, now_ms: int) -> None:
        """Graceful leader hand-off (EndQuorumEpoch with preferred successors)."""
        self.now = max(self.now, now_ms)
        self.resign_leadership()

    def shutdown(self, now_ms: int) -> None:
        """Stop taking part in elections; a leader resigns first."""
        self.now = max(self.now, now_ms)
        self.resign_leadership()
        self.shutting_down = True

    # ------------------------------------------------------------------ Ready

    def ready(self) -> Ready:
        self.flush_pending_records()
        r = Ready(
            truncate_to=self._truncate_to,
            snapshot_chunks=self._chunks,
            install_snapshot=self._install,
            append=self._append,
            quorum_state=QuorumState(**vars(self.quorum)) if self._state_dirty else None,
            messages=self._messages,
            commit=self.hw if self._commit_dirty else None,
            proposal_results=self._proposal_results,
            reads=self._reads,
            admin_results=self._admin_results,
            role_change=self._role_change,
            errors=self._errors,
            end_offset=self.meta.end,
        )
        r.flush = (
            (bool(r.append) and not (r.quorum_state is None and self.defer_flush(r.append)))
            or r.truncate_to is not None
            or r.install_snapshot is not None
            # A log left not durable by batched catch-up fsyncs (quorum.core.replication) is
            # fsynced once this node stops following: before it votes or leads on it.
            or (self.meta.durable_end < self.meta.end and not isinstance(self.role, Follower))
        )
        if self.recovery_requested and self.recovering() and isinstance(self.role, Leader):
            r.recovery_needed = True
            self.recovery_requested = False
        self._truncate_to = None
        self._chunks = []
        self._install = None
        self._append = []
        self._state_dirty = False
        self._messages = []
        self._commit_dirty = False
        self._proposal_results = []
        self._reads = []
        self._admin_results = []
        self._role_change = None
        self._errors = []
        self._truncated_since_ready = None
        if r.append and r.quorum_state is None:
            # Pipelined catch-up (quorum.core.replication): the fetched batches are handed over
            # now, so the next Fetch may leave with them, before their fsync, when it claims
            # only committed records (the driver sends it right after writing the append).
            self.tick_fetch()
            r.messages.extend(self._messages)
            self._messages = []
        return r

    def ready_to_send(self) -> Ready | None:
        """What may leave while another Ready's persist is in flight (the driver calls this only
        when that Ready saves no quorum state): the queued messages, and the commit with the
        client results once the high watermark is within the local durable log. ``None`` when
        something queued must go through a full ``ready()`` first (a quorum-state save, a
        truncation, a snapshot, a role change); proposals not yet batched and the rest stay
        queued for it. Safe for the same reasons as the early send of ``quorum.core.ready``
        steps 6-7: a Fetch is queued only once the whole log is durable, and every promise a
        message carries was saved by an earlier Ready."""
        if (
            self._state_dirty
            or self._truncate_to is not None
            or self._chunks
            or self._install is not None
            or self._role_change is not None
        ):
            return None
        r = Ready(messages=self._messages, end_offset=self.meta.end)
        self._messages = []
        if not self._commit_dirty or self.hw <= self.meta.durable_end:
            r.commit = self.hw if self._commit_dirty else None
            r.proposal_results, self._proposal_results = self._proposal_results, []
            r.reads, self._reads = self._reads, []
            r.admin_results, self._admin_results = self._admin_results, []
            self._commit_dirty = False
        return r

    def advance(self, ready: Ready, persisted_end_offset: int) -> None:
        """The driver carried out ``ready`` up to its persist step: the durable (fsynced) log
        now ends at ``persisted_end_offset``. Nothing is added to ``ready``: the messages,
        commit and results this enables (a leader's high watermark counting its own fsync, a
        follower's next Fetch) are queued for the next ``Ready``, like everything stepped in
        since ``ready()`` (see :mod:`quorum.core.ready`)."""
        durable = min(persisted_end_offset, self.meta.end)
        if self._truncated_since_ready is not None:
            # A truncation queued after ready() is not on disk yet: what lies above it on disk
            # is the old, diverging data, not the log the core now describes.
            durable = min(durable, self._truncated_since_ready)
        self.meta.durable_end = durable
        self.meta.written_end = max(self.meta.written_end, durable)
        ls = self.leader_state()
        if ls is not None:
            self.update_leader_hw()
            self.release_parked(ls, everything=False)
        self._pump()

    def appended(self, written_end_offset: int, now_ms: int) -> list[Outbound]:
        """Optional fast path: the driver has written ``ready.append`` to the log file and is
        about to fsync it. A leader answers the parked fetches that can now get records and
        returns those responses for the driver to send at once, before its own fsync, so the
        followers' fsyncs run in parallel with the leader's. Only Fetch responses come back
        here (nothing whose promise needs the fsync); everything else waits for ``advance``.
        Returns nothing while a quorum-state write is pending."""
        self.now = max(self.now, now_ms)
        self.meta.written_end = max(self.meta.written_end, min(written_end_offset, self.meta.end))
        ls = self.leader_state()
        if ls is None or self._state_dirty or not ls.parked:
            return []
        kept, self._messages = self._messages, []
        try:
            self.release_parked(ls, everything=False)
            out = self._messages
        finally:
            self._messages = kept
        return out

    # ------------------------------------------------------------------ snapshots

    def controls_at(self, offset: int) -> tuple[ControlRecord, ...]:
        """Control records a snapshot ending at ``offset`` (exclusive) must carry."""
        return self.history.at(offset - 1).to_controls(self.key_endpoints)

    def epoch_at(self, offset: int) -> int:
        """Epoch of the record at ``offset`` (for snapshot ids)."""
        best = self.meta.snapshot.epoch if self.meta.snapshot is not None else 0
        for e, start in self.meta.epochs:
            if start <= offset:
                best = e
        return best

    def snapshot_taken(self, snapshot: OffsetAndEpoch, log_start_offset: int) -> None:
        """The driver wrote a snapshot ending at ``snapshot.offset`` (<= hw) and may now drop
        the log below ``log_start_offset`` (<= ``snapshot.offset``)."""
        if snapshot.offset > self.hw:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"snapshot at {snapshot.offset} is past the high watermark {self.hw}",
            )
        if log_start_offset > snapshot.offset or log_start_offset < self.meta.log_start:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"log start {log_start_offset} must be within [{self.meta.log_start}, {snapshot.offset}]",
            )
        if self.meta.snapshot is None or snapshot.offset >= self.meta.snapshot.offset:
            self.meta.snapshot = snapshot
        self.meta.log_start = log_start_offset
        keep = [(e, s) for e, s in self.meta.epochs if s >= log_start_offset]
        older = [(e, s) for e, s in self.meta.epochs if s < log_start_offset]
        if older and (not keep or keep[0][1] > log_start_offset):
            keep.insert(0, (older[-1][0], log_start_offset))
        self.meta.epochs = keep
        self.history.prune_below(log_start_offset - 1)

    def snapshot_installed(self, snapshot: OffsetAndEpoch, controls: tuple[ControlRecord, ...]) -> None:
        """The driver installed the fetched snapshot (log reset to ``snapshot.offset``)."""
        base = ControlState.bootstrap(self.config.bootstrap_voters, self.config.initial_bootstrap)
        for c in controls:
            base = base.apply(c)
        self.meta.reset_to_snapshot(snapshot)
        self.history.reset(base, snapshot.offset - 1)
        self.learn_record_endpoints(controls)
        self.snap_installing = None
        self.set_hw(snapshot.offset)
        self._pump()

    def snapshot_rejected(self, snapshot: OffsetAndEpoch, reason: str) -> None:
        """The fetched snapshot did not verify: fetch again from the leader."""
        self._errors.append(f"snapshot {snapshot} rejected: {reason}")
        self.snap_installing = None
        self.snap_fetch = None
        self._pump()

    # ------------------------------------------------------------------ queries

    @property
    def high_watermark(self) -> int:
        return self.hw

    @property
    def log_end_offset(self) -> int:
        return self.meta.end

    @property
    def role_name(self) -> str:
        return self.role.name


__all__ = ["RaftCore"]

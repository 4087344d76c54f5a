"""State and shared helpers of :class:`quorum.core.raft.RaftCore`.

The core is split into mixins over this base (elections, replication, membership, describe)
so that no module grows into a giant client class. Everything here is pure: time arrives as
``now`` arguments, randomness comes from the injected ``random.Random``.

Invariants kept by these helpers:

* the epoch never decreases; every change of (epoch, leader, vote) is written to
  ``Ready.quorum_state`` and the driver persists it before sending ``Ready.messages``;
* the high watermark never decreases (KIP-856, KAFKA-16530) and, on a follower, never passes
  the local log end;
* nothing at or below the high watermark is ever truncated.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from quorum.core.config import CoreConfig
from quorum.core.logmeta import LogMeta
from quorum.core.messages import FetchRequest, Message, is_request
from quorum.core.progress import LeaderState
from quorum.core.ready import (
    AdminResult,
    AppendBatch,
    LeaderBatch,
    LogReader,
    Outbound,
    ProposalResult,
    RawBatches,
    ReadResult,
    RoleChange,
    SnapshotChunk,
)
from quorum.core.roles import Follower, Leader, Role, Unattached
from quorum.core.voters import ControlHistory, ControlState
from quorum.types import (
    AddVoter,
    ControlRecord,
    ErrorCode,
    KraftError,
    OffsetAndEpoch,
    QuorumState,
    ReplicaKey,
)

NO_DEADLINE = 1 << 62

# Epochs are int32 on the wire (KIP-595). The core never adopts the last value: a replica at
# the limit could never start another election, so one forged request would brick it.
MAX_EPOCH = (1 << 31) - 2


def epoch_allowed(epoch: int) -> bool:
    return 0 <= epoch <= MAX_EPOCH


RequestKind = Literal["vote", "prevote", "begin", "end", "fetch", "fetch_snapshot"]


@dataclass
class InFlight:
    """An outbound request waiting for its response (or RpcFailed / timeout)."""

    correlation_id: int
    destination: ReplicaKey
    kind: RequestKind
    epoch: int
    deadline: int


class CoreBase:
    config: CoreConfig
    local: ReplicaKey
    cluster_id: str
    reader: LogReader
    rng: random.Random

    def _init_base(
        self,
        config: CoreConfig,
        local: ReplicaKey,
        cluster_id: str,
        quorum_state: QuorumState,
        meta: LogMeta,
        history: ControlHistory,
        log_reader: LogReader,
        rng: random.Random,
        now_ms: int,
    ) -> None:
        self.config = config
        self.local = local
        self.cluster_id = cluster_id
        self.reader = log_reader
        self.rng = rng
        self.meta = meta
        self.history = history
        self.quorum = replace(quorum_state)
        self.now = now_ms
        applied = quorum_state.applied_offset if quorum_state.applied_offset <= meta.end else 0
        self.hw = max(meta.log_start, applied)
        self.endpoints: dict[int, str] = dict(config.bootstrap_voters)
        self.key_endpoints: dict[ReplicaKey, str] = {}
        self.learned_uuids: dict[int, str] = {}
        if config.local_endpoint:
            self.endpoints[local.id] = config.local_endpoint
        self.inflight: dict[int, InFlight] = {}
        self._next_corr = rng.randrange(1, 1 << 30)
        self.last_leader_contact_ms = -NO_DEADLINE
        self.lost_leader_ms = now_ms
        self.fetch_corr: int | None = None
        self.fetch_retry_at = 0
        self.discovery_at = 0
        self.snap_fetch: tuple[OffsetAndEpoch, int, int] | None = None  # (id, position, size)
        self.snap_installing: OffsetAndEpoch | None = None
        self.election_failures = 0
        self.recovery_requested = False
        self.shutting_down = False
        self.abandoned: tuple[int, int] = (-1, -1)  # (epoch, leader) we left on fetch timeout
        # Ready accumulation
        self._truncate_to: int | None = None
        self._chunks: list[SnapshotChunk] = []
        self._install: OffsetAndEpoch | None = None
        self._append: list[AppendBatch] = []
        self._state_dirty = False
        self._messages: list[Outbound] = []
        self._commit_dirty = False
        self._proposal_results: list[ProposalResult] = []
        self._reads: list[ReadResult] = []
        self._admin_results: list[AdminResult] = []
        self._role_change: RoleChange | None = None
        self._errors: list[str] = []
        self._pending_records: list[bytes] = []
        self._pending_base = 0
        # Lowest truncation point since the last ``ready()``: that truncation is not on disk
        # yet, so ``advance`` must not count log beyond it as durable.
        self._truncated_since_ready: int | None = None
        self.role: Role = Unattached(quorum_state.leader_epoch, NO_DEADLINE)

    # ------------------------------------------------------------------ small queries

    @property
    def epoch(self) -> int:
        return self.role.epoch

    def voters(self) -> ControlState:
        return self.history.latest

    def is_voter(self) -> bool:
        return self.history.latest.contains(self.local)

    def retired(self, replica_id: int, uuid: str | None) -> bool:
        """(replica_id, uuid) was removed from the voter set by a committed RemoveVoter: a
        replaced or retired disk. Removal sticks (KAFKA-19850), so such a replica never fetches,
        gets a vote, leads or moves an epoch here again (its requests are refused; it is never
        counted). An uncommitted removal does not retire yet: that replica may still have to be
        elected to finish it (:meth:`may_campaign`)."""
        return uuid is not None and ReplicaKey(replica_id, uuid) in self.history.at(self.hw - 1).removed

    def may_campaign(self) -> bool:
        """Voters campaign; so does a replica whose own removal is still uncommitted in its
        log. Without that, a leader that removed itself and then lost its followers (zombie
        resign) could hold the only copy of the longest log while refusing to campaign, and
        the others could not win its vote: no leader ever again. Electing it is safe: votes are
        counted over its latest voter set (without itself), and once leader it finishes the
        removal and resigns (KIP-856 "leader removing itself", KAFKA-17608)."""
        if self.is_voter():
            return True
        return any(
            c.op == "remove" and c.key.id == self.local.id and c.key.uuid in (None, self.local.uuid)
            for c in self.history.voter_changes_from(self.hw)
        )

    def leader_state(self) -> LeaderState | None:
        return self.role.state if isinstance(self.role, Leader) else None

    def leader_id(self) -> int:
        if isinstance(self.role, Leader):
            return self.local.id
        if isinstance(self.role, Follower):
            return self.role.leader_id
        return -1

    def endpoint_of(self, replica_id: int) -> str | None:
        return self.endpoints.get(replica_id)

    def leader_endpoint(self) -> str | None:
        lid = self.leader_id()
        return self.endpoint_of(lid) if lid >= 0 else None

    def other_voters(self) -> list[ReplicaKey]:
        me = self.voters().find(self.local)
        return [v for v in self.voters().sorted_voters() if v != me]

    # ------------------------------------------------------------------ outbound

    def new_corr(self) -> int:
        self._next_corr += 1
        return self._next_corr

    def send_request(self, dest: ReplicaKey, kind: RequestKind, msg: Message, extra_timeout: int = 0) -> None:
        corr = msg.correlation_id
        self.inflight[corr] = InFlight(
            corr, dest, kind, self.epoch, self.now + self.config.request_timeout_ms + extra_timeout
        )
        self._messages.append(Outbound(dest.id, self.endpoint_of(dest.id), msg))

    def respond(self, dest_id: int, msg: Message) -> None:
        assert not is_request(msg)
        self._messages.append(Outbound(dest_id, self.endpoint_of(dest_id), msg))

    def learn_endpoint(self, replica_id: int, endpoint: str | None, uuid: str | None = None) -> None:
        if endpoint:
            self.endpoints[replica_id] = endpoint
            if uuid is not None:
                self.key_endpoints[ReplicaKey(replica_id, uuid)] = endpoint

    def learn_record_endpoints(self, controls: Iterable[ControlRecord]) -> None:
        """Endpoints of voters come from their AddVoter records (KIP-856) and configuration."""
        for c in controls:
            if isinstance(c, AddVoter) and c.endpoint:
                self.learn_endpoint(c.voter.id, c.endpoint, c.voter.uuid)

    def learn_uuid(self, replica_id: int, uuid: str | None) -> None:
        # Bootstrapping (KIP-856): the leader learns the voters' UUIDs from their RPCs.
        if uuid is not None and replica_id in self.config.bootstrap_voters:
            self.learned_uuids[replica_id] = uuid

    # ------------------------------------------------------------------ timers

    def election_deadline(self) -> int:
        base = self.config.election_timeout_ms
        return self.now + base + self.rng.randrange(base)

    def backoff_deadline(self) -> int:
        # Exponential backoff after lost elections, capped (KIP-595 election.backoff.max.ms).
        cap = max(1, min(self.config.election_backoff_max_ms, 50 * (2 ** min(self.election_failures, 10))))
        return self.now + self.config.election_timeout_ms // 2 + self.rng.randrange(cap)

    # ------------------------------------------------------------------ persistence & roles

    def persist(self, leader_id: int, epoch: int, voted: ReplicaKey | None) -> None:
        if not epoch_allowed(epoch):
            raise KraftError(ErrorCode.INVALID_REQUEST, f"epoch {epoch} is outside [0, {MAX_EPOCH}]")
        self.quorum = QuorumState(
            cluster_id=self.cluster_id,
            leader_id=leader_id,
            leader_epoch=epoch,
            voted_id=voted.id if voted is not None else -1,
            voted_uuid=voted.uuid if voted is not None else None,
            applied_offset=self.quorum.applied_offset,
        )
        self._state_dirty = True

    def set_role(self, role: Role, election_latency: int | None = None) -> None:
        old = self.role
        self.flush_pending_records()  # with the old leader epoch
        if isinstance(old, Follower) and not isinstance(role, Follower):
            self.lost_leader_ms = self.now
            if self.now >= old.fetch_deadline:
                self.abandoned = (old.epoch, old.leader_id)
            self.snap_fetch = None
        self.fetch_corr = None
        self.role = role
        if isinstance(old, Leader) and not isinstance(role, Leader):
            self.on_leadership_lost(old.state)
        self._role_change = self.role_view(election_latency)

    def role_view(self, election_latency: int | None = None) -> RoleChange:
        """The current role as the driver publishes it."""
        return RoleChange(
            role=self.role.name,
            epoch=self.role.epoch,
            leader_id=self.leader_id(),
            leader_endpoint=self.leader_endpoint(),
            is_voter=self.is_voter(),
            at_ms=self.now,
            election_latency_ms=election_latency,
        )

    def on_leadership_lost(self, ls: LeaderState) -> None:
        """Complete everything that waited on this leader (called from set_role)."""
        for last, epoch in ls.proposals:
            self._proposal_results.append(
                ProposalResult(last, epoch, ErrorCode.LEADERSHIP_LOST, "leadership lost before commit")
            )
        ls.proposals.clear()
        for read_id, _round in ls.pending_reads:
            self._reads.append(ReadResult(read_id, -1, ErrorCode.NOT_LEADER, "leadership lost"))
        ls.pending_reads.clear()
        for op in ls.admin:
            code = ErrorCode.LEADERSHIP_LOST if op.appended_offset >= 0 else ErrorCode.NOT_LEADER
            self._admin_results.append(AdminResult(op.request_id, code, "leadership lost", -1, self.epoch))
        ls.admin.clear()
        for corr, pf in list(ls.parked.items()):
            self.answer_fetch_not_leader(pf.request)
            del ls.parked[corr]

    def answer_fetch_not_leader(self, req: FetchRequest) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ log changes

    def flush_pending_records(self) -> None:
        """Group commit: every proposal since the last ``ready()`` becomes one batch."""
        if not self._pending_records:
            return
        recs = self._pending_records
        self._pending_records = []
        step = self.config.max_batch_records
        base = self._pending_base
        for i in range(0, len(recs), step):
            chunk = tuple(recs[i : i + step])
            self._append.append(LeaderBatch(base, self.epoch, chunk, (), self.now))
            base += len(chunk)

    def append_control(self, controls: tuple[ControlRecord, ...]) -> int:
        """Leader appends one control batch; returns its base offset. Applied at once
        (KIP-856: voter records take effect when read, not when committed)."""
        self.flush_pending_records()
        base = self.meta.end
        batch = LeaderBatch(base, self.epoch, (), controls, self.now)
        self._append.append(batch)
        self.meta.append(base, self.epoch, len(controls))
        before = self.voters()
        self.history.apply_batch(base, controls)
        self.learn_record_endpoints(controls)
        if self.voters() != before:
            self.on_voters_changed(before)
        return base

    def on_voters_changed(self, before: ControlState) -> None:
        """Hook: the latest voter set changed (append or truncation)."""

    def truncate(self, to: int) -> None:
        """Truncate the log to end offset ``to`` (KIP-595 DivergingEpoch); reverts the
        uncommitted voter records above it (KIP-856)."""
        if to < self.hw:
            self._errors.append(f"refusing to truncate to {to} below the high watermark {self.hw}")
            return
        self.meta.truncate(to)
        if self._truncated_since_ready is None or to < self._truncated_since_ready:
            self._truncated_since_ready = to
        before = self.voters()
        self.history.truncate(to)
        # Batches not yet handed to the driver that the truncation removes are dropped or cut,
        # so that "truncate, then append" in the Ready stays correct.
        kept: list[AppendBatch] = []
        for b in self._append:
            if b.next_offset <= to:
                kept.append(b)
            elif b.base_offset < to and isinstance(b, RawBatches):
                size, infos = 0, []
                for info in b.infos:
                    if info.next_offset > to:
                        break
                    infos.append(info)
                    size += info.size_bytes
                if infos:
                    kept.append(RawBatches(b.data[:size], tuple(infos)))
            elif b.base_offset < to and isinstance(b, LeaderBatch) and not b.controls:
                kept.append(replace(b, records=b.records[: to - b.base_offset]))
        self._append = kept
        self._truncate_to = to if self._truncate_to is None else min(self._truncate_to, to)
        if self.voters() != before:
            self.on_voters_changed(before)

    def set_hw(self, new_hw: int) -> None:
        if new_hw <= self.hw:
            return  # never decreases (KIP-856 / KAFKA-16530)
        self.hw = new_hw
        self._commit_dirty = True
        self.on_hw_advanced()

    def on_hw_advanced(self) -> None:
        """Hook for the leader's completions."""

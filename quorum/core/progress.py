"""Leader-side state: per-replica progress keyed by (id, UUID), the high-watermark rule,
parked (long-polled) Fetch requests and read-index confirmation rounds.

KIP-856: the leader tracks fetch offsets per (id, UUID), so the old and the new disk of one
replica id are two replicas. A bootstrap voter key (uuid None) is matched by any progress entry
of its id. KIP-595 / KIP-856 high watermark: the majority-th largest end offset among the
voters of the latest (possibly uncommitted) voter set; the leader counts itself only if it is in
that set (KAFKA-17608) and only its durable end; the value never decreases (KAFKA-16530) and
only moves once it covers the leader's own LeaderChangeMessage (an entry of its own epoch, the
"single-server change bug" fix).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quorum.core.messages import FetchRequest
from quorum.core.voters import ControlState
from quorum.types import ReplicaKey


@dataclass
class ReplicaProgress:
    key: ReplicaKey
    end_offset: int = -1  # last fetch offset: everything below is on the replica's disk
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    endpoint: str | None = None
    acked_round: int = 0  # latest read-index round this replica's Fetch confirmed


@dataclass
class ParkedFetch:
    request: FetchRequest
    deadline: int


@dataclass
class AdminOp:
    """An AddVoter / RemoveVoter / reassign call being handled by this leader."""

    request_id: int
    op: str  # "add" | "remove" | "reassign"
    key: ReplicaKey
    started_ms: int
    deadline_ms: int
    appended_offset: int = -1  # offset of the record once appended
    target: tuple[int, ...] | None = None


@dataclass
class LeaderState:
    epoch: int
    epoch_start_offset: int  # offset of this epoch's LeaderChangeMessage
    granting: tuple[ReplicaKey, ...]
    elected_ms: int
    progress: dict[ReplicaKey, ReplicaProgress] = field(default_factory=dict)
    parked: dict[int, ParkedFetch] = field(default_factory=dict)
    begin_epoch_due: dict[ReplicaKey, int] = field(default_factory=dict)  # voter -> next send time
    begin_epoch_inflight: set[ReplicaKey] = field(default_factory=set)
    read_round: int = 0
    pending_reads: list[tuple[int, int]] = field(default_factory=list)  # (read_id, round)
    admin: list[AdminOp] = field(default_factory=list)
    bootstrap_offset: int = -1  # offset of the bootstrap AddVoter batch written by this leader
    bootstrap_done: bool = False
    proposals: list[tuple[int, int]] = field(default_factory=list)  # (last_offset, epoch)
    resign_after: int = -1  # own RemoveVoter offset: resign once it is committed
    reassign_step_offset: int = -1
    recovery_reported: bool = False

    def replica(self, key: ReplicaKey) -> ReplicaProgress:
        p = self.progress.get(key)
        if p is None:
            p = ReplicaProgress(key)
            self.progress[key] = p
        return p

    def forget_observers(self, voters: ControlState, now: int, expiry_ms: int, keep: int) -> None:
        """Drop observers (non-voters) that have not fetched within ``expiry_ms``, then the
        least recently fetching ones beyond ``keep`` (no unbounded state from
        made-up replicas)."""
        observers = [p for k, p in self.progress.items() if not voters.contains(k)]
        stale = {p.key for p in observers if p.last_fetch_ms < now - expiry_ms}
        live = sorted((p for p in observers if p.key not in stale), key=lambda p: p.last_fetch_ms)
        stale.update(p.key for p in live[: max(0, len(live) - keep)])
        for k in stale:
            del self.progress[k]

    def progress_of_voter(self, voter: ReplicaKey) -> ReplicaProgress | None:
        """The progress entry that stands for ``voter`` (a uuid-None bootstrap voter is matched
        by the most advanced replica of its id)."""
        if voter.uuid is not None:
            return self.progress.get(voter)
        best: ReplicaProgress | None = None
        for p in self.progress.values():
            if p.key.id == voter.id and (best is None or p.end_offset > best.end_offset):
                best = p
        return best

    def majority_end(self, voters: ControlState, local: ReplicaKey, local_durable_end: int) -> int:
        """The majority-th largest end offset among the voters (-1 if not enough known)."""
        offsets: list[int] = []
        for v in voters.voters:
            if voters.find(local) == v:
                offsets.append(local_durable_end)
                continue
            p = self.progress_of_voter(v)
            offsets.append(p.end_offset if p is not None else -1)
        if not offsets:
            return -1
        offsets.sort(reverse=True)
        return offsets[voters.majority - 1]

    def confirmed_round(self, voters: ControlState, local: ReplicaKey) -> int:
        """The latest read-index round acknowledged by a majority of voters (the leader
        confirms itself for every round when it is a voter)."""
        rounds: list[int] = []
        for v in voters.voters:
            if voters.find(local) == v:
                rounds.append(self.read_round)
                continue
            p = self.progress_of_voter(v)
            rounds.append(p.acked_round if p is not None else 0)
        if not rounds:
            return 0
        rounds.sort(reverse=True)
        return rounds[voters.majority - 1]

    def majority_fetched_since(self, voters: ControlState, local: ReplicaKey, since_ms: int) -> bool:
        """Zombie-leader check (KIP-595): did a majority of voters fetch at or after
        ``since_ms`` (the leader counts as live for itself when it is a voter)?"""
        live = 0
        for v in voters.voters:
            if voters.find(local) == v:
                live += 1
                continue
            p = self.progress_of_voter(v)
            if p is not None and p.last_fetch_ms >= since_ms:
                live += 1
        return live >= voters.majority

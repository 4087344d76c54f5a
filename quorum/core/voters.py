"""The voter set and its history by log offset (KIP-856 "Internal Listener").

KIP-856 makes replicas read AddVoter / RemoveVoter records as soon as they are in the log,
committed or not, and revert them when the log is truncated. So the core keeps, for every
control record that changed something, the :class:`ControlState` in effect *from that offset
on*; truncating the log drops the entries at or after the new end, which reverts uncommitted
voter changes. The pending voter change (KAFKA-20740) is derived from this history: an entry
between the high watermark and the log end whose voter set differs from the one before it.

Bootstrapping (KIP-856): while the log holds no voter record, the voters are the configured
ids with ``uuid=None``; such a key matches any UUID for its id. The first AddVoter record read
replaces the bootstrap set (the first leader writes one AddVoter per bootstrap voter in one
batch, so replicas never act on a partial set: batches are appended whole).

Removed keys are remembered (KAFKA-19850: a removed (id, UUID) stays removed); snapshots carry
them as RemoveVoter records so the memory survives log compaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from quorum.types import (
    AddVoter,
    ControlRecord,
    LeaderRecovery,
    LeaderRecoveryState,
    RemoveVoter,
    ReplicaKey,
    TargetVoters,
)


@dataclass(frozen=True)
class ControlState:
    """Everything the core derives from control records at one point of the log."""

    voters: frozenset[ReplicaKey]
    from_log: bool = False  # False: the bootstrap set (keys with uuid None)
    removed: frozenset[ReplicaKey] = frozenset()
    target_voters: tuple[int, ...] | None = None
    recovery: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    lost_after: int = -1

    @staticmethod
    def bootstrap(ids: Iterable[int], initial: bool = True) -> ControlState:
        """The state before any voter record: the configured voters as uuid-None keys, or no
        voters at all for a replica formatted to replace a lost disk (``initial=False``)."""
        return ControlState(frozenset(ReplicaKey(i, None) for i in ids) if initial else frozenset())

    def find(self, key: ReplicaKey) -> ReplicaKey | None:
        """The voter entry matching ``key``: exact, or a bootstrap entry (uuid None) for its id,
        or (when ``key.uuid`` is None) the only voter with that id."""
        if key in self.voters:
            return key
        wild = ReplicaKey(key.id, None)
        if wild in self.voters:
            return wild
        if key.uuid is None:
            same = [v for v in self.voters if v.id == key.id]
            if len(same) == 1:
                return same[0]
        return None

    def contains(self, key: ReplicaKey) -> bool:
        return self.find(key) is not None

    def ids(self) -> set[int]:
        return {v.id for v in self.voters}

    def sorted_voters(self) -> list[ReplicaKey]:
        return sorted(self.voters, key=lambda k: (k.id, k.uuid or ""))

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    def apply(self, c: ControlRecord) -> ControlState:
        """The state after control record ``c`` (records that do not change it return self)."""
        if isinstance(c, AddVoter):
            voters = self.voters | {c.voter} if self.from_log else frozenset({c.voter})
            return replace(self, voters=voters, from_log=True)
        if isinstance(c, RemoveVoter):
            if c.voter not in self.voters:
                return replace(self, removed=self.removed | {c.voter})
            voters = self.voters - {c.voter}
            return replace(self, voters=voters, removed=self.removed | {c.voter}, from_log=True)
        if isinstance(c, TargetVoters):
            return replace(self, target_voters=c.ids)
        if isinstance(c, LeaderRecovery):
            return replace(self, recovery=c.state, lost_after=c.lost_after)
        return self

    def to_controls(self, endpoints: Mapping[ReplicaKey, str]) -> tuple[ControlRecord, ...]:
        """The control records a snapshot carries so that :meth:`apply`-ing them to the
        bootstrap state rebuilds this state (KIP-856 "Snapshots")."""
        out: list[ControlRecord] = []
        if self.from_log:
            out.extend(AddVoter(v, endpoints.get(v)) for v in self.sorted_voters())
        out.extend(RemoveVoter(k) for k in sorted(self.removed, key=lambda k: (k.id, k.uuid or "")))
        if self.target_voters is not None:
            out.append(TargetVoters(self.target_voters))
        if self.recovery is not LeaderRecoveryState.RECOVERED or self.lost_after != -1:
            out.append(LeaderRecovery(self.recovery, self.lost_after))
        return tuple(out)


VoterChangeOp = Literal["add", "remove", "bootstrap"]


@dataclass(frozen=True)
class VoterChange:
    """A voter change found in the log: ``op`` is "add" or "remove" of ``key``, or "bootstrap"
    (the first voter set written to the log, KIP-856; ``key`` is then ``(-1, None)``)."""

    offset: int
    op: VoterChangeOp
    key: ReplicaKey


class ControlHistory:
    """``(offset, ControlState)`` entries, ascending: the state in effect from ``offset`` on.

    Invariant: ``entries[0]`` is the base (offset -1 or the snapshot offset - 1) and is never
    truncated; entries are strictly ascending by offset."""

    def __init__(self, base: ControlState, base_offset: int = -1) -> None:
        self.entries: list[tuple[int, ControlState]] = [(base_offset, base)]

    @property
    def latest(self) -> ControlState:
        return self.entries[-1][1]

    def at(self, offset: int) -> ControlState:
        """The state after applying every record at offsets <= ``offset``."""
        for off, st in reversed(self.entries):
            if off <= offset:
                return st
        return self.entries[0][1]

    def apply_batch(self, base_offset: int, controls: Iterable[ControlRecord]) -> bool:
        """Apply one control batch; returns True if the voter set changed. One entry per batch:
        a batch is written, replicated and committed whole (the high watermark only ever sits
        at batch boundaries), which is what makes the bootstrap batch atomic (KIP-856)."""
        cur = self.latest
        nxt = cur
        for c in controls:
            nxt = nxt.apply(c)
        if nxt == cur:
            return False
        self.entries.append((base_offset, nxt))
        return nxt.voters != cur.voters

    def truncate(self, end_offset: int) -> bool:
        """Drop entries at offsets >= ``end_offset``; True if the voter set changed."""
        before = self.latest.voters
        while len(self.entries) > 1 and self.entries[-1][0] >= end_offset:
            self.entries.pop()
        return self.latest.voters != before

    def reset(self, base: ControlState, base_offset: int) -> None:
        self.entries = [(base_offset, base)]

    def prune_below(self, offset: int) -> None:
        """Forget entries older than the one in effect at ``offset`` (log start moved)."""
        keep = 0
        for i, (off, _st) in enumerate(self.entries):
            if off <= offset:
                keep = i
        if keep:
            self.entries = self.entries[keep:]

    def voter_changes_from(self, offset: int) -> list[VoterChange]:
        """Voter changes at offsets >= ``offset`` in log order (uncommitted ones when
        ``offset`` is the high watermark)."""
        out: list[VoterChange] = []
        for i in range(1, len(self.entries)):
            off, st = self.entries[i]
            if off < offset:
                continue
            prev = self.entries[i - 1][1]
            if st.voters == prev.voters:
                continue
            if not prev.from_log:
                out.append(VoterChange(off, "bootstrap", ReplicaKey(-1, None)))
                continue
            for k in st.voters - prev.voters:
                out.append(VoterChange(off, "add", k))
            for k in prev.voters - st.voters:
                out.append(VoterChange(off, "remove", k))
        return out


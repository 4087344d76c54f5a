"""The replica roles of KIP-595 (plus KIP-996 style pre-vote), one small class each.

A role object holds only the data of that role; :class:`quorum.core.raft.RaftCore` holds one
at a time and owns the behaviour. Every role has ``name``, ``epoch`` and ``timeout_at`` (the
election or fetch deadline that ends it, None for a leader). The table below is enforced by the
``transition_to_*`` methods of :mod:`quorum.core.transitions`. Observers (replicas whose
(id, UUID) is not in their own voter set, KIP-856) use the same classes but never enter
Prospective / Candidate / Leader, with one exception: a replica whose own removal is still
uncommitted may campaign (see ``CoreBase.may_campaign``).

Transition table (epoch E; "voter" = local key in the latest voter set; every transition that
changes epoch, vote or leader is persisted through ``Ready.quorum_state`` before any message):

=================  ==============================================  ==================
from               event                                           to
=================  ==============================================  ==================
any                request/response with epoch > E, leader known   Follower(E')
any                request/response with epoch > E, no leader      Unattached(E')
Unattached(E)      grants Vote in E                                Voted(E)
Unattached/Voted   BeginQuorumEpoch / Fetch answer from leader E   Follower(E)
Unattached/Voted   election timeout, voter, pre-vote on            Prospective(E)
Unattached/Voted   election timeout, voter, pre-vote off           Candidate(E+1)
Follower(E)        no successful Fetch within fetch_timeout, voter Prospective(E)
Follower(E)        no successful Fetch within fetch_timeout, obs.  Unattached(E)
Follower(E)        EndQuorumEpoch from its leader                  Unattached(E) with
                                                                   a short timeout
Prospective(E)     majority of pre-votes granted                   Candidate(E+1)
Prospective(E)     election timeout                                Prospective(E)
                                                                   (after backoff)
Candidate(E)       majority of votes granted                       Leader(E)
Candidate(E)       election timeout                                Prospective(E)
                                                                   (after backoff)
Leader(E)          resign() / shutdown() / own RemoveVoter         Resigned(E)
                   committed / no Fetch from a majority within
                   fetch_timeout (zombie leader)
Resigned(E)        election timeout (voter)                        Prospective(E)
Resigned(E)        election timeout (observer)                     Unattached(E)
=================  ==============================================  ==================

Nothing leads back to a lower epoch: epochs are monotonic (persisted in the quorum state).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from quorum.core.progress import LeaderState
from quorum.types import ReplicaKey

RoleName = Literal["unattached", "voted", "prospective", "candidate", "leader", "follower", "resigned"]


@dataclass
class Unattached:
    epoch: int
    election_deadline: int
    name: RoleName = field(default="unattached", init=False)

    @property
    def timeout_at(self) -> int | None:
        return self.election_deadline


@dataclass
class Voted:
    epoch: int
    voted: ReplicaKey
    election_deadline: int
    name: RoleName = field(default="voted", init=False)

    @property
    def timeout_at(self) -> int | None:
        return self.election_deadline


@dataclass
class Prospective:
    """KIP-996 style pre-vote at the current epoch: nothing is persisted, no epoch bump."""

    epoch: int
    election_deadline: int
    granted: set[ReplicaKey] = field(default_factory=set)
    rejected: set[ReplicaKey] = field(default_factory=set)
    name: RoleName = field(default="prospective", init=False)

    @property
    def timeout_at(self) -> int | None:
        return self.election_deadline


@dataclass
class Candidate:
    epoch: int
    election_deadline: int
    granted: set[ReplicaKey] = field(default_factory=set)
    rejected: set[ReplicaKey] = field(default_factory=set)
    name: RoleName = field(default="candidate", init=False)

    @property
    def timeout_at(self) -> int | None:
        return self.election_deadline


@dataclass
class Follower:
    epoch: int
    leader_id: int
    fetch_deadline: int  # no successful Fetch by then -> election / rediscovery
    name: RoleName = field(default="follower", init=False)
    # The high watermark the leader last told this follower (uncapped; -1: not yet). A local
    # log end below it means committed records are still to fetch: catch-up, where the fsync
    # may be batched (quorum.core.replication, "Batched fsync").
    leader_hw: int = field(default=-1, compare=False)
    # Bytes appended since the last fsync the core asked for (catch-up fsync batching).
    unflushed_bytes: int = field(default=0, compare=False)

    @property
    def timeout_at(self) -> int | None:
        return self.fetch_deadline


@dataclass
class Leader:
    epoch: int
    state: LeaderState
    name: RoleName = field(default="leader", init=False)

    @property
    def timeout_at(self) -> int | None:
        return None  # a leader has no election timer; it resigns on a failed fetch quorum


@dataclass
class Resigned:
    epoch: int
    election_deadline: int
    name: RoleName = field(default="resigned", init=False)

    @property
    def timeout_at(self) -> int | None:
        return self.election_deadline


Role = Unattached | Voted | Prospective | Candidate | Follower | Leader | Resigned

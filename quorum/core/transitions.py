"""Role transitions of the core, as code (the table in :mod:`quorum.core.roles`), in the manner
of Kafka's ``QuorumState.transitionTo*``: each ``transition_to_*`` checks that the move is
allowed from the current role and epoch, queues the quorum-state write when epoch, vote or
leader change (``Ready.quorum_state``: the driver persists it before any message of the same
Ready leaves, so the role never acts on unsaved state), and then makes the role current.

An illegal move raises :class:`IllegalTransition`: it is a bug in the core, never the result
of input (handlers check input before they move).
"""

from __future__ import annotations

from quorum.core.base import CoreBase
from quorum.core.progress import LeaderState
from quorum.core.roles import Candidate, Follower, Leader, Prospective, Resigned, Role, Unattached, Voted
from quorum.types import ReplicaKey

NOT_LEADER = (Unattached, Voted, Prospective, Candidate, Follower, Resigned)


class IllegalTransition(RuntimeError):
    """A role change the transition table does not allow."""


class Transitions(CoreBase):
    def _check_move(self, to: str, epoch: int, same_epoch_from: tuple[type[Role], ...]) -> None:
        cur = self.role
        if epoch < cur.epoch or (epoch == cur.epoch and not isinstance(cur, same_epoch_from)):
            raise IllegalTransition(f"{cur.name}({cur.epoch}) -> {to}({epoch}) is not a legal transition")

    def transition_to_unattached(self, epoch: int, deadline: int | None = None) -> None:
        """Higher epoch from any role; same epoch from any role but Leader (EndQuorumEpoch,
        fetch timeout of an observer, a resigned observer's timeout)."""
        self._check_move("unattached", epoch, NOT_LEADER)
        if epoch > self.quorum.leader_epoch:
            self.persist(-1, epoch, None)
        self.set_role(Unattached(epoch, self.election_deadline() if deadline is None else deadline))

    def transition_to_voted(self, candidate: ReplicaKey) -> None:
        """Grant the vote of the current epoch (once per epoch: persisted with its UUID)."""
        self._check_move("voted", self.epoch, (Unattached, Prospective))
        self.persist(-1, self.epoch, candidate)
        self.set_role(Voted(self.epoch, candidate, self.election_deadline()))

    def transition_to_prospective(self, granted: set[ReplicaKey]) -> None:
        """KIP-996 style pre-vote at the current epoch: nothing persisted, no epoch bump."""
        self._check_move(
            "prospective", self.epoch, (Unattached, Voted, Prospective, Candidate, Follower, Resigned)
        )
        self.set_role(Prospective(self.epoch, self.election_deadline(), granted=granted))

    def transition_to_candidate(self, granted: set[ReplicaKey]) -> None:
        """Epoch + 1 with a vote for ourselves, persisted before the Vote requests leave."""
        if isinstance(self.role, Leader):
            raise IllegalTransition(f"leader({self.epoch}) -> candidate is not a legal transition")
        epoch = self.epoch + 1
        self.persist(-1, epoch, self.local)
        self.set_role(Candidate(epoch, self.election_deadline(), granted=granted))

    def transition_to_leader(self, state: LeaderState, election_latency: int) -> None:
        """Only a candidate that won its epoch."""
        self._check_move("leader", state.epoch, (Candidate,))
        if state.epoch != self.epoch:
            raise IllegalTransition(f"leader state of epoch {state.epoch} in epoch {self.epoch}")
        self.persist(self.local.id, self.epoch, self.local)
        self.set_role(Leader(self.epoch, state), election_latency=election_latency)

    def transition_to_follower(self, epoch: int, leader_id: int, leader_endpoint: str | None) -> None:
        """Higher epoch from any role; same epoch only from a role that knows no leader."""
        if leader_id == self.local.id:
            raise IllegalTransition(f"cannot follow ourselves (replica {leader_id}) in epoch {epoch}")
        self._check_move("follower", epoch, (Unattached, Voted, Prospective, Candidate))
        self.learn_endpoint(leader_id, leader_endpoint)
        voted = None
        if epoch == self.quorum.leader_epoch and self.quorum.voted_id >= 0:
            voted = ReplicaKey(self.quorum.voted_id, self.quorum.voted_uuid)
        if self.quorum.leader_epoch != epoch or self.quorum.leader_id != leader_id:
            self.persist(leader_id, epoch, voted)
        self.fetch_retry_at = self.now
        self.set_role(Follower(epoch, leader_id, self.now + self.config.fetch_timeout_ms))

    def transition_to_resigned(self) -> None:
        """A leader giving up its epoch (the quorum state already names it: nothing to save)."""
        self._check_move("resigned", self.epoch, (Leader,))
        self.set_role(Resigned(self.epoch, self.election_deadline()))

    def observe_leader(self, epoch: int, leader_id: int, leader_endpoint: str | None) -> bool:
        """React to (epoch, leader) seen in any RPC. Returns True if the role changed."""
        if epoch < self.epoch:
            return False
        if epoch > self.epoch:
            if leader_id >= 0 and leader_id != self.local.id:
                self.transition_to_follower(epoch, leader_id, leader_endpoint)
            else:
                self.transition_to_unattached(epoch)
            return True
        if leader_id >= 0 and leader_id != self.local.id and not isinstance(self.role, (Follower, Leader)):
            if self.abandoned == (epoch, leader_id):
                # We left this leader after the fetch timeout; others still naming it is not
                # evidence that it lives (stale hints would pin us to a dead leader).
                return False
            if isinstance(self.role, Resigned):
                return False  # we led this epoch: nobody else can
            self.transition_to_follower(epoch, leader_id, leader_endpoint)
            return True
        return False

"""Leader election (KIP-595 Vote / BeginQuorumEpoch / EndQuorumEpoch) with pre-vote
(KIP-996 idea) and the KIP-856 vote rule.

Rules implemented here (epoch E is the local epoch):

* Vote: stale epochs get FENCED_LEADER_EPOCH; a wrong ``voter_id`` / ``voter_uuid`` gets
  INVALID_REQUEST (KIP-856 "Vote" handling), and so does a Vote addressed to the uuid-less
  bootstrap key when this replica is a replacement disk (``initial_bootstrap=False``). A vote
  is granted at most once per epoch (the vote, with its UUID, is persisted before the answer
  leaves) and only to a candidate whose log (last epoch, end offset) is at least as up to date
  as ours. KIP-856 removes the "candidate must be a voter" check: membership is not consulted
  when granting.
* Pre-vote: no epoch bump and nothing persisted on either side; refused while the voter has
  heard from a live leader within ``fetch_timeout`` (or is the leader), so a rejoining or
  partitioned replica cannot disrupt a healthy quorum.
* Only replicas in their own latest voter set ever become prospective / candidate (plus a
  replica whose own removal is still uncommitted: ``CoreBase.may_campaign``).
* EndQuorumEpoch: preferred successors (spec 003) are ordered by log progress; the one at
  position i starts its election after about ``i * election_timeout / 2``.
* Zombie leader: a leader without Fetch from a majority of voters within ``fetch_timeout``
  resigns.
"""

from __future__ import annotations

from quorum.core.base import NO_DEADLINE, InFlight, epoch_allowed
from quorum.core.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    VoteRequest,
    VoteResponse,
)
from quorum.core.progress import LeaderState
from quorum.core.roles import Candidate, Follower, Leader, Prospective, Resigned, Unattached, Voted
from quorum.core.transitions import Transitions
from quorum.types import ErrorCode, LeaderChange, ReplicaKey


class ElectionMixin(Transitions):
    # ------------------------------------------------------------------ helpers

    def bad_target(self, cluster_id: str, voter_id: int, voter_uuid: str | None) -> ErrorCode | None:
        if cluster_id != self.cluster_id:
            return ErrorCode.INCONSISTENT_CLUSTER_ID
        if voter_id != self.local.id:
            return ErrorCode.INVALID_REQUEST
        if voter_uuid is not None and self.local.uuid is not None and voter_uuid != self.local.uuid:
            return ErrorCode.INVALID_REQUEST
        return None

    def has_live_leader(self) -> bool:
        if isinstance(self.role, Leader):
            return True
        return (
            isinstance(self.role, Follower)
            and self.now - self.last_leader_contact_ms < self.config.fetch_timeout_ms
        )

    def log_up_to_date(self, last_epoch: int, end_offset: int) -> bool:
        return (last_epoch, end_offset) >= (self.meta.last_epoch(), self.meta.end)

    def count_granted(self, granted: set[ReplicaKey]) -> int:
        return sum(1 for v in self.voters().voters if v in granted)

    # ------------------------------------------------------------------ starting elections

    def start_election(self) -> None:
        if not self.may_campaign() or self.shutting_down:
            return
        if not epoch_allowed(self.epoch + 1):
            self._errors.append(f"epoch {self.epoch} is at the int32 limit: not campaigning")
            return
        if self.config.pre_vote:
            self.become_prospective()
        else:
            self.become_candidate()

    def campaign_above(self, epoch: int) -> None:
        """The leader, told a voter is at ``epoch`` above its own: a real (not pre-) election at
        ``epoch + 1`` at once, which it wins with its followers' votes (see
        :meth:`vote_is_disruptive`: a follower grants its own leader's Vote)."""
        if self.shutting_down or not epoch_allowed(epoch + 1) or not self.may_campaign():
            return
        self.transition_to_unattached(epoch)
        self.become_candidate()

    def become_prospective(self) -> None:
        me = self.voters().find(self.local)
        self.transition_to_prospective({me} if me is not None else set())
        self.send_votes(pre_vote=True)
        self.check_votes()

    def become_candidate(self) -> None:
        me = self.voters().find(self.local)
        self.transition_to_candidate({me} if me is not None else set())
        self.send_votes(pre_vote=False)
        self.check_votes()

    def send_votes(self, pre_vote: bool) -> None:
        for v in self.other_voters():
            req = VoteRequest(
                correlation_id=self.new_corr(),
                cluster_id=self.cluster_id,
                candidate_id=self.local.id,
                candidate_uuid=self.local.uuid,
                candidate_epoch=self.epoch + 1 if pre_vote else self.epoch,
                voter_id=v.id,
                voter_uuid=v.uuid,
                last_offset_epoch=self.meta.last_epoch(),
                last_offset=self.meta.end,
                candidate_endpoint=self.config.local_endpoint,
                pre_vote=pre_vote,
            )
            self.send_request(v, "prevote" if pre_vote else "vote", req)

    def check_votes(self) -> None:
        role = self.role
        if not isinstance(role, (Prospective, Candidate)):
            return
        voters = self.voters()
        if self.count_granted(role.granted) >= voters.majority:
            if isinstance(role, Prospective):
                self.become_candidate()
            else:
                self.become_leader(role)
            return
        if sum(1 for v in voters.voters if v in role.rejected) > len(voters.voters) - voters.majority:
            # Lost: back off (exponentially) before the next pre-vote round.
            self.election_failures += 1
            role.election_deadline = self.backoff_deadline()

    def become_leader(self, cand: Candidate) -> None:
        epoch = self.epoch
        ls = LeaderState(
            epoch=epoch,
            epoch_start_offset=self.meta.end,
            granting=tuple(sorted(cand.granted, key=lambda k: (k.id, k.uuid or ""))),
            elected_ms=self.now,
        )
        self.election_failures = 0
        self.recovery_requested = False
        self.transition_to_leader(ls, election_latency=self.now - self.lost_leader_ms)
        voters = tuple(self.voters().sorted_voters())
        self.append_control((LeaderChange(self.local.id, voters, ls.granting),))
        for v in self.other_voters():
            ls.begin_epoch_due[v] = self.now
        self.send_begin_epochs(ls)
        self.leader_became_active(ls)

    def leader_became_active(self, ls: LeaderState) -> None:
        """Hook (membership / replication)."""

    def send_begin_epochs(self, ls: LeaderState) -> None:
        for v, due in list(ls.begin_epoch_due.items()):
            if due > self.now or v in ls.begin_epoch_inflight:
                continue
            if not self.voters().contains(v):
                del ls.begin_epoch_due[v]
                continue
            ls.begin_epoch_inflight.add(v)
            req = BeginQuorumEpochRequest(
                correlation_id=self.new_corr(),
                cluster_id=self.cluster_id,
                leader_id=self.local.id,
                leader_epoch=self.epoch,
                voter_id=v.id,
                voter_uuid=v.uuid,
                leader_uuid=self.local.uuid,
                leader_endpoint=self.config.local_endpoint,
            )
            self.send_request(v, "begin", req)

    def resign_leadership(self) -> None:
        """Leader -> Resigned, telling the voters with EndQuorumEpoch (KIP-595; KIP-856 step 7
        of RemoveVoter; KIP-642 leader removing itself last)."""
        ls = self.leader_state()
        if ls is None:
            return
        others = self.other_voters()

        def progress(k: ReplicaKey) -> int:
            p = ls.progress_of_voter(k)
            return p.end_offset if p is not None else -1

        successors = tuple(sorted(others, key=lambda k: (-progress(k), k.id)))
        for v in others:
            req = EndQuorumEpochRequest(
                correlation_id=self.new_corr(),
                cluster_id=self.cluster_id,
                leader_id=self.local.id,
                leader_epoch=self.epoch,
                voter_id=v.id,
                voter_uuid=v.uuid,
                preferred_successors=successors,
                leader_uuid=self.local.uuid,
                leader_endpoint=self.config.local_endpoint,
            )
            self.send_request(v, "end", req)
        self.transition_to_resigned()

    # ------------------------------------------------------------------ Vote

    def handle_vote_request(self, req: VoteRequest) -> None:
        def answer(code: ErrorCode, granted: bool) -> None:
            self.respond(
                req.candidate_id,
                VoteResponse(
                    req.correlation_id,
                    code,
                    self.leader_id(),
                    self.epoch,
                    granted,
                    self.leader_endpoint(),
                    req.pre_vote,
                    self.local.id,
                    self.local.uuid,
                ),
            )

        err = self.bad_target(req.cluster_id, req.voter_id, req.voter_uuid)
        if err is None and not epoch_allowed(req.candidate_epoch):
            err = ErrorCode.INVALID_REQUEST  # at the int32 limit: never adopted
        if err is None and req.voter_uuid is None and not self.config.initial_bootstrap:
            # The candidate asks "bootstrap voter <id>" (it does not know the UUID): only the
            # directory formatted with the cluster may answer for that. A replacement disk
            # voting there would stand in for a log it never had (the simulation found an
            # election won with such a vote that lost committed data).
            err = ErrorCode.INVALID_REQUEST
        if err is not None:
            answer(err, False)
            return
        if self.retired(req.candidate_id, req.candidate_uuid):
            answer(ErrorCode.NONE, False)  # a removed (id, UUID) never runs again, at any epoch
            return
        self.learn_uuid(req.candidate_id, req.candidate_uuid)
        cand = ReplicaKey(req.candidate_id, req.candidate_uuid)
        up_to_date = self.log_up_to_date(req.last_offset_epoch, req.last_offset)
        if req.pre_vote:
            ok = req.candidate_epoch > self.epoch or (
                req.candidate_epoch == self.epoch and not isinstance(self.role, (Leader, Follower, Resigned))
            )
            answer(ErrorCode.NONE, ok and up_to_date and not self.has_live_leader())
            return
        if req.candidate_epoch < self.epoch:
            answer(ErrorCode.FENCED_LEADER_EPOCH, False)
            return
        if req.candidate_epoch > self.epoch and self.vote_is_disruptive(cand):
            answer(ErrorCode.NONE, False)  # refused without adopting the candidate's epoch
            return
        if req.candidate_epoch > self.epoch:
            # Raft (5.2): only hearing from a leader or granting a vote resets the election
            # timer. Adopting a higher epoch from a candidate we may reject must not, or a
            # candidate with a stale log that retries faster than the others' timeouts keeps
            # them from ever campaigning (a livelock the simulation found).
            self.transition_to_unattached(req.candidate_epoch, deadline=self.role.timeout_at)
        q = self.quorum
        granted = False
        if q.leader_epoch == self.epoch and q.voted_id >= 0:
            granted = q.voted_id == cand.id and (
                q.voted_uuid is None or cand.uuid is None or q.voted_uuid == cand.uuid
            )
        elif self.leader_id() >= 0 or (q.leader_epoch == self.epoch and q.leader_id >= 0):
            granted = False
        elif isinstance(self.role, (Unattached, Voted, Prospective)):
            granted = up_to_date
            if granted:
                self.transition_to_voted(cand)
        answer(ErrorCode.NONE, granted)

    def vote_is_disruptive(self, cand: ReplicaKey) -> bool:
        """Refuse a Vote of a higher epoch, without bumping ours:

        * while we heard from a live leader within the fetch timeout (or lead): Raft
          dissertation 4.2.3, KIP-996; a candidate the majority still follows cannot win, and
          a removed or partitioned replica must not make the quorum change epochs;
        * from a replica that is not in our voter set (a removed voter, an old disk re-attached
          under its old (id, UUID), a made-up id): it cannot make voters bump their epoch.
        * but never from the leader we follow: it runs above a voter that got ahead of its epoch
          (:meth:`campaign_above`), and its log is the longest we know.
          A replica whose own removal is still uncommitted here is still a voter here. A
          replica that knows no voter set yet (a replacement disk before it read the voter
          records) cannot tell, and keeps KIP-856's rule (membership not consulted)."""
        voters = self.voters()
        role = self.role
        if isinstance(role, Follower) and role.leader_id == cand.id and voters.contains(cand):
            return False  # our own leader, running above a voter ahead of it (campaign_above)
        if self.has_live_leader():
            return True
        return bool(voters.voters) and not voters.contains(cand)

    def handle_vote_response(self, resp: VoteResponse, inf: InFlight) -> None:
        self.learn_uuid(inf.destination.id, resp.voter_uuid)
        if resp.leader_epoch > self.epoch or (resp.leader_epoch == self.epoch and resp.leader_id >= 0):
            if self.observe_leader(resp.leader_epoch, resp.leader_id, resp.leader_endpoint):
                return
        role = self.role
        if inf.epoch != self.epoch:
            return
        if inf.kind == "prevote" and not isinstance(role, Prospective):
            return
        if inf.kind == "vote" and not isinstance(role, Candidate):
            return
        assert isinstance(role, (Prospective, Candidate))
        if resp.error_code is ErrorCode.NONE and resp.vote_granted:
            role.granted.add(inf.destination)
        else:
            role.rejected.add(inf.destination)
        self.check_votes()

    # ------------------------------------------------------------------ BeginQuorumEpoch

    def answer_leader_notice(
        self, req: BeginQuorumEpochRequest | EndQuorumEpochRequest, code: ErrorCode
    ) -> None:
        """Answer BeginQuorumEpoch / EndQuorumEpoch with this replica's view of the leader."""
        cls = BeginQuorumEpochResponse if isinstance(req, BeginQuorumEpochRequest) else EndQuorumEpochResponse
        self.respond(
            req.leader_id,
            cls(
                req.correlation_id, code, self.leader_id(), self.epoch, self.leader_endpoint(), self.local.id
            ),
        )

    def leader_notice_rejected(self, req: BeginQuorumEpochRequest | EndQuorumEpochRequest) -> bool:
        """The checks BeginQuorumEpoch and EndQuorumEpoch share (KIP-595, KIP-856): cluster id,
        the addressed voter's (id, UUID), and a stale epoch. Answers and returns True if the
        request is refused."""
        err = self.bad_target(req.cluster_id, req.voter_id, req.voter_uuid)
        if err is None and not epoch_allowed(req.leader_epoch):
            err = ErrorCode.INVALID_REQUEST  # at the int32 limit: never adopted
        if err is None and req.leader_epoch < self.epoch:
            err = ErrorCode.FENCED_LEADER_EPOCH
        voters = self.voters()
        if (
            err is None
            and voters.voters
            and not voters.contains(ReplicaKey(req.leader_id, req.leader_uuid))
            and (isinstance(req, BeginQuorumEpochRequest) or req.leader_id != self.leader_id())
        ):
            # A replica outside our voter set cannot lead, so it cannot make us adopt
            # its epoch either (a fake peer's BeginQuorumEpoch as leader 99 at epoch 1000 moved
            # every node to epoch 1000); same rule as a Vote from a non-voter. The leader we
            # follow may still resign after its own removal (EndQuorumEpoch, KAFKA-17608).
            err = ErrorCode.NOT_VOTER
        if err is None:
            return False
        self.answer_leader_notice(req, err)
        return True

    def handle_begin_request(self, req: BeginQuorumEpochRequest) -> None:
        def answer(code: ErrorCode) -> None:
            self.answer_leader_notice(req, code)

        if self.leader_notice_rejected(req):
            return
        if req.leader_id == self.local.id or (
            req.leader_epoch == self.epoch and isinstance(self.role, (Leader, Resigned))
        ):
            # Ourselves, or another leader in the epoch we lead(ed): one leader per epoch.
            answer(ErrorCode.INVALID_REQUEST)
            return
        if not (isinstance(self.role, Follower) and self.role.epoch == req.leader_epoch):
            self.abandoned = (-1, -1)
            # Its endpoint comes from the voter set or configuration, not from this request.
            self.transition_to_follower(req.leader_epoch, req.leader_id, None)
        self.last_leader_contact_ms = self.now
        # KIP-856: a new voter fails the RPC until it has read the record that adds it.
        answer(ErrorCode.NONE if self.is_voter() else ErrorCode.NOT_VOTER)

    def handle_begin_response(self, resp: BeginQuorumEpochResponse, inf: InFlight) -> None:
        if resp.leader_epoch > self.epoch:
            self.observe_leader(resp.leader_epoch, resp.leader_id, resp.leader_endpoint)
            return
        ls = self.leader_state()
        if ls is None or inf.epoch != self.epoch:
            return
        ls.begin_epoch_inflight.discard(inf.destination)
        if resp.error_code is ErrorCode.NONE:
            ls.begin_epoch_due.pop(inf.destination, None)
        elif inf.destination in ls.begin_epoch_due:
            ls.begin_epoch_due[inf.destination] = self.now + self.config.election_timeout_ms // 2

    def begin_failed(self, inf: InFlight) -> None:
        ls = self.leader_state()
        if ls is None or inf.epoch != self.epoch:
            return
        ls.begin_epoch_inflight.discard(inf.destination)
        if inf.destination in ls.begin_epoch_due:
            ls.begin_epoch_due[inf.destination] = self.now + self.config.election_timeout_ms // 2

    # ------------------------------------------------------------------ EndQuorumEpoch

    def handle_end_request(self, req: EndQuorumEpochRequest) -> None:
        def answer(code: ErrorCode) -> None:
            self.answer_leader_notice(req, code)

        if self.leader_notice_rejected(req):
            return
        position = -1
        for i, k in enumerate(req.preferred_successors):
            if k.id == self.local.id and (
                k.uuid is None or self.local.uuid is None or k.uuid == self.local.uuid
            ):
                position = i
                break
        if position < 0:
            deadline = self.election_deadline()
        else:
            deadline = self.now + position * (self.config.election_timeout_ms // 2) + self.rng.randrange(50)
        if req.leader_epoch > self.epoch:
            self.transition_to_unattached(req.leader_epoch, deadline)
        elif not isinstance(self.role, Leader) and (
            not isinstance(self.role, Follower) or self.role.leader_id == req.leader_id
        ):
            self.transition_to_unattached(self.epoch, deadline)
        self.last_leader_contact_ms = -NO_DEADLINE
        answer(ErrorCode.NONE)

    def handle_end_response(self, resp: EndQuorumEpochResponse, inf: InFlight) -> None:
        if resp.leader_epoch > self.epoch:
            self.observe_leader(resp.leader_epoch, resp.leader_id, resp.leader_endpoint)

    # ------------------------------------------------------------------ timers

    def tick_election(self) -> None:
        role = self.role
        now = self.now
        if isinstance(role, (Unattached, Voted, Resigned)):
            if now >= role.election_deadline:
                if self.may_campaign() and not self.shutting_down:
                    self.start_election()
                elif isinstance(role, Resigned):
                    self.transition_to_unattached(self.epoch)
                else:
                    role.election_deadline = self.election_deadline()
        elif isinstance(role, Follower):
            if now >= role.fetch_deadline:
                if self.may_campaign() and not self.shutting_down:
                    self.start_election()
                else:
                    self.transition_to_unattached(self.epoch)
        elif isinstance(role, (Prospective, Candidate)):
            if now >= role.election_deadline:
                if not self.may_campaign():
                    self.transition_to_unattached(self.epoch)
                else:
                    self.election_failures += 1
                    self.become_prospective() if self.config.pre_vote else self.become_candidate()
        elif isinstance(role, Leader):
            ls = role.state
            if now - ls.elected_ms >= self.config.fetch_timeout_ms and not ls.majority_fetched_since(
                self.voters(), self.local, now - self.config.fetch_timeout_ms
            ):
                self._errors.append(
                    f"leader of epoch {self.epoch} resigns: no Fetch from a majority (zombie)"
                )
                self.resign_leadership()
                return
            self.send_begin_epochs(ls)

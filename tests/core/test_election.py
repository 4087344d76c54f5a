"""Vote / pre-vote / BeginQuorumEpoch / EndQuorumEpoch handlers and the zombie-leader rule."""

from __future__ import annotations

from quorum.core.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    FetchRequest,
    VoteRequest,
    VoteResponse,
)
from quorum.types import ErrorCode, ReplicaKey
from tests.core.util import CLUSTER, UUIDS, Harness, elect, key, leader, make, responses


def vote(
    h: Harness,
    cand: int,
    epoch: int,
    last_epoch: int = 0,
    last_offset: int = 0,
    pre: bool = False,
    cluster: str = CLUSTER,
    voter_uuid: str | None = UUIDS[1],
    cand_uuid: str | None = None,
) -> VoteResponse:
    out = h.step(
        VoteRequest(
            h.next_corr(),
            cluster,
            cand,
            cand_uuid or UUIDS[cand],
            epoch,
            1,
            voter_uuid,
            last_epoch,
            last_offset,
            pre_vote=pre,
        )
    )
    (resp,) = responses(out, VoteResponse)
    return resp


def test_vote_granted_once_per_epoch_and_persisted_with_uuid() -> None:
    h = make()
    r = vote(h, 2, 1)
    assert r.vote_granted and r.error_code is ErrorCode.NONE
    assert (h.qs.leader_epoch, h.qs.voted_id, h.qs.voted_uuid) == (1, 2, UUIDS[2])
    assert vote(h, 2, 1).vote_granted  # the same candidate again: same answer
    assert not vote(h, 3, 1).vote_granted  # another candidate in the same epoch
    assert h.core.role_name == "voted"


def test_vote_stale_epoch_is_fenced() -> None:
    h = make()
    vote(h, 2, 3)
    r = vote(h, 3, 2)
    assert r.error_code is ErrorCode.FENCED_LEADER_EPOCH and not r.vote_granted
    assert r.leader_epoch == 3


def test_vote_wrong_cluster_and_wrong_voter_uuid() -> None:
    h = make()
    r = vote(h, 2, 1, cluster="other")
    assert r.error_code is ErrorCode.INCONSISTENT_CLUSTER_ID and not r.vote_granted
    r = vote(h, 2, 1, voter_uuid="00000000-0000-4000-8000-0000000000ff")
    assert r.error_code is ErrorCode.INVALID_REQUEST and not r.vote_granted
    assert h.qs.voted_id == -1 and h.core.epoch == 0  # nothing changed


def test_vote_refused_for_a_log_that_is_behind() -> None:
    h = leader()
    end = h.durable_end
    epoch = h.core.epoch
    # A live leader refuses a Vote of a later epoch without adopting it (KIP-996).
    r = vote(h, 3, epoch + 1, last_epoch=epoch, last_offset=end)
    assert not r.vote_granted and h.core.epoch == epoch and h.core.role_name == "leader"
    h.core.resign(h.now)  # no longer a live leader: Votes are judged on their logs
    h.drain()
    # A candidate in a later epoch whose log is shorter than ours.
    r = vote(h, 2, epoch + 1, last_epoch=epoch, last_offset=end - 1)
    assert not r.vote_granted
    assert h.core.epoch == epoch + 1 and h.core.role_name == "unattached"
    r = vote(h, 3, epoch + 1, last_epoch=epoch, last_offset=end)
    assert r.vote_granted


def test_non_voter_cannot_make_a_voter_bump_its_epoch() -> None:
    """A replica outside our voter set (a removed voter, an old disk re-attached, a
    made-up id) gets no vote for a later epoch and does not move our epoch. Within the
    current epoch KIP-856's rule stays: membership is not consulted, an up-to-date log wins."""
    h = make()
    r = vote(h, 7, 1, cand_uuid="00000000-0000-4000-8000-000000000077")
    assert not r.vote_granted and h.core.epoch == 0 and h.qs.leader_epoch == 0
    h.core.transition_to_unattached(1)
    h.drain()
    r = vote(h, 7, 1, cand_uuid="00000000-0000-4000-8000-000000000077")
    assert r.vote_granted and h.qs.voted_id == 7


def test_epoch_at_the_int32_limit_is_refused() -> None:
    h = make()
    r = vote(h, 2, (1 << 31) - 1)
    assert r.error_code is ErrorCode.INVALID_REQUEST and not r.vote_granted
    assert h.core.epoch == 0 and h.qs.leader_epoch == 0
    out = h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 2, (1 << 31) - 1, 1, UUIDS[1]))
    (b,) = responses(out, BeginQuorumEpochResponse)
    assert b.error_code is ErrorCode.INVALID_REQUEST and h.core.role_name == "unattached"
    # The highest allowed epoch is adopted, but a replica there never campaigns past it.
    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 2, (1 << 31) - 2, 1, UUIDS[1]))
    assert h.core.epoch == (1 << 31) - 2
    h.tick(5000)
    assert h.core.epoch == (1 << 31) - 2
    assert any("int32 limit" in e for r in h.readies for e in r.errors)


def test_pre_vote_changes_nothing_and_is_refused_with_a_live_leader() -> None:
    h = make()
    r = vote(h, 2, 1, pre=True)
    assert r.vote_granted and r.pre_vote
    assert h.core.epoch == 0 and h.qs.voted_id == -1  # not persisted, no epoch bump
    # Now follow a leader that answers fetches: pre-votes are refused.
    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 2, 1, 1, UUIDS[1]))
    assert h.core.role_name == "follower"
    r = vote(h, 3, 2, last_epoch=0, last_offset=0, pre=True)
    assert not r.vote_granted
    # After the fetch timeout without contact the pre-vote is granted again.
    h.tick(h.core.config.fetch_timeout_ms + 10)
    assert h.core.role_name in ("prospective", "candidate", "unattached")
    r = vote(h, 3, h.core.epoch + 1, pre=True)
    assert r.vote_granted


def test_observer_never_becomes_candidate() -> None:
    h = make(local=4)  # not among the bootstrap voters 1,2,3
    out = h.tick(5000)
    assert not responses(out, VoteRequest)
    assert h.core.role_name == "unattached"
    # It looks for the leader with discovery fetches instead.
    assert responses(out, FetchRequest)


def test_election_with_pre_vote_then_vote() -> None:
    h = make()
    elect(h)
    assert h.core.role_name == "leader" and h.core.epoch == 1
    assert h.qs.leader_id == 1 and h.qs.voted_id == 1 and h.qs.voted_uuid == UUIDS[1]
    pre = [m for m in responses(h.sent, VoteRequest) if m.pre_vote]
    real = [m for m in responses(h.sent, VoteRequest) if not m.pre_vote]
    assert pre and real and all(m.candidate_epoch == 1 for m in pre + real)


def test_lost_election_backs_off_and_stays_in_epoch() -> None:
    h = make(pre_vote=False)
    out = h.tick(2100)
    reqs = responses(out, VoteRequest)
    assert reqs and h.core.role_name == "candidate"
    for m in reqs[:2]:
        h.step(
            VoteResponse(m.correlation_id, ErrorCode.NONE, -1, m.candidate_epoch, False, voter_id=m.voter_id)
        )
    assert h.core.role_name == "candidate"  # waits for the backoff, no new epoch yet
    assert h.core.epoch == 1


def test_begin_quorum_epoch_stale_and_new() -> None:
    h = make()
    vote(h, 2, 5)
    out = h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 3, 4, 1, UUIDS[1]))
    (r,) = responses(out, BeginQuorumEpochResponse)
    assert r.error_code is ErrorCode.FENCED_LEADER_EPOCH and r.leader_epoch == 5
    out = h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 2, 5, 1, UUIDS[1], leader_endpoint="n2:1"))
    (r,) = responses(out, BeginQuorumEpochResponse)
    assert r.error_code is ErrorCode.NONE
    assert h.core.role_name == "follower" and h.core.leader_id() == 2 and h.qs.leader_id == 2
    # The follower fetches from the leader's endpoint at once.
    fetches = [o for o in out if isinstance(o.message, FetchRequest)]
    assert fetches and fetches[0].destination_id == 2 and fetches[0].destination_endpoint == "n2:1"


def test_begin_quorum_epoch_wrong_voter_uuid() -> None:
    h = make()
    out = h.step(
        BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 2, 1, 1, "00000000-0000-4000-8000-0000000000ff")
    )
    (r,) = responses(out, BeginQuorumEpochResponse)
    assert r.error_code is ErrorCode.INVALID_REQUEST and h.core.role_name != "follower"


def test_end_quorum_epoch_preferred_successor_elects_quickly() -> None:
    h = make()
    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 2, 1, 1, UUIDS[1]))
    h.step(
        EndQuorumEpochRequest(
            h.next_corr(), CLUSTER, 2, 1, 1, UUIDS[1], preferred_successors=(key(1), key(3))
        )
    )
    assert h.core.role_name == "unattached"
    out = h.tick(100)  # position 0: no waiting for a full election timeout
    assert any(isinstance(o.message, VoteRequest) for o in out)


def test_zombie_leader_resigns_without_majority_fetches() -> None:
    h = leader()
    epoch = h.core.epoch
    h.tick(h.core.config.fetch_timeout_ms + 100)  # nobody fetches any more
    assert h.core.role_name == "resigned" and h.core.epoch == epoch
    assert any("zombie" in e for r in h.readies for e in r.errors)


def test_leader_with_fetching_majority_stays() -> None:
    h = leader()
    for _ in range(30):
        h.fetch(2)
        h.tick(100)
    assert h.core.role_name == "leader"


def test_restarted_leader_resigns_its_epoch() -> None:
    h = leader()
    import random

    from quorum.core.raft import RaftCore

    core = RaftCore(
        h.core.config, key(1), CLUSTER, h.qs, h.store.summary(), h.store.reader(), random.Random(1), 0
    )
    assert core.role_name == "resigned" and core.epoch == h.core.epoch
    assert core.voters().from_log and ReplicaKey(2, UUIDS[2]) in core.voters().voters


def test_replacement_disk_does_not_vote_as_the_bootstrap_voter() -> None:
    """A replica formatted to replace a lost disk must not answer a Vote addressed to the
    uuid-less bootstrap key of its id: it would stand in for a log it never had."""
    h = make(local=3, initial_bootstrap=False)
    assert not h.core.is_voter()  # knows no voter set until it reads one from the log
    out = h.step(VoteRequest(h.next_corr(), CLUSTER, 2, UUIDS[2], 1, 3, None, 1, 2))
    (r,) = responses(out, VoteResponse)
    assert r.error_code is ErrorCode.INVALID_REQUEST and not r.vote_granted
    assert h.qs.voted_id == -1
    # Addressed to its own (id, UUID) — a voter set that includes this disk — it votes.
    out = h.step(VoteRequest(h.next_corr(), CLUSTER, 2, UUIDS[2], 1, 3, UUIDS[3], 1, 2))
    (r,) = responses(out, VoteResponse)
    assert r.vote_granted and h.qs.voted_id == 2

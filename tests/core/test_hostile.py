"""Hostile peers, core side: requests that must not grow the leader's state or make a follower
throw away committed records."""

from __future__ import annotations

from quorum.core.messages import (
    BeginQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    VoteRequest,
    VoteResponse,
)
from quorum.records import encode_batch
from quorum.types import ErrorCode, OffsetAndEpoch
from tests.core.util import CLUSTER, UUIDS, fetch_responses, leader, make


def made_up_fetch(h_epoch: int, corr: int, rid: int) -> FetchRequest:
    uuid = f"00000000-0000-4000-8000-{rid:012d}"
    return FetchRequest(corr, CLUSTER, rid, uuid, h_epoch, 0, 0, 0, 1 << 20, f"evil{rid}:1")


def test_observers_are_capped_and_forgotten() -> None:
    h = leader(max_observers=8, observer_expiry_ms=1000)
    for rid in range(100, 150):
        h.step(made_up_fetch(h.core.epoch, h.next_corr(), rid))
    assert len(h.core.describe(h.now)["observers"]) == 8
    # The voters keep fetching; the made-up replicas do not: after the expiry they are gone.
    for _ in range(12):
        h.tick(100)
        h.fetch(2)
        h.fetch(3)
    assert h.core.describe(h.now)["observers"] == []
    assert h.core.role_name == "leader" and len(h.core.describe(h.now)["voters"]) == 3


def test_follower_refuses_a_snapshot_that_would_replace_committed_records() -> None:
    h = make(local=2)
    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 1, 1, 2, UUIDS[2]))
    fetch = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    data = encode_batch(0, 1, [b"a", b"b"], 0) + encode_batch(2, 1, [b"c"], 0)
    h.step(FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=3, records=data))
    assert h.core.hw == 3
    nxt = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    # The leader of our epoch names a snapshot at 2, below our high watermark 3: refused.
    h.step(
        FetchResponse(
            nxt.correlation_id,
            ErrorCode.NONE,
            1,
            1,
            high_watermark=3,
            log_start_offset=2,
            snapshot_id=OffsetAndEpoch(2, 1),
        )
    )
    assert h.core.snap_fetch is None and h.log.end_offset == 3 and h.core.hw == 3
    assert any("refused" in e for r in h.readies for e in r.errors)


def test_a_fetch_from_a_higher_epoch_never_unseats_the_leader() -> None:
    """A Fetch is a leader-only request: one from a higher epoch is answered
    UNKNOWN_LEADER_EPOCH (Kafka's validateLeaderOnlyRequest, KIP-595). From a made-up replica
    nothing else happens. From a voter that got ahead (it campaigned while cut off, and the
    others refuse its Votes while we lead) the leader runs at once for the epoch above it and,
    with its followers' votes, leads on there: the same leader, never a leaderless quorum."""
    h = leader()
    epoch = h.core.epoch
    h.step(made_up_fetch(epoch + 5, h.next_corr(), 77))
    assert h.core.role_name == "leader" and h.core.epoch == epoch
    outs = h.fetch(2, epoch=epoch + 2)
    answers = fetch_responses(outs)
    assert answers and answers[-1].error_code is ErrorCode.UNKNOWN_LEADER_EPOCH
    assert answers[-1].leader_epoch == epoch and answers[-1].leader_id == 1
    votes = [o.message for o in outs if isinstance(o.message, VoteRequest)]
    assert {v.voter_id for v in votes} == {2, 3} and {v.candidate_epoch for v in votes} == {epoch + 3}
    assert not any(v.pre_vote for v in votes)
    v3 = next(v for v in votes if v.voter_id == 3)
    h.step(
        VoteResponse(v3.correlation_id, ErrorCode.NONE, -1, epoch + 3, True, voter_id=3, voter_uuid=UUIDS[3])
    )
    assert h.core.role_name == "leader" and h.core.epoch == epoch + 3 and h.core.local.id == 1


def test_a_follower_grants_its_own_leaders_vote_above_a_stranded_voter() -> None:
    """The other half of the above: a follower refuses a higher-epoch Vote while its leader
    lives (Raft 4.2.3), except from that leader itself."""
    h = make(local=2)
    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 1, 1, 2, UUIDS[2]))
    assert h.core.role_name == "follower"
    end = h.log.end_offset
    refused = h.step(VoteRequest(h.next_corr(), CLUSTER, 3, UUIDS[3], 5, 2, UUIDS[2], 1, end))
    assert [o.message.vote_granted for o in refused if isinstance(o.message, VoteResponse)] == [False]
    assert h.core.epoch == 1
    granted = h.step(VoteRequest(h.next_corr(), CLUSTER, 1, UUIDS[1], 5, 2, UUIDS[2], 1, end))
    assert [o.message.vote_granted for o in granted if isinstance(o.message, VoteResponse)] == [True]
    assert h.core.epoch == 5


def test_requests_do_not_redirect_peer_endpoints() -> None:
    """A Fetch or a Vote naming replica 2 with another endpoint changes nowhere we
    send requests; endpoints come from configuration and AddVoter records."""
    from quorum.core.messages import VoteRequest

    h = leader()
    h.step(FetchRequest(h.next_corr(), CLUSTER, 2, UUIDS[2], h.core.epoch, 0, 0, 0, 1024, "evil:1"))
    h.step(VoteRequest(h.next_corr(), CLUSTER, 3, UUIDS[3], h.core.epoch, 1, UUIDS[1], 0, 0, "evil:3"))
    assert h.core.endpoint_of(2) == "n2:1" and h.core.endpoint_of(3) == "n3:1"
    f = make(local=2)
    from quorum.core.messages import BeginQuorumEpochRequest

    f.step(BeginQuorumEpochRequest(f.next_corr(), CLUSTER, 1, 1, 2, UUIDS[2], leader_endpoint="evil:9"))
    assert f.core.role_name == "follower" and f.core.leader_endpoint() == "n1:1"


def test_reassign_to_ids_outside_int32_is_refused() -> None:
    h = leader()
    for ids in ([1 << 31], [-1], [2, 2]):
        h.core.reassign(40, ids, h.now)
        h.drain()
        (res,) = [a for a in h.admin if a.request_id == 40]
        assert res.error is ErrorCode.INVALID_REQUEST and "bad target voter ids" in res.message
        h.admin.clear()
    assert h.core.voters().target_voters is None

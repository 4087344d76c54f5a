"""Role transitions as code (quorum/core/transitions.py): illegal moves raise, and every move
that changes epoch, vote or leader queues the quorum-state write in the same Ready."""

from __future__ import annotations

import pytest

from quorum.core.messages import BeginQuorumEpochRequest, BeginQuorumEpochResponse
from quorum.core.transitions import IllegalTransition
from quorum.types import ErrorCode
from tests.core.util import CLUSTER, UUIDS, key, leader, make, responses


def test_illegal_moves_raise_and_change_nothing() -> None:
    h = leader()
    epoch = h.core.epoch
    with pytest.raises(IllegalTransition, match="leader"):
        h.core.transition_to_follower(epoch, 2, "n2:1")  # another leader in our own epoch
    with pytest.raises(IllegalTransition):
        h.core.transition_to_unattached(epoch - 1)  # epochs never go back
    with pytest.raises(IllegalTransition):
        h.core.transition_to_voted(key(2))  # a leader does not vote in its epoch
    with pytest.raises(IllegalTransition):
        h.core.transition_to_candidate(set())
    assert h.core.role_name == "leader" and h.core.epoch == epoch
    f = make(local=2)
    with pytest.raises(IllegalTransition):
        f.core.transition_to_resigned()  # only a leader resigns
    with pytest.raises(IllegalTransition, match="ourselves"):
        f.core.transition_to_follower(3, 2, None)


def test_transitions_queue_the_state_write_with_the_role() -> None:
    h = make(local=2)
    h.core.transition_to_follower(4, 1, "n1:1")
    r = h.core.ready()
    assert r.quorum_state is not None and (r.quorum_state.leader_epoch, r.quorum_state.leader_id) == (4, 1)
    assert r.role_change is not None and r.role_change.role == "follower" and r.role_change.leader_id == 1
    h.driver.carry_out(r)
    assert (h.qs.leader_epoch, h.qs.leader_id) == (4, 1)
    h.core.transition_to_unattached(5)
    r = h.core.ready()
    assert r.quorum_state is not None and r.quorum_state.leader_epoch == 5 and r.quorum_state.leader_id == -1
    h.driver.carry_out(r)
    h.core.transition_to_voted(key(3))
    r = h.core.ready()
    assert r.quorum_state is not None and (r.quorum_state.voted_id, r.quorum_state.voted_uuid) == (
        3,
        UUIDS[3],
    )
    # Pre-vote persists nothing.
    h.driver.carry_out(r)
    h.core.transition_to_prospective(set())
    r = h.core.ready()
    assert r.quorum_state is None and r.role_change is not None and r.role_change.role == "prospective"


def test_begin_quorum_epoch_naming_another_leader_of_our_epoch_is_refused() -> None:
    h = leader()
    epoch = h.core.epoch
    out = h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 3, epoch, 1, UUIDS[1]))
    (r,) = responses(out, BeginQuorumEpochResponse)
    assert r.error_code is ErrorCode.INVALID_REQUEST
    assert h.core.role_name == "leader" and h.core.epoch == epoch and h.core.leader_id() == 1

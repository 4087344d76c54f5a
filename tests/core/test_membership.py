"""KIP-856 AddVoter / RemoveVoter handling (every error path), KIP-642 reassignment and the
leader removing itself (KAFKA-17608)."""

from __future__ import annotations

from quorum.core.messages import EndQuorumEpochRequest
from quorum.types import AddVoter, ErrorCode, RemoveVoter, ReplicaKey, TargetVoters
from tests.core.util import Harness, key, leader, make

NEW3 = "00000000-0000-4000-8000-0000000000a3"


def result(h: Harness, rid: int) -> ErrorCode | None:
    for r in h.admin:
        if r.request_id == rid:
            return r.error
    return None


def catch_up(
    h: Harness, ids: tuple[int, ...] = (2, 3), extra: tuple[ReplicaKey, ...] = (), rounds: int = 3
) -> None:
    for _ in range(rounds):
        for i in ids:
            h.fetch(i)
        for k in extra:
            h.fetch(k.id, uuid=k.uuid)
        h.tick(10)


def test_add_voter_not_leader() -> None:
    h = make()
    h.core.add_voter(1, key(3, NEW3), 0)
    h.drain()
    assert result(h, 1) is ErrorCode.NOT_LEADER


def test_add_voter_already_added() -> None:
    h = leader()
    h.core.add_voter(1, key(2), h.now)
    h.drain()
    assert result(h, 1) is ErrorCode.VOTER_ALREADY_ADDED


def test_add_voter_needs_uuid_and_an_observer() -> None:
    h = leader()
    h.core.add_voter(1, ReplicaKey(3, None), h.now)
    h.core.add_voter(2, key(3, NEW3), h.now)  # never fetched from the leader
    h.drain()
    assert result(h, 1) is ErrorCode.INVALID_REQUEST
    assert result(h, 2) is ErrorCode.INVALID_REQUEST
    assert any("not an observer" in r.message for r in h.admin if r.request_id == 2)


def test_add_voter_id_not_allowed() -> None:
    h = leader()
    h.fetch(7, uuid="00000000-0000-4000-8000-0000000000b7")
    h.core.add_voter(1, ReplicaKey(7, "00000000-0000-4000-8000-0000000000b7"), h.now)
    h.drain()
    assert result(h, 1) is ErrorCode.INVALID_REQUEST


def test_add_voter_not_caught_up_within_timeout() -> None:
    h = leader(add_voter_timeout_ms=500, catch_up_max_lag=2)
    h.fetch(3, uuid=NEW3, offset=0, last_epoch=0)  # observer at offset 0
    for _ in range(5):
        h.core.propose([b"x"], h.now)
        h.drain()
    h.core.add_voter(1, key(3, NEW3), h.now)
    catch_up(h)  # the voters keep up; the new replica does not
    h.tick(600)
    assert result(h, 1) is ErrorCode.REPLICA_NOT_CAUGHT_UP
    assert h.core.pending_voter_change() is None


def test_add_voter_commits_with_new_majority_and_then_remove_old() -> None:
    """The KIP-856 disk-failure recovery: (3, old) and (3, new) are voters together."""
    h = leader()
    new = key(3, NEW3)
    h.fetch(3, uuid=NEW3)
    h.core.add_voter(1, new, h.now)
    h.drain()
    assert h.core.pending_voter_change() is not None  # appended at once (caught up)
    assert new in h.core.voters().voters  # applied before commit (KIP-856)
    assert result(h, 1) is None
    h.fetch(2)  # leader + 2 = 2 of 4 voters: not a majority of the new set
    assert result(h, 1) is None
    h.fetch(3, uuid=NEW3)
    assert result(h, 1) is ErrorCode.NONE
    assert h.core.describe(h.now)["pending_voter_change"] is None
    h.core.remove_voter(2, key(3), h.now)
    h.drain()
    catch_up(h, ids=(2,), extra=(new,))
    assert result(h, 2) is ErrorCode.NONE
    vs = h.core.voters()
    assert key(3) not in vs.voters and new in vs.voters and key(3) in vs.removed


def test_one_change_at_a_time_derived_from_the_log() -> None:
    """KAFKA-20740: after an AddVoter times out with its record still uncommitted, another
    change must still see VOTER_CHANGE_IN_PROGRESS."""
    h = leader(add_voter_timeout_ms=300)
    h.fetch(3, uuid=NEW3)
    h.core.add_voter(1, key(3, NEW3), h.now)
    h.drain()
    h.tick(400)  # no follower fetches: the record stays uncommitted
    assert result(h, 1) is ErrorCode.REQUEST_TIMED_OUT
    change = h.core.pending_voter_change()
    assert change is not None and change.op == "add" and change.key == key(3, NEW3)
    h.core.remove_voter(2, key(3), h.now)
    h.drain()
    assert result(h, 2) is ErrorCode.VOTER_CHANGE_IN_PROGRESS


def test_change_in_progress_while_another_request_waits() -> None:
    h = leader()
    h.fetch(3, uuid=NEW3, offset=0, last_epoch=0)  # not caught up: the add waits
    for _ in range(200):
        h.core.propose([b"x"], h.now)
    h.drain()
    new2 = "00000000-0000-4000-8000-0000000000a2"
    h.fetch(2, uuid=new2)
    h.core.add_voter(1, key(3, NEW3), h.now)
    h.core.add_voter(2, key(2, new2), h.now)
    h.drain()
    assert result(h, 1) is None  # still waiting for the catch-up
    assert result(h, 2) is ErrorCode.VOTER_CHANGE_IN_PROGRESS


def test_remove_voter_errors() -> None:
    h = leader()
    h.core.remove_voter(1, key(3, NEW3), h.now)  # never a voter
    h.core.remove_voter(2, key(3), h.now)  # the last UUID of id 3
    h.drain()
    assert result(h, 1) is ErrorCode.INVALID_REQUEST
    assert result(h, 2) is ErrorCode.INVALID_REQUEST
    assert any("reassign" in r.message for r in h.admin if r.request_id == 2)


def test_removed_voter_stays_removed() -> None:
    h = leader()
    h.fetch(3, uuid=NEW3)
    h.core.add_voter(1, key(3, NEW3), h.now)
    catch_up(h, extra=(key(3, NEW3),))
    h.core.remove_voter(2, key(3), h.now)
    catch_up(h, ids=(2,), extra=(key(3, NEW3),))
    assert result(h, 2) is ErrorCode.NONE
    h.core.remove_voter(3, key(3), h.now)
    h.fetch(3)  # the old disk comes back and fetches as an observer
    h.core.add_voter(4, key(3), h.now)
    h.drain()
    assert result(h, 3) is ErrorCode.VOTER_ALREADY_REMOVED
    assert result(h, 4) is ErrorCode.INVALID_REQUEST  # KAFKA-19850


def test_snapshot_keeps_removed_voters() -> None:
    h = leader()
    h.fetch(3, uuid=NEW3)
    h.core.add_voter(1, key(3, NEW3), h.now)
    catch_up(h, extra=(key(3, NEW3),))
    h.core.remove_voter(2, key(3), h.now)
    catch_up(h, ids=(2,), extra=(key(3, NEW3),))
    controls = h.core.controls_at(h.core.hw)
    assert RemoveVoter(key(3)) in controls
    assert AddVoter(key(3, NEW3), "n3:1") in controls


def test_reassignment_adds_first_and_the_leader_removes_itself_last() -> None:
    h = leader()
    four = key(4)
    h.fetch(4)
    h.core.reassign(1, [2, 3, 4], h.now)
    for _ in range(12):
        catch_up(h, ids=(2, 3, 4), rounds=1)
        if h.core.role_name != "leader":
            break
    assert result(h, 1) is ErrorCode.NONE
    # The leader appended AddVoter(4) before RemoveVoter(1) and resigned once it committed.
    recs = h.records()
    i_add = recs.index(AddVoter(four, "n4:1"))
    i_remove = recs.index(RemoveVoter(key(1)))
    assert i_add < i_remove
    assert TargetVoters((2, 3, 4)) in recs
    assert h.core.role_name == "resigned"
    assert any(isinstance(o.message, EndQuorumEpochRequest) for o in h.sent)
    assert not h.core.is_voter()


def test_removed_leader_does_not_count_itself_toward_hw() -> None:
    h = leader()
    h.fetch(4)
    h.core.reassign(1, [2, 3, 4], h.now)
    for _ in range(12):
        catch_up(h, ids=(2, 3, 4), rounds=1)
        if h.core.pending_voter_change() is not None and not h.core.is_voter():
            break
    assert not h.core.is_voter() and h.core.role_name == "leader"
    hw = h.core.hw
    h.core.propose([b"x"], h.now)
    h.drain()
    h.fetch(2)  # leader + 2 would be a majority of 3 if the leader counted: it does not
    assert h.core.hw == hw
    h.fetch(3)
    assert h.core.hw > hw


def test_reassign_cancel_and_validation() -> None:
    h = leader()
    h.core.reassign(1, [], h.now)
    h.core.reassign(2, [1, 1, 2], h.now)
    h.core.reassign(3, None, h.now)  # nothing to cancel
    h.drain()
    assert result(h, 1) is ErrorCode.INVALID_REQUEST
    assert result(h, 2) is ErrorCode.INVALID_REQUEST
    assert result(h, 3) is ErrorCode.NONE
    h.core.reassign(4, [1, 2, 5], h.now)  # replica 5 never shows up
    catch_up(h)
    assert result(h, 4) is ErrorCode.NONE
    assert h.core.describe(h.now)["target_voters"] == [1, 2, 5]
    h.fetch(3, uuid=NEW3)
    h.core.add_voter(5, key(3, NEW3), h.now)  # id 3 is not a target id
    h.drain()
    assert result(h, 5) is ErrorCode.REASSIGNMENT_IN_PROGRESS
    h.core.reassign(6, [1, 2, 3], h.now)  # resubmitting the current set cancels
    catch_up(h)
    assert result(h, 6) is ErrorCode.NONE
    assert h.core.describe(h.now)["target_voters"] is None
    assert sorted(h.core.voters().ids()) == [1, 2, 3]


def test_describe_shape() -> None:
    h = leader()
    h.fetch(3, uuid=NEW3)
    d = h.core.describe(h.now)
    assert d["leader_id"] == 1 and d["leader_epoch"] == h.core.epoch and d["high_watermark"] == h.core.hw
    assert [v["id"] for v in d["voters"]] == [1, 2, 3]
    assert {
        "uuid",
        "endpoint",
        "log_end_offset",
        "lag",
        "last_fetch_timestamp",
        "last_caught_up_timestamp",
    } <= set(d["voters"][0])
    assert [(o["id"], o["uuid"]) for o in d["observers"]] == [(3, NEW3)]
    assert d["pending_voter_change"] is None and d["target_voters"] is None
    assert d["leader_recovery_state"] == "RECOVERED"
    m = h.core.metrics()
    assert m["number_of_voters"] == 3 and m["number_of_possible_voters"] == 1 and m["current_leader"] == 1


def test_remove_then_add_order_removes_the_last_uuid_when_a_replacement_is_ready() -> None:
    """RemoveThenAdd (Kafka's KIP-853 procedure): RemoveVoter(3, old) may take id 3's last UUID
    only while (3, new) is a caught-up observer; then AddVoter(3, new) restores three voters."""
    h = leader()
    h.fetch(3, uuid=NEW3, offset=0, last_epoch=0)  # the replacement has not caught up yet
    for _ in range(200):
        h.core.propose([b"x"], h.now)
    h.drain()
    h.core.remove_voter(1, key(3), h.now)
    h.drain()
    assert result(h, 1) is ErrorCode.INVALID_REQUEST
    catch_up(h, extra=(key(3, NEW3),))  # now it has
    h.core.remove_voter(2, key(3), h.now)
    catch_up(h, ids=(2,), extra=(key(3, NEW3),))
    assert result(h, 2) is ErrorCode.NONE
    assert {k.id for k in h.core.voters().voters} == {1, 2}
    h.core.add_voter(3, key(3, NEW3), h.now)
    catch_up(h, ids=(2,), extra=(key(3, NEW3),))
    assert result(h, 3) is ErrorCode.NONE
    assert key(3, NEW3) in h.core.voters().voters and len(h.core.voters().voters) == 3

"""Recovery decisions over the in-memory quorum model: every awkward case of KIP-856 disk
replacement the operator must survive (leader replaced, two disks, operator restarts between
steps, replica falling behind, majority down, bad policy)."""

from __future__ import annotations

from typing import Any

import pytest
from kraftkeeper_operator.core.recovery import (
    DescribeError,
    Order,
    Phase,
    PolicyError,
    QuorumView,
    Recovery,
    RecoveryPolicy,
)
from prometheus_client import generate_latest

from quorum.types import ErrorCode
from tests.operator.helpers import FULL
from tests.operator.recovery_rig import Rig, recovered


async def test_replaced_disk_is_recovered_add_then_remove() -> None:
    rig = Rig()
    old = rig.q.current(3).uuid
    new = rig.q.replace_disk(3, lag=500)
    # Not caught up: detected, but no change, however long we wait below the timeout.
    for _ in range(30):
        st = await rig.step()
    assert rig.sink.types() == ["disk_replacement_detected"]
    assert rig.changes() == []
    assert st.condition("Recovering").status and st.condition("Degraded").status
    rig.q.set_lag(3, 0)
    st = await rig.run_until(recovered)
    assert rig.sink.types() == FULL
    assert rig.changes() == [("add_voter", (3, new)), ("remove_voter", (3, old))]
    assert rig.voters() == {(1, rig.q.current(1).uuid), (2, rig.q.current(2).uuid), (3, new)}
    rec = st.recoveries[-1]
    assert (rec["oldUuid"], rec["newUuid"], rec["replicaId"]) == (old, new, 3)
    # Stabilisation lasted at least the policy's time on our (fake) clock.
    assert rec["caughtUpMs"] - rec["caughtUpSinceMs"] >= 10_000
    text = generate_latest(rig.metrics.registry).decode()
    assert 'kraftkeeper_operator_recoveries_total{quorum="test",result="completed"} 1.0' in text
    st = await rig.step()
    assert 'kraftkeeper_operator_voters{quorum="test"} 3.0' in generate_latest(rig.metrics.registry).decode()
    assert not st.condition("Recovering").status and not st.condition("Degraded").status
    assert st.to_status()["leaderId"] == rig.q.leader[0]  # type: ignore[index]


async def test_remove_then_add_order() -> None:
    policy = RecoveryPolicy(
        order=Order.REMOVE_THEN_ADD,
        stabilization_seconds=5,
        max_lag=10,
        timeout_seconds=300,
        live_window_seconds=3,
    )
    rig = Rig(policy=policy)
    old = rig.q.current(2).uuid
    new = rig.q.replace_disk(2, lag=0)
    await rig.run_until(recovered)
    assert rig.changes() == [("remove_voter", (2, old)), ("add_voter", (2, new))]
    types = rig.sink.types()
    assert types[0] == "disk_replacement_detected" and types[-1] == "recovery_completed"
    assert types.index("remove_voter_committed") < types.index("add_voter_started")
    assert (2, new) in rig.voters() and len(rig.voters()) == 3


async def test_replaced_node_was_the_leader() -> None:
    rig = Rig()
    assert rig.q.leader is not None and rig.q.leader[0] == 1
    old = rig.q.current(1).uuid
    new = rig.q.replace_disk(1, lag=0)
    assert rig.q.leader is not None and rig.q.leader[0] == 2  # re-elected among the rest
    await rig.run_until(recovered)
    assert rig.changes() == [("add_voter", (1, new)), ("remove_voter", (1, old))]
    assert rig.sink.types() == FULL
    # Every event names the leader that was in charge when it happened.
    assert {e.leader_id for e in rig.sink.events} == {2}


async def test_two_disks_replaced_with_five_voters_run_one_after_the_other() -> None:
    rig = Rig(n=5)
    new3 = rig.q.replace_disk(3, lag=0)
    await rig.step()
    new4 = rig.q.replace_disk(4, lag=0)
    st = await rig.run_until(lambda s: sum(r["phase"] == "Completed" for r in s.recoveries) == 2)
    calls = rig.changes()
    assert [c[0] for c in calls] == ["add_voter", "remove_voter", "add_voter", "remove_voter"]
    assert calls[0][1] == (3, new3) and calls[2][1] == (4, new4)  # first detected goes first
    assert {k for k in rig.voters() if k[0] in (3, 4)} == {(3, new3), (4, new4)}
    assert len(rig.voters()) == 5 and not st.condition("Recovering").status
    # Never more than one extra voter (one change at a time).
    ids = [e.replica_id for e in rig.sink.events if e.type.endswith("_started")]
    assert ids == [3, 3, 4, 4]


async def test_second_disk_during_first_recovery_with_three_voters_waits_for_quorum() -> None:
    rig = Rig(n=3)
    rig.q.replace_disk(3, lag=0)
    await rig.step()
    await rig.step()
    rig.q.replace_disk(2, lag=0)  # now only voter 1 is live: no majority of {1,2,3}
    for i in range(40):
        st = await rig.step()
        # No leader answers: the first seconds may be a leader election (status.py grace), then lost.
        lost = st.condition("QuorumLost")
        assert lost.status or (i < 3 and lost.reason == "LeaderElection"), (i, lost)
    assert rig.changes() == []
    assert not st.condition("Available").status


async def test_replica_falling_behind_resets_stabilisation() -> None:
    rig = Rig()
    rig.q.replace_disk(3, lag=0)
    for _ in range(6):  # 6 s caught up, stabilisation is 10 s
        await rig.step()
    rig.q.set_lag(3, 50)
    st = await rig.step()
    assert "replica_fell_behind" in rig.sink.types()
    assert st.recoveries[-1]["caughtUpSinceMs"] is None
    rig.q.set_lag(3, 0)
    back = rig.clock.ms()
    await rig.run_until(lambda s: bool(rig.changes()))
    rec = rig.ctl.book.records[-1]
    assert rec.caught_up_ms is not None and rec.caught_up_ms - back >= 10_000
    await rig.run_until(recovered)


async def test_leader_rejects_add_as_not_caught_up_restarts_clock() -> None:
    rig = Rig()
    rig.q.replace_disk(3, lag=0)
    rig.q.fail_next("add_voter", ErrorCode.REPLICA_NOT_CAUGHT_UP)
    await rig.run_until(lambda s: bool(rig.changes()))
    st = await rig.step()
    assert st.recoveries[-1]["phase"] == "Stabilizing"
    await rig.run_until(recovered)
    assert [c[0] for c in rig.changes()] == ["add_voter", "add_voter", "remove_voter"]


async def test_majority_down_reports_quorum_lost_and_changes_nothing() -> None:
    rig = Rig()
    rig.q.kill(2)
    rig.q.replace_disk(3, lag=0)
    for _ in range(30):
        st = await rig.step()
    assert rig.changes() == []
    assert st.condition("QuorumLost").status and not st.condition("Available").status
    assert 'quorum_lost{quorum="test"} 1.0' in generate_latest(rig.metrics.registry).decode()
    rig.q.revive(2)
    await rig.run_until(recovered)


async def test_add_blocked_when_another_voter_is_down() -> None:
    """3 voters, 3 replaced, 2 down: adding (3,new) would make 4 voters with 2 live."""
    rig = Rig(n=5)
    rig.q.kill(1)
    rig.q.kill(2)
    rig.q.replace_disk(3, lag=0)
    for _ in range(30):
        st = await rig.step()
    # 5 voters, 2 live -> quorum lost in fact; nothing may happen
    assert rig.changes() == [] and st.condition("QuorumLost").status


async def test_old_voter_still_live_is_not_replaced() -> None:
    """Two processes with one id (a misconfiguration) must not trigger a recovery."""
    rig = Rig()
    imposter = rig.q.replace_disk(3, lag=0)
    old = next(k for k in rig.q.replicas if k[0] == 3 and k[1] != imposter)
    rig.q.replicas[old].alive = True
    for _ in range(30):
        st = await rig.step()
    assert rig.changes() == []
    assert st.blocked is not None and "still live" in st.blocked


async def test_timeout_gives_up_with_reason() -> None:
    policy = RecoveryPolicy(stabilization_seconds=5, max_lag=10, timeout_seconds=20, live_window_seconds=3)
    rig = Rig(policy=policy)
    rig.q.replace_disk(3, lag=10_000)
    await rig.run_until(lambda s: any(r["phase"] == "Failed" for r in s.recoveries), limit=40)
    failed = [e for e in rig.sink.events if e.type == "recovery_failed"]
    assert failed and failed[0].detail["reason"].startswith("timeout")
    assert rig.changes() == []
    assert 'result="failed"} 1.0' in generate_latest(rig.metrics.registry).decode()


async def test_disabled_policy_does_nothing() -> None:
    rig = Rig(policy=RecoveryPolicy(enabled=False))
    rig.q.replace_disk(3, lag=0)
    for _ in range(30):
        await rig.step()
    assert rig.changes() == [] and rig.sink.events == []


async def test_pending_change_blocks_everything() -> None:
    rig = Rig()
    rig.q.replace_disk(3, lag=0)
    rig.q.pending = {"op": "add", "id": 9, "uuid": "00000000-0000-0000-0000-000000000009"}
    for _ in range(30):
        st = await rig.step()
    assert rig.changes() == [] and st.blocked is not None and "in progress" in st.blocked
    rig.q.pending = None
    await rig.run_until(recovered)


async def test_scaling_reassigns_only_when_new_replicas_caught_up() -> None:
    rig = Rig(n=3)
    rig.ctl.desired_ids = [1, 2, 3, 4, 5]
    st = await rig.step()
    assert rig.changes() == [] and st.blocked is not None and "catch up" in st.blocked
    for i in (4, 5):
        rig.q.replace_disk(i, lag=0)  # new observers with ids 4, 5
    await rig.run_until(lambda s: s.reassigned is not None)
    assert rig.changes() == [("reassign", [1, 2, 3, 4, 5])]
    rig.ctl.desired_ids = [1, 2, 3]
    await rig.run_until(lambda s: s.voter_ids == [1, 2, 3])
    assert rig.changes()[-1] == ("reassign", [1, 2, 3])


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"order": "Sideways"}, "spec.recovery.order"),
        ({"maxLagRecords": -1}, "spec.recovery.maxLagRecords"),
        ({"maxLagRecords": "10"}, "spec.recovery.maxLagRecords"),
        ({"stabilizationSeconds": "soon"}, "spec.recovery.stabilizationSeconds"),
        ({"stabilizationSeconds": 100, "timeoutSeconds": 50}, "spec.recovery.timeoutSeconds"),
        ({"enabled": "yes"}, "spec.recovery.enabled"),
        ({"colour": "blue"}, "spec.recovery.colour"),
        ({"liveWindowSeconds": 0}, "spec.recovery.liveWindowSeconds"),
    ],
)
def test_invalid_policy_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        RecoveryPolicy.from_spec(spec)


def test_policy_from_spec() -> None:
    p = RecoveryPolicy.from_spec(
        {"order": "RemoveThenAdd", "stabilizationSeconds": 3, "maxLagRecords": 7}, {"enabled": True}
    )
    with pytest.raises(PolicyError, match=r"spec\.uncleanRecovery\.enabled"):
        RecoveryPolicy.from_spec({}, {"enabled": 1})
    assert p.order is Order.REMOVE_THEN_ADD and p.stabilization_seconds == 3 and p.max_lag == 7
    assert p.unclean_allowed and RecoveryPolicy.from_spec(None) == RecoveryPolicy()


def test_bad_describe_object_is_named() -> None:
    with pytest.raises(DescribeError, match="voters"):
        QuorumView.from_describe({"leader_id": 1, "leader_epoch": 1})


def test_recovery_round_trips_through_status() -> None:
    r = Recovery("rid", 3, "a", "b", Phase.ADDED, 5, add_started_ms=7)
    assert Recovery.from_dict(r.to_dict()) == r
    assert r.to_dict()["addStartedMs"] == 7
    crd = r.to_crd_status()
    assert crd["result"] == "InProgress" and crd["phaseSeconds"]["atAddStarted"] == 0.002
    back = Recovery.from_crd_status(crd)
    assert (back.add_started_ms, back.old_uuid, back.phase) == (7, "a", Phase.STABILIZING)


async def test_removed_old_disk_listed_as_observer_is_not_a_new_replacement() -> None:
    rig = Rig()
    rig.q.list_dead_observers = True
    old = rig.q.current(3).uuid
    rig.q.replace_disk(3, lag=0)
    await rig.run_until(recovered)
    assert any(k == (3, old) for k in rig.q.replicas)
    before = list(rig.sink.events)
    for _ in range(40):
        st = await rig.step()
    assert rig.sink.events == before and len(st.recoveries) == 1
    assert not st.condition("Recovering").status


async def test_voter_with_unknown_uuid_is_not_replaced() -> None:
    rig = Rig()
    rig.q.replace_disk(3, lag=0)
    orig = rig.q.describe

    async def unknown_uuid() -> dict[str, Any]:
        d = await orig()
        for v in d["voters"]:
            if v["id"] == 3:
                v["uuid"] = None
        return d

    rig.q.describe = unknown_uuid  # type: ignore[method-assign]
    for _ in range(20):
        st = await rig.step()
    assert rig.changes() == [] and st.blocked is not None and "no known storage UUID" in st.blocked


async def test_engine_refusal_fails_the_recovery_once_without_a_retry_storm() -> None:
    policy = RecoveryPolicy(
        order=Order.REMOVE_THEN_ADD,
        stabilization_seconds=2,
        max_lag=10,
        timeout_seconds=60,
        live_window_seconds=3,
    )
    rig = Rig(policy=policy)
    rig.q.refuse_removing_last_uuid = True
    old = rig.q.current(3).uuid
    rig.q.replace_disk(3, lag=0)
    await rig.run_until(lambda s: any(r["phase"] == "Failed" for r in s.recoveries))
    for _ in range(30):  # well inside the retry period (timeoutSeconds)
        await rig.step()
    assert rig.changes() == [("remove_voter", (3, old))]
    assert rig.sink.types().count("remove_voter_started") == 1
    failed = next(e for e in rig.sink.events if e.type == "recovery_failed")
    assert "INVALID_REQUEST" in failed.detail["reason"] and "RemoveVoter" in failed.detail["reason"]
    assert (3, old) in rig.voters()  # nothing lost: the old voter set stands


async def test_retryable_error_backs_off_and_logs_one_start() -> None:
    rig = Rig()
    rig.q.replace_disk(3, lag=0)
    rig.q.fail_next("add_voter", ErrorCode.UNAVAILABLE)
    await rig.run_until(recovered)
    assert [c[0] for c in rig.changes()] == ["add_voter", "add_voter", "remove_voter"]
    assert rig.sink.types() == FULL  # the retry logged no second add_voter_started


# ---------------------------------------------------------------------------------------------
# No idle waits


async def test_remove_voter_starts_in_the_same_pass_in_which_add_voter_commits() -> None:
    rig = Rig()
    rig.q.replace_disk(3, lag=0)
    for _ in range(60):
        await rig.step()
        if "add_voter_committed" in rig.sink.types():
            break
    types = rig.sink.types()
    i = types.index("add_voter_committed")
    assert types[i + 1 : i + 3] == ["remove_voter_started", "remove_voter_committed"], types


async def test_the_controller_wakes_at_the_stabilisation_deadline_and_adds_at_once() -> None:
    # A live window far longer than the stabilisation: only the "old process is gone" rule (it has
    # not fetched since its replacement caught up) lets AddVoter start at the deadline.
    policy = RecoveryPolicy(stabilization_seconds=10, max_lag=10, timeout_seconds=300, live_window_seconds=60)
    rig = Rig(policy=policy)
    rig.q.replace_disk(3, lag=0)
    await rig.step()
    (rec,) = rig.ctl.book.active()
    assert rec.caught_up_since_ms == rig.clock.ms()  # caught up when first seen: the clock starts
    deadline = rec.caught_up_since_ms + 10_000
    for _ in range(20):  # the controller's own wake-ups until the deadline; polling would say 30 s
        wait = rig.ctl.wake_in(30.0)
        assert 0 < wait <= 30.0
        rig.clock.t += wait
        rig.q.tick()
        await rig.ctl.reconcile()
        if "add_voter_started" in rig.sink.types():
            break
    assert rig.clock.ms() == deadline + 1  # woke 1 ms after the deadline, not a polling tick later
    assert rig.sink.types()[:3] == ["disk_replacement_detected", "replica_caught_up", "add_voter_started"]
    assert rig.sink.types()[-1] == "recovery_completed"  # and RemoveVoter right after the commit


async def test_a_live_old_process_keeps_blocking_past_the_deadline() -> None:
    policy = RecoveryPolicy(stabilization_seconds=10, max_lag=10, timeout_seconds=300, live_window_seconds=60)
    rig = Rig(policy=policy)
    rig.q.replace_disk(3, lag=0)
    old = next(r for k, r in rig.q.replicas.items() if k in rig.q.voters and k[0] == 3)
    old.alive = True  # two processes claim id 3: the old one keeps fetching
    for _ in range(30):
        st = await rig.step()
    assert "add_voter_started" not in rig.sink.types()
    # Not even detected (recovery.py's last invariant: the voter fetches as late as the observer).
    assert st.blocked is not None and "still live" in st.blocked

"""QuorumLost is published only when the quorum has no live majority, not during a leader election
(Available=False flapped during a rolling image change with 2 of 3 pods Ready, because
the leader's pod restarted: no leader answered for a moment, then a new leader reported its
followers' fetch times as unknown). The decision (status.py ``quorum_health``) and the controller
passes that publish it, against a scripted sequence of leader answers."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.controller import RecoveryController
from kraftkeeper_operator.core.recovery import QuorumView, RecoveryPolicy
from kraftkeeper_operator.core.status import ELECTION_GRACE_MS, Health, quorum_health
from kraftkeeper_operator.telemetry import MemorySink, OperatorMetrics
from prometheus_client import generate_latest

from quorum.types import ErrorCode, KraftError
from testkit.polling import ANY_ERROR, wait_until
from tests.operator.operator_nodes import LocalCluster, engine_missing

NOW = 1_700_000_000_000
WINDOW = 5_000


def describe(epoch: int, leader: int, fetch: dict[int, int], now: int) -> dict[str, Any]:
    """A leader's describe object; ``fetch`` maps voter id -> ms since its last fetch (-1: none)."""
    voters = []
    for i in (1, 2, 3):
        ago = 0 if i == leader else fetch.get(i, 0)
        ts = -1 if ago < 0 else now - ago
        voters.append(
            {
                "id": i,
                "uuid": f"00000000-0000-4000-8000-00000000000{i}",
                "log_end_offset": 10,
                "lag": 0,
                "last_fetch_timestamp": ts,
                "last_caught_up_timestamp": ts,
            }
        )
    return {"leader_id": leader, "leader_epoch": epoch, "high_watermark": 10, "voters": voters}


def view(epoch: int, leader: int, fetch: dict[int, int], now: int = NOW) -> QuorumView:
    return QuorumView.from_describe(describe(epoch, leader, fetch, now))


def test_quorum_health_decision() -> None:
    good = view(5, 1, {})
    assert quorum_health(good, NOW, WINDOW, None, None) is Health.LIVE
    # Never seen healthy (bootstrap): no grace, as before.
    assert quorum_health(None, NOW, WINDOW, None, None) is Health.LOST
    # No leader answers: an election may be running, for at most the grace.
    assert quorum_health(None, NOW, WINDOW, good, None) is Health.SETTLING
    assert quorum_health(None, NOW, WINDOW, good, NOW - ELECTION_GRACE_MS + 1) is Health.SETTLING
    assert quorum_health(None, NOW, WINDOW, good, NOW - ELECTION_GRACE_MS) is Health.LOST
    # A new leader whose followers have not fetched from it yet.
    fresh = view(6, 2, {1: -1, 3: -1})
    assert quorum_health(fresh, NOW, WINDOW, good, None) is Health.SETTLING
    # The same leader epoch reporting a dead majority: lost at once (the window was the grace).
    dead = view(5, 1, {2: 6_000, 3: 6_000})
    assert quorum_health(dead, NOW, WINDOW, good, None) is Health.LOST
    # Within one episode, never SETTLING after LOST.
    assert quorum_health(None, NOW, WINDOW, good, NOW, already_lost=True) is Health.LOST
    # The grace is never longer than the live window.
    assert quorum_health(None, NOW, 1_000, good, NOW - 1_000) is Health.LOST


class Scripted:
    """A QuorumApi answering describe from a script: a describe object, or an error code."""

    def __init__(self) -> None:
        self.answer: dict[str, Any] | ErrorCode = {}
        self.changes: list[str] = []

    async def describe(self) -> dict[str, Any]:
        if isinstance(self.answer, ErrorCode):
            raise KraftError(self.answer, "no leader")
        return self.answer

    async def add_voter(self, id: int, uuid: str) -> dict[str, Any]:
        self.changes.append("add")
        return {}

    async def remove_voter(self, id: int, uuid: str) -> dict[str, Any]:
        self.changes.append("remove")
        return {}

    async def reassign(self, voters: list[int] | None) -> dict[str, Any]:
        self.changes.append("reassign")
        return {}

    async def close(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.ms = NOW

    def __call__(self) -> float:
        return self.ms / 1000


@pytest.fixture
def rig() -> tuple[Scripted, Clock, RecoveryController, OperatorMetrics]:
    api, clock, metrics = Scripted(), Clock(), OperatorMetrics()
    policy = RecoveryPolicy(live_window_seconds=WINDOW / 1000)
    ctl = RecoveryController(api, policy, cluster="q", sink=MemorySink(), metrics=metrics, clock=clock)
    return api, clock, ctl, metrics


def conds(st: Any) -> dict[str, tuple[bool, str]]:
    return {c.type: (c.status, c.reason) for c in st.conditions}


async def test_a_rolling_restart_of_the_leader_never_publishes_quorum_lost(
    rig: tuple[Scripted, Clock, RecoveryController, OperatorMetrics],
) -> None:
    api, clock, ctl, metrics = rig
    script: list[dict[str, Any] | ErrorCode] = [
        describe(5, 1, {}, NOW),  # healthy, leader 1
        ErrorCode.NOT_LEADER,  # leader 1's pod restarted: election
        ErrorCode.REQUEST_TIMED_OUT,
        describe(6, 2, {1: -1, 3: -1}, NOW + 1_500),  # new leader 2, nobody fetched from it yet
        describe(6, 2, {1: 100, 3: 100}, NOW + 2_000),  # followers fetch: healthy again
    ]
    phases = []
    for step, answer in enumerate(script):
        clock.ms = NOW + 500 * step
        api.answer = answer
        st = await ctl.reconcile()
        c = conds(st)
        assert c["QuorumLost"][0] is False and c["Available"][0] is True, (step, c)
        assert 'quorum_lost{quorum="q"} 1.0' not in generate_latest(metrics.registry).decode()
        phases.append(st.to_crd_status()["phase"])
    assert phases == ["Running", "Degraded", "Degraded", "Degraded", "Running"]
    assert conds(st)["Available"] == (True, "LeaderElected")
    assert ctl.unreachable_since_ms is None and api.changes == []


async def test_no_leader_for_longer_than_the_grace_is_quorum_lost(
    rig: tuple[Scripted, Clock, RecoveryController, OperatorMetrics],
) -> None:
    api, clock, ctl, metrics = rig
    api.answer = describe(5, 1, {}, NOW)
    await ctl.reconcile()
    api.answer = ErrorCode.UNAVAILABLE
    seen = []
    for t in range(0, 6_000, 500):
        clock.ms = NOW + 1_000 + t
        st = await ctl.reconcile()
        seen.append((t, conds(st)["QuorumLost"]))
    assert all(lost == (False, "LeaderElection") for t, lost in seen if t < ELECTION_GRACE_MS)
    assert all(lost == (True, "NoLiveMajority") for t, lost in seen if t >= ELECTION_GRACE_MS)
    assert conds(st)["Available"][0] is False
    assert 'quorum_lost{quorum="q"} 1.0' in generate_latest(metrics.registry).decode()


async def test_a_stable_leader_reporting_a_dead_majority_is_lost_at_once(
    rig: tuple[Scripted, Clock, RecoveryController, OperatorMetrics],
) -> None:
    api, clock, ctl, _ = rig
    api.answer = describe(5, 1, {}, NOW)
    await ctl.reconcile()
    clock.ms = NOW + 6_000
    api.answer = describe(5, 1, {2: 6_000, 3: 6_000}, clock.ms)
    st = await ctl.reconcile()
    assert conds(st)["QuorumLost"] == (True, "NoLiveMajority")
    assert st.to_crd_status()["phase"] == "QuorumLost"
    # That leader then resigns (its fetch timeout): no answer now, but this is no election to
    # wait out: the status stays QuorumLost, never back to Available.
    for step in range(1, 4):
        clock.ms = NOW + 6_000 + 500 * step
        api.answer = ErrorCode.NOT_LEADER
        st = await ctl.reconcile()
        assert conds(st)["QuorumLost"] == (True, "NoLiveMajority"), step
        assert conds(st)["Available"][0] is False
    # A live majority again ends the episode; a later election gets its grace again.
    api.answer = describe(6, 2, {}, clock.ms)
    assert conds(await ctl.reconcile())["QuorumLost"][0] is False
    api.answer = ErrorCode.NOT_LEADER
    assert conds(await ctl.reconcile())["QuorumLost"] == (False, "LeaderElection")


# ---------------------------------------------------------------------------------------------
# Real processes: the leader's node restarted (a rolling image change stops pods with SIGTERM)


@pytest.mark.slow
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_restarting_the_leader_node_never_shows_quorum_lost(tmp_path: Path) -> None:
    """End to end in local mode: the leader resigns on SIGTERM (KIP-595) and the client follows
    the new leader within one call, so this passes even without the grace; it guards the whole
    path (describe, conditions, /status) of a rolling restart against a regression."""
    c = LocalCluster(
        tmp_path / "roll", 3, extra=["--no-recovery", "--live-window-seconds", "5"], insecure=True
    )
    try:
        first = wait_until("a leader and 3 known voters", c.describe_all_known, 120, errors=ANY_ERROR)
        leader = int(first["leader_id"])
        wait_until("status Running", lambda: c.status().get("phase") == "Running", 60, errors=ANY_ERROR)
        pidfile = c.dir / "control" / f"node-{leader}.pid"
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGTERM)  # the leader resigns and stops; the supervisor restarts it
        seen: list[tuple[str, str]] = []

        def settled() -> bool:
            st = c.status()
            lost = next(x for x in st["conditions"] if x["type"] == "QuorumLost")
            seen.append((st["phase"], lost["status"]))
            restarted = pidfile.exists() and int(pidfile.read_text()) != pid
            return restarted and st["phase"] == "Running" and st["leaderId"] > 0 and len(seen) > 20

        wait_until("the quorum Running again with the node restarted", settled, 120, 0.1, errors=ANY_ERROR)
        assert ("QuorumLost", "True") not in seen and all(s == "False" for _, s in seen), seen
    finally:
        assert c.stop() == 0, c.tail()

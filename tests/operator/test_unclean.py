"""KIP-704 style unclean recovery in Kubernetes mode (kraftkeeper_operator/k8s/unclean.py): choosing
the survivor, the "exactly once per outage" bookkeeping over the in-memory quorum model and the
in-memory request store, and the real init-container script running the real
``kraftkeeper quorum recover-unclean`` on a real data directory (the kubelet's part, played
locally). The same flow against a real kube-apiserver is in tests/k8s/test_operator_unclean.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.controller import RecoveryController
from kraftkeeper_operator.core.recovery import RecoveryPolicy
from kraftkeeper_operator.core.survivor import LogState, Probe, decide_survivor
from kraftkeeper_operator.k8s.manifests import BOOTSTRAP_KEY, parse_spec, statefulset
from kraftkeeper_operator.k8s.unclean import (
    UNCLEAN_DETAIL_KEY,
    UNCLEAN_KEY,
    MemoryRequestStore,
    UncleanCoordinator,
    UncleanRequest,
    request_from_configmap,
)
from kraftkeeper_operator.telemetry import MemorySink, OperatorMetrics
from kraftkeeper_operator.testing.memory import InMemoryQuorum
from prometheus_client import generate_latest

from quorum.storage.meta import load_meta
from tests.operator.helpers import Clock
from tests.operator.operator_nodes import engine_missing, run_format_container

OWNER = {"apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum", "name": "q", "uid": "u-1"}


def probe(ordinal: int, node_id: int | None, leo: int | None, epoch: int = 3) -> Probe:
    if node_id is None or leo is None:
        return Probe(ordinal, f"ep{ordinal}", error="ClientConnectorError: refused")
    return Probe(ordinal, f"ep{ordinal}", state=LogState(node_id, epoch, leo))


def pick(known: list[tuple[int, str]], probes: list[Probe]) -> tuple[Probe, tuple[str, ...]] | None:
    """The survivor, every replica that did not answer being gone (test_survivor_wait.py has
    the replicas that may still answer)."""
    d = decide_survivor(known, probes, gone={p.ordinal + 1 for p in probes if p.state is None} | {9})
    return (d.survivor, d.uuids) if d.survivor is not None else None


def test_survivor_is_the_answering_former_voter_a_raft_election_would_prefer() -> None:
    known = [(1, "u1"), (2, "u2"), (3, "u3"), (4, "u4"), (5, "u5")]
    probes = [probe(0, 1, 40), probe(1, 2, 55), probe(2, None, None), probe(3, 4, 55), probe(4, 5, 12)]
    got = pick(known, probes)
    assert got is not None and got[0].node_id == 2 and got[1] == ("u2",)  # tie 2/4: the lower id
    # The longest log is a stale one (last epoch 2): replica 5's newer epoch wins.
    stale = [probe(0, 1, 900, epoch=2), probe(1, None, None), probe(2, None, None), probe(3, None, None)]
    got = pick(known, [*stale, probe(4, 5, 12, epoch=3)])
    assert got is not None and got[0].node_id == 5
    # Not a former voter (a scale-up replica), a pod answering for another id, no answer: ignored.
    assert pick([(1, "u1")], [probe(1, 2, 99), probe(0, 3, 99)]) is None
    assert pick([(1, "u1")], [probe(1, 2, 99), probe(0, None, None)]) is None
    assert pick([(1, "u1"), (2, "")], [probe(1, 2, 99), probe(0, None, None)]) is None  # no UUID for 2
    # Mid-recovery voter set (AddThenRemove): both UUIDs of the id go into the request.
    got = pick([(1, "old"), (1, "new"), (2, "u2")], [probe(0, 1, 7), probe(1, None, None)])
    assert got is not None and got[1] == ("old", "new")
    assert pick([], [probe(0, 1, 7)]) is None


class Rig:
    """The real controller over the in-memory quorum, plus the coordinator over the in-memory
    store; ``probe`` answers like each replica's ``/v1/node/log-state`` would."""

    def __init__(
        self, *, allowed: bool, after: float = 30.0, store: MemoryRequestStore | None = None
    ) -> None:
        self.clock = Clock()
        self.q = InMemoryQuorum(3, self.clock.ms)
        self.q.append(50)
        self.sink = MemorySink()
        self.metrics = OperatorMetrics()
        policy = RecoveryPolicy(live_window_seconds=3, unclean_allowed=allowed, unclean_after_seconds=after)
        self.ctl = RecoveryController(
            self.q, policy, cluster="ns/q", sink=self.sink, metrics=self.metrics, clock=self.clock
        )
        self.store = store if store is not None else MemoryRequestStore()
        self.coord = self.coordinator()

    def coordinator(self) -> UncleanCoordinator:
        return UncleanCoordinator(
            self.store, self.sink, cluster="ns/q", probe=self.probe, metrics=self.metrics, clock=self.clock
        )

    async def probe(self, ordinal: int, endpoint: str) -> Probe:
        rid = ordinal + 1
        try:
            r = self.q.current(rid)
        except KeyError:
            return Probe(ordinal, endpoint, error="refused")
        return Probe(ordinal, endpoint, state=LogState(rid, self.q.epoch, self.q.log_end - r.lag))

    def gone(self) -> set[int]:
        """The replicas killed (their pods gone, as gone_replicas would say)."""
        out = set()
        for rid in (1, 2, 3):
            try:
                self.q.current(rid)
            except KeyError:
                out.add(rid)
        return out

    async def step(self, seconds: float = 1.0) -> tuple[bool, str | None]:
        self.clock.t += seconds
        self.q.tick()
        st = await self.ctl.reconcile()
        lost = st.condition("QuorumLost").status
        note = await self.coord.step(self.ctl, lost, ["ep0", "ep1", "ep2"], self.gone())
        return lost, note

    def recover_survivor(self) -> None:
        """What the survivor's pod does after the restart: sole voter at a new epoch."""
        req = request_from_configmap(self.store.data)
        assert req is not None
        self.q.voters = [(req.replica_id, req.uuids[0])]
        self.q.tick()


async def test_disabled_never_acts_whatever_the_outage_length() -> None:
    rig = Rig(allowed=False, after=30)
    await rig.step()
    rig.q.kill(1)
    rig.q.kill(3)
    for i in range(20):
        lost, note = await rig.step(5)
        assert (lost or i == 0) and note is None  # the first pass may be a leader election's grace
    assert rig.store.data == {} and rig.store.restarts == []
    assert not [e for e in rig.sink.events if e.type.startswith("unclean")]
    text = generate_latest(rig.metrics.registry).decode()
    assert 'kraftkeeper_operator_quorum_lost_seconds{quorum="ns/q"} 95.0' in text


async def test_once_per_outage_then_again_only_after_the_quorum_came_back() -> None:
    rig = Rig(allowed=True, after=30)
    await rig.step()
    survivor_uuid = rig.q.current(2).uuid
    rig.q.kill(1)
    rig.q.kill(3)
    lost, note = await rig.step()
    assert not lost  # no leader answers: a leader election's grace first (status.py)
    lost, note = await rig.step(3)
    assert lost and note is not None and "due at" in note
    for _ in range(5):
        lost, note = await rig.step(5)
        assert rig.store.data == {}, "acted before afterSeconds"
    lost, note = await rig.step(10)
    assert note is not None and "requested" in note
    req = request_from_configmap(rig.store.data)
    assert req is not None and req.replica_id == 2 and req.uuids == (survivor_uuid,) and req.ordinal == 1
    assert rig.store.data[UNCLEAN_KEY] == f"2 {req.token} {survivor_uuid}\n"
    assert rig.store.restarts == [1] and req.pod_deleted_ms is not None
    assert req.candidates == {"2": [rig.q.epoch, rig.q.log_end]} and req.last_epoch == rig.q.epoch
    # Still lost for a long time: no second token, no second restart, one event.
    for _ in range(20):
        lost, note = await rig.step(10)
        assert lost and note is not None and req.token in note
    assert rig.store.restarts == [1]
    assert request_from_configmap(rig.store.data) == req
    assert [e.type for e in rig.sink.events] == ["unclean_recovery"]
    ev = rig.sink.events[0]
    assert ev.replica_id == 2 and ev.new_uuid == survivor_uuid and ev.recovery_id == req.token
    assert "lost" in ev.detail["warning"]
    item = req.to_crd_status()
    assert item["recoveryId"] == f"unclean-{req.token}" and item["result"] == "InProgress"

    rig.recover_survivor()
    lost, note = await rig.step()
    assert not lost and note is None
    done = request_from_configmap(rig.store.data)
    assert done is not None and done.token == req.token and done.completed_ms is not None
    assert done.outcome == "quorum back with voters [2]"
    assert [e.type for e in rig.sink.events] == ["unclean_recovery", "unclean_recovery_completed"]
    assert done.to_crd_status()["result"] == "Succeeded"
    assert (
        'kraftkeeper_operator_unclean_recoveries_total{quorum="ns/q"} 1.0'
        in generate_latest(rig.metrics.registry).decode()
    )

    # Replicas 1 and 3 return and are voters again (the reassignment to 1..3); then a new outage
    # takes 2 and 3: a new request, with a new token, for replica 1.
    rig.q.revive(1)
    rig.q.revive(3)
    rig.q.voters = [(2, survivor_uuid), (1, rig.q.current(1).uuid), (3, rig.q.current(3).uuid)]
    lost, _ = await rig.step()
    assert not lost
    rig.q.kill(2)
    rig.q.kill(3)
    for _ in range(8):
        await rig.step(5)
    again = request_from_configmap(rig.store.data)
    assert again is not None and again.token != req.token and again.replica_id == 1
    assert rig.store.restarts == [1, 0]


async def test_operator_restart_between_request_and_pod_deletion_only_deletes_the_pod() -> None:
    store = MemoryRequestStore(fail_restart=True)
    rig = Rig(allowed=True, after=30, store=store)
    await rig.step()
    rig.q.kill(2)
    rig.q.kill(3)
    for _ in range(10):
        await rig.step(5)
    req = request_from_configmap(store.data)
    assert req is not None and req.replica_id == 1 and req.pod_deleted_ms is None and store.restarts == []
    # A new operator process (same store), the API reachable again: same token, pod deleted once.
    store.fail_restart = False
    rig.coord = rig.coordinator()
    rig.ctl.unreachable_since_ms = rig.clock.ms()  # a restarted operator starts the clock again
    for _ in range(5):
        await rig.step(5)
    after = request_from_configmap(store.data)
    assert after is not None and after.token == req.token and after.pod_deleted_ms is not None
    assert store.restarts == [0]
    assert [e.type for e in rig.sink.events] == ["unclean_recovery"]


async def test_an_administrator_can_withdraw_a_request() -> None:
    """Deleting both keys withdraws an outstanding request (e.g. the survivor's pod refused it
    because its volume was replaced): with the policy still on, the operator asks again, with a
    new token; turned off, it does nothing more."""
    rig = Rig(allowed=True, after=30)
    await rig.step()
    rig.q.kill(2)
    rig.q.kill(3)
    for _ in range(8):
        await rig.step(5)
    first = request_from_configmap(rig.store.data)
    assert first is not None and rig.store.restarts == [0]
    rig.store.data.clear()
    await rig.step()
    second = request_from_configmap(rig.store.data)
    assert second is not None and second.token != first.token and rig.store.restarts == [0, 0]
    rig.ctl.set_policy(RecoveryPolicy(live_window_seconds=3, unclean_allowed=False))
    rig.store.data.clear()
    for _ in range(5):
        _, note = await rig.step(5)
        assert note is None
    assert rig.store.data == {} and rig.store.restarts == [0, 0]
    assert [e.type for e in rig.sink.events] == ["unclean_recovery", "unclean_recovery"]


async def test_an_unreadable_request_blocks_instead_of_guessing() -> None:
    store = MemoryRequestStore(data={UNCLEAN_DETAIL_KEY: "{not json"})
    rig = Rig(allowed=True, after=30, store=store)
    await rig.step()
    rig.q.kill(2)
    rig.q.kill(3)
    for _ in range(10):
        _, note = await rig.step(5)
        assert note is not None and UNCLEAN_DETAIL_KEY in note
    assert store.restarts == [] and store.data == {UNCLEAN_DETAIL_KEY: "{not json"}


async def test_lost_status_keeps_the_last_voter_set_for_a_restarted_operator() -> None:
    rig = Rig(allowed=True)
    await rig.step()
    uuids = {i: rig.q.current(i).uuid for i in (1, 2, 3)}
    rig.q.kill(1)
    rig.q.kill(2)
    rig.q.kill(3)
    st = await rig.ctl.reconcile()
    assert st.condition("QuorumLost").reason == "LeaderElection"  # the grace of an election
    rig.clock.t += 3
    st = await rig.ctl.reconcile()
    assert st.view is None
    crd = st.to_crd_status()
    assert crd["phase"] == "QuorumLost"
    assert [(v["id"], v["uuid"], v["logEndOffset"]) for v in crd["voters"]] == [
        (i, uuids[i], None) for i in (1, 2, 3)
    ]
    st.annotate_lost("UncleanRecoveryRequested", "unclean recovery abc requested")
    cond = next(c for c in st.to_crd_status()["conditions"] if c["type"] == "QuorumLost")
    assert cond["reason"] == "UncleanRecoveryRequested" and cond["message"].endswith("abc requested")


def test_request_round_trips_and_refuses_garbage() -> None:
    req = UncleanRequest("0a1b", 3, 2, ("u-3",), 77, 1_000, 31_000, {"3": [4, 77]}, last_epoch=4)
    assert UncleanRequest.from_json(req.to_json()) == req
    # A request written by an operator before epochs were recorded still reads.
    old = json.loads(req.to_json())
    old["candidates"], _ = {"3": 77}, old.pop("last_epoch")
    back = UncleanRequest.from_json(json.dumps(old))
    assert back.candidates == {"3": [-1, 77]} and back.last_epoch == -1
    with pytest.raises(ValueError):
        UncleanRequest.from_json("[1, 2]")
    with pytest.raises((KeyError, TypeError)):
        UncleanRequest.from_json(json.dumps({"token": "x"}))


# ---------------------------------------------------------------------------------------------
# The init container, run locally with the real CLI


def body() -> dict[str, Any]:
    return {"metadata": {"name": "q", "namespace": "ns", "uid": "u-1"}, "spec": {"voters": 3}}


def _state_epoch(d: Path) -> int:
    raw = json.loads((d / "__cluster_metadata-0" / "quorum-state").read_text())
    return int(raw.get("leader_epoch", raw.get("leaderEpoch", -1)))


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_init_container_runs_recover_unclean_once_for_its_own_id_and_uuid(tmp_path: Path) -> None:
    q = parse_spec(body())
    sts = statefulset(q, OWNER, replicas=3, bootstrap_voters=3)
    flags = tmp_path / "flags"
    flags.mkdir()
    (flags / BOOTSTRAP_KEY).write_text("true")
    data = tmp_path / "pvc-1"
    out = run_format_container(sts, 1, data, flags)
    assert out.returncode == 0, out.stderr
    mine = load_meta(data).storage_uuid
    # A request for another replica, for this id with another UUID, or with a token that is not
    # what the operator writes: nothing happens, and the node starts normally.
    for line, said in (
        (f"3 0a1b {mine}\n", ""),
        ("2 0a1b 11111111-2222-3333-4444-555555555555\n", "not recovering"),
        (f"2 ../x {mine}\n", ""),
    ):
        (flags / UNCLEAN_KEY).write_text(line)
        out = run_format_container(sts, 1, data, flags)
        assert out.returncode == 0, out.stderr
        assert "UNCLEAN RECOVERY" not in out.stdout and said in out.stdout
        assert not list(data.glob("unclean-recovery.*"))

    (flags / UNCLEAN_KEY).write_text(f"2 0a1b {mine}\n")
    out = run_format_container(sts, 1, data, flags)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "UNCLEAN RECOVERY 0a1b" in out.stdout and "sole voter" in out.stdout
    assert (data / "unclean-recovery.0a1b.done").exists()
    epoch = _state_epoch(data)
    assert epoch >= 1
    # A pod restart (the init container runs again): never a second recovery.
    out = run_format_container(sts, 1, data, flags)
    assert out.returncode == 0, out.stderr
    assert "was done on this volume already" in out.stdout
    assert _state_epoch(data) == epoch
    # Same request, but the volume was replaced (new UUID): the fresh disk is never recovered.
    fresh = tmp_path / "pvc-1-new"
    out = run_format_container(sts, 1, fresh, flags)
    assert out.returncode == 0, out.stderr
    assert "not recovering" in out.stdout and not (fresh / "__cluster_metadata-0" / "quorum-state").exists()


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_init_container_fails_loudly_when_recover_unclean_fails(tmp_path: Path) -> None:
    q = parse_spec(body())
    sts = statefulset(q, OWNER, replicas=3, bootstrap_voters=3)
    flags = tmp_path / "flags"
    flags.mkdir()
    data = tmp_path / "pvc-0"
    assert run_format_container(sts, 0, data, flags).returncode == 0
    mine = load_meta(data).storage_uuid
    # A damaged quorum-state: recover-unclean refuses (CORRUPT_LOG) and must not be papered over.
    (data / "__cluster_metadata-0").mkdir()
    (data / "__cluster_metadata-0" / "quorum-state").write_text("garbage\n")
    (flags / UNCLEAN_KEY).write_text(f"1 c0ffee {mine}\n")
    out = run_format_container(sts, 0, data, flags)
    assert out.returncode != 0
    assert not (data / "unclean-recovery.c0ffee.done").exists()
    assert "UNCLEAN RECOVERY c0ffee" in out.stdout  # it tried, and says so in the pod's log
    assert "CORRUPT_LOG" in out.stderr and "quorum-state" in out.stderr
    # The next attempt (the kubelet restarts a failed init container) tries again, still no marker.
    assert run_format_container(sts, 0, data, flags).returncode != 0
    assert not (data / "unclean-recovery.c0ffee.done").exists()

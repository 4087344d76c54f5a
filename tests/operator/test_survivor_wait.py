"""An unclean-recovery survivor is never chosen on a probe set that misses a former voter which
may still answer (kraftkeeper_operator/core/survivor.py ``decide_survivor``): a probe that timed
out under load once made a longer stale log the survivor over a newer epoch. Injected here as a
probe that times out once, in both modes' code: the Kubernetes coordinator (k8s/unclean.py, with
the pods' states as the API lists them) and local mode's chooser over real processes (a running
process is a node that may answer; a stopped one is gone)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.core.recovery import RecoveryPolicy
from kraftkeeper_operator.core.survivor import LogState, Probe, decide_survivor
from kraftkeeper_operator.k8s.unclean import MemoryRequestStore, UncleanCoordinator, gone_replicas
from kraftkeeper_operator.local.cluster import ClusterLayout
from kraftkeeper_operator.local.supervisor import Supervisor
from kraftkeeper_operator.local.unclean import LocalUnclean
from kraftkeeper_operator.telemetry import MemorySink

from tests.operator.helpers import Clock

KNOWN = [(i, f"u{i}") for i in range(1, 6)]
# Replica 1 holds a write committed at epoch 7; replica 4 is a cut-off former leader whose
# longer log ends at epoch 6 (never committed). 2, 3 and 5 are gone.
FRESH, STALE = LogState(1, 7, 120), LogState(4, 6, 400)


def answer(state: LogState) -> Probe:
    return Probe(state.node_id - 1, f"ep{state.node_id - 1}", state=state)


def timed_out(rid: int) -> Probe:
    return Probe(rid - 1, f"ep{rid - 1}", error="TimeoutError")


def test_a_former_voter_that_did_not_answer_blocks_the_choice_unless_it_is_gone() -> None:
    partial = [timed_out(1), answer(STALE)]
    d = decide_survivor(KNOWN, partial, gone={2, 3, 5})
    assert d.survivor is None and d.waiting_for == (1,)
    assert "former voter(s) 1" in d.note() and d.errors == ("ep0: TimeoutError",)
    # Pods/processes unknown: every former voter must answer.
    assert decide_survivor(KNOWN, [answer(FRESH), answer(STALE)], gone=None).waiting_for == (2, 3, 5)
    # Answered: Raft's election order picks the newer epoch.
    d = decide_survivor(KNOWN, [answer(FRESH), answer(STALE)], gone={2, 3, 5})
    assert d.survivor is not None and d.survivor.node_id == 1 and d.uuids == ("u1",)
    assert sorted(c.node_id for c in d.candidates) == [1, 4]
    # Replica 1 really gone (its process stopped, its pod evicted): what is left is chosen.
    d = decide_survivor(KNOWN, partial, gone={1, 2, 3, 5})
    assert d.survivor is not None and d.survivor.node_id == 4
    # A replaced disk answering for replica 1 is accounted for, but no candidate.
    replaced = Probe(0, "ep0", state=FRESH, storage_uuid="new-disk")
    d = decide_survivor(KNOWN, [replaced, answer(STALE)], gone={2, 3, 5})
    assert d.survivor is not None and d.survivor.node_id == 4 and [c.node_id for c in d.candidates] == [4]
    # Nobody left: no decision, and no wait either.
    d = decide_survivor(KNOWN, [timed_out(1)], gone={1, 2, 3, 4, 5})
    assert d.survivor is None and d.waiting_for == () and "no former voter" in d.note()


def _pod(ordinal: int, phase: str | None, **extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {"name": f"q-{ordinal}", "uid": f"uid-{ordinal}"}}
    if phase is not None:
        pod["status"] = {"phase": phase, **extra}
    return pod


def _node(state: dict[str, Any]) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "node", "state": state}]}


def test_which_pods_count_as_gone() -> None:
    pods = [
        _pod(0, "Running", **_node({"running": {}})),  # must answer
        _pod(1, "Pending", conditions=[{"type": "PodScheduled", "status": "False"}]),  # node lost
        _pod(2, "Running", **_node({"waiting": {"reason": "CrashLoopBackOff"}})),
        _pod(3, "Pending", **_node({"waiting": {"reason": "ContainerCreating"}})),  # starting
        _pod(4, "Running", **_node({"running": {}})),
        _pod(5, "Running", **_node({"terminated": {"exitCode": 1}})),
    ]
    pods[4]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # evicted
    assert gone_replicas(pods, "q", 8) == {2, 3, 5, 6, 7, 8}  # 7, 8: no pod at all
    init_loop = {
        "initContainerStatuses": [{"name": "format", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
    }
    assert gone_replicas([_pod(0, "Pending", **init_loop)], "q", 1) == {1}
    assert gone_replicas([_pod(0, "Pending")], "q", 1) == set()  # scheduled, on its way up
    assert gone_replicas(None, "q", 3) is None  # the listing failed: nothing is known gone


@dataclass
class Ctl:
    """What the coordinators read of the recovery controller (and local mode's event sink)."""

    policy: RecoveryPolicy
    unreachable_since_ms: int | None
    known_voters: list[tuple[int, str]] = field(default_factory=lambda: list(KNOWN))
    sink: MemorySink = field(default_factory=MemorySink)


class FlakyProbes:
    """Each replica's log-state answer; replica 1's first ``timeouts`` probes time out."""

    def __init__(self, timeouts: int) -> None:
        self.timeouts = timeouts
        self.asked: list[int] = []

    async def __call__(self, ordinal: int, endpoint: str) -> Probe:
        rid = ordinal + 1
        self.asked.append(rid)
        if rid == 1 and self.timeouts > 0:
            self.timeouts -= 1
            return Probe(ordinal, endpoint, error="TimeoutError")
        state = {1: FRESH, 4: STALE}.get(rid)
        return Probe(ordinal, endpoint, state=state, error=None if state else "refused")


async def test_kubernetes_coordinator_waits_for_a_running_pod_whose_probe_timed_out() -> None:
    clock = Clock()
    store = MemoryRequestStore()
    probes = FlakyProbes(timeouts=3)
    coord = UncleanCoordinator(store, MemorySink(), cluster="ns/q", probe=probes, clock=clock)
    policy = RecoveryPolicy(live_window_seconds=3, unclean_allowed=True, unclean_after_seconds=30)
    ctl = Ctl(policy, unreachable_since_ms=clock.ms() - 60_000)
    eps = [f"ep{k}" for k in range(5)]
    pods = [_pod(k, "Running", **_node({"running": {}})) for k in (0, 3)]
    gone = gone_replicas(pods, "q", 5)
    assert gone == {2, 3, 5}
    for _ in range(3):  # replica 1's pod runs but its probe times out: no choice, pass after pass
        note = await coord.step(ctl, True, eps, gone)
        assert note is not None and "former voter(s) 1" in note, note
        assert store.data == {} and store.restarts == []
    note = await coord.step(ctl, True, eps, gone)
    assert note is not None and "requested" in note
    req = coord.request
    assert req is not None and req.replica_id == 1 and req.last_epoch == 7 and store.restarts == [0]
    assert req.candidates == {"1": [7, 120], "4": [6, 400]}


async def test_kubernetes_coordinator_without_pod_states_waits_for_every_former_voter() -> None:
    clock = Clock()
    store = MemoryRequestStore()
    coord = UncleanCoordinator(store, MemorySink(), cluster="ns/q", probe=FlakyProbes(0), clock=clock)
    policy = RecoveryPolicy(live_window_seconds=3, unclean_allowed=True, unclean_after_seconds=30)
    ctl = Ctl(policy, unreachable_since_ms=clock.ms() - 60_000)
    note = await coord.step(ctl, True, [f"ep{k}" for k in range(5)], None)
    assert note is not None and "former voter(s) 2, 3, 5" in note and store.data == {}


class FlakyClient:
    """``QuorumClient.node_get`` as local mode's probe calls it: replica 1's first answer times
    out (TimeoutError, as aiohttp raises it), the others come from the table."""

    def __init__(self, layout: ClusterLayout) -> None:
        self.layout = layout
        self.timeouts = 1

    async def node_get(self, endpoint: str, path: str) -> tuple[int, bytes]:
        rid = int(endpoint.rsplit(":", 1)[1]) - self.layout.base_port
        if rid == 1 and self.timeouts > 0:
            self.timeouts -= 1
            raise TimeoutError()
        state = {1: FRESH, 4: STALE}.get(rid)
        if state is None:
            raise ConnectionRefusedError(111, "Connection refused")
        body = f'{{"node_id": {rid}, "last_epoch": {state.last_epoch}, "end_offset": {state.end_offset}}}'
        return 200, body.encode()


def _five_disks(tmp_path: Path) -> tuple[ClusterLayout, Supervisor]:
    """A five-node cluster directory whose node i's disk has storage UUID ``u<i>``, and its
    supervisor (no node started)."""
    layout = ClusterLayout.load_or_create(tmp_path / "c", 5, 40000)
    for i in range(1, 6):
        layout.data_dir(i).mkdir()
        (layout.data_dir(i) / "meta.properties").write_text(f"version=1\ndirectory.id=u{i}\n")
    return layout, Supervisor(layout)


@pytest.mark.slow  # starts processes
async def test_local_mode_waits_for_a_running_node_whose_probe_timed_out(tmp_path: Path) -> None:
    layout, sup = _five_disks(tmp_path)
    # Nodes 1 and 4 run (real processes that answer nothing themselves: the client plays their
    # HTTP side); 2, 3 and 5 have no process, as after they stopped for good.
    for i in (1, 4):
        sup.nodes[i].proc = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        policy = RecoveryPolicy(live_window_seconds=3, unclean_allowed=True, unclean_after_seconds=1)
        ctl = Ctl(policy, unreachable_since_ms=0)
        client = FlakyClient(layout)
        # The restart is the store's: recorded here instead of running recover-unclean.
        store = MemoryRequestStore()
        unclean = LocalUnclean(layout, sup, ctl, client, store=store)  # type: ignore[arg-type]
        assert sup.gone() == {2, 3, 5}
        note = await unclean.maybe_run()  # node 1 runs but timed out: wait
        assert note is not None and "former voter(s) 1" in note and store.restarts == []
        note = await unclean.maybe_run()
        req = unclean.coordinator.request
        assert req is not None and req.replica_id == 1 and store.restarts == [0], note
        assert req.candidates == {"1": [7, 120], "4": [6, 400]}
    finally:
        for n in sup.nodes.values():
            if n.proc is not None and n.proc.returncode is None:
                n.proc.kill()
                await n.proc.wait()


@pytest.mark.slow  # starts processes
async def test_local_mode_chooses_without_a_node_whose_process_is_gone(tmp_path: Path) -> None:
    layout, sup = _five_disks(tmp_path)
    sup.nodes[4].proc = await asyncio.create_subprocess_exec("sleep", "60")
    sup.nodes[1].proc = p1 = await asyncio.create_subprocess_exec("true")
    await p1.wait()  # node 1's process exited (its restart back-off): it cannot answer
    try:
        policy = RecoveryPolicy(live_window_seconds=3, unclean_allowed=True, unclean_after_seconds=1)
        ctl = Ctl(policy, unreachable_since_ms=0)
        store = MemoryRequestStore()
        unclean = LocalUnclean(layout, sup, ctl, FlakyClient(layout), store=store)  # type: ignore[arg-type]
        assert sup.gone() == {1, 2, 3, 5}
        await unclean.maybe_run()
        req = unclean.coordinator.request
        assert req is not None and req.replica_id == 4 and store.restarts == [3]
    finally:
        p4 = sup.nodes[4].proc
        assert p4 is not None
        p4.kill()
        await p4.wait()

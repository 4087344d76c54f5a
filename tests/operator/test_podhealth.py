"""Crash-looping quorum pods (podhealth.py): which pod, why, one episode from the first
CrashLoopBackOff until Ready or gone; and a crash-looping replica is never taken as a disk
replacement by the recovery decisions."""

from __future__ import annotations

from typing import Any

from kraftkeeper_operator.controller import RecoveryController
from kraftkeeper_operator.core.recovery import RecoveryPolicy
from kraftkeeper_operator.k8s.podhealth import CrashLoops, pod_trouble, replica_of
from kraftkeeper_operator.telemetry import MemorySink
from kraftkeeper_operator.testing.memory import InMemoryQuorum

from tests.operator.helpers import Clock

WRONG_CLUSTER = (
    "INVALID_REQUEST: /var/lib/kraftkeeper/data is formatted for cluster 7Hq2 but this pod belongs "
    "to cluster a1b2; refusing to touch it"
)


def pod(
    name: str,
    uid: str,
    *,
    crash: bool = False,
    ready: bool = False,
    init: bool = True,
    restarts: int = 3,
) -> dict[str, Any]:
    cs: dict[str, Any] = {"name": "format" if init else "kraftkeeper", "restartCount": restarts}
    if crash:
        cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}
        cs["lastState"] = {"terminated": {"exitCode": 2, "reason": "Error", "message": WRONG_CLUSTER}}
    else:
        cs["state"] = {"running": {}}
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        ("initContainerStatuses" if init else "containerStatuses"): [cs],
    }
    return {"metadata": {"name": name, "uid": uid}, "status": status}


def test_replica_of_a_pod_name() -> None:
    assert replica_of("kk-0", "kk") == 1 and replica_of("kk-2", "kk") == 3
    assert replica_of("kk-x", "kk") is None and replica_of("other-1", "kk") is None
    assert replica_of("kk-a-1", "kk") is None  # another quorum named kk-a


def test_the_trouble_names_pod_container_exit_code_and_message() -> None:
    t = pod_trouble(pod("kk-2", "u2", crash=True, restarts=4), "kk")
    assert t is not None
    assert t.describe() == (
        f"pod kk-2 (replica 3) crash-looping: container format CrashLoopBackOff, exit code 2, restarts 4: "
        f"{WRONG_CLUSTER}"
    )
    main = pod_trouble(pod("kk-0", "u0", crash=True, init=False), "kk")
    assert main is not None and main.container == "kraftkeeper" and main.replica_id == 1
    assert pod_trouble(pod("kk-1", "u1"), "kk") is None
    long = pod("kk-1", "u1", crash=True)
    long["status"]["initContainerStatuses"][0]["lastState"]["terminated"]["message"] = "x\n" * 500
    t = pod_trouble(long, "kk")
    assert t is not None and len(t.message) == 200 and "\n" not in t.message
    # Malformed or partial status objects are no trouble, never an exception.
    assert pod_trouble({"metadata": {"name": "kk-0"}}, "kk") is None
    assert pod_trouble({"metadata": {}, "status": {"containerStatuses": [{}]}}, "kk") is None


def test_one_episode_until_ready_or_gone() -> None:
    loops = CrashLoops("kk")
    started, ended = loops.update([pod("kk-0", "u0", ready=True), pod("kk-2", "u2", crash=True)])
    assert [t.pod for t in started] == ["kk-2"] and ended == []
    assert loops.replica_ids() == {3}
    # Running between two crashes (not Ready): the same episode, nothing new.
    assert loops.update([pod("kk-2", "u2")]) == ([], [])
    assert loops.update([pod("kk-2", "u2", crash=True, restarts=5)]) == ([], [])
    assert "restarts 5" in loops.summary()
    # Ready again: over.
    started, ended = loops.update([pod("kk-2", "u2", ready=True)])
    assert started == [] and [t.pod for t in ended] == ["kk-2"] and loops.replica_ids() == set()
    # A new episode later gets a new report; a deleted pod's episode ends.
    started, _ = loops.update([pod("kk-2", "u2", crash=True)])
    assert [t.pod for t in started] == ["kk-2"]
    started, ended = loops.update([])
    assert started == [] and [t.pod for t in ended] == ["kk-2"]
    # The pod recreated under the same name (a new uid) crash-looping: a new episode.
    loops.update([pod("kk-2", "u2", crash=True)])
    started, ended = loops.update([pod("kk-2", "u3", crash=True)])
    assert [t.uid for t in started] == ["u3"] and [t.uid for t in ended] == ["u2"]


async def test_a_crash_looping_replica_is_never_taken_as_a_disk_replacement() -> None:
    clock = Clock()
    q = InMemoryQuorum(3, clock.ms)
    sink = MemorySink()
    policy = RecoveryPolicy(stabilization_seconds=2, max_lag=10, live_window_seconds=3)
    ctl = RecoveryController(q, policy, cluster="t", sink=sink, clock=clock)
    old = q.current(3).uuid
    new = q.replace_disk(3, lag=0)  # a process with a new UUID fetches as observer 3...
    ctl.book.suspect_ids = {3}  # ...but its pod crash-loops (e.g. started briefly, then died)
    for _ in range(20):
        clock.t += 1
        q.tick()
        st = await ctl.reconcile()
    assert sink.events == [] and st.recoveries == []
    assert [c for c in q.calls if c[0] != "describe"] == []
    assert "crash-looping" in (ctl.book.note or "")
    assert (3, old) in q.voters
    # Its pod is Ready again: now it is a replacement like any other.
    ctl.book.suspect_ids = set()
    for _ in range(20):
        clock.t += 1
        q.tick()
        st = await ctl.reconcile()
        if any(r["phase"] == "Completed" for r in st.recoveries):
            break
    assert (3, new) in q.voters and (3, old) not in q.voters
    assert sink.types()[0] == "disk_replacement_detected"

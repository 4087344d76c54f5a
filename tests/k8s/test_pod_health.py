"""A crash-looping quorum pod is reported, against a real kube-apiserver: no kubelet
runs here, so the pod's status is written through the API the way the kubelet writes it
(``pods/status``): the format init container in CrashLoopBackOff after refusing a volume formatted
for another cluster. The operator names the pod in the Degraded condition, posts one Warning
Event per episode (not one per pass), and a Normal Event when the pod is Ready again."""

from __future__ import annotations

from typing import Any

import pytest

from quorum.timefmt import rfc3339
from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import KQ, Operator, create, create_quorum_pod, events_of, get, kq, operator  # noqa: F401

pytestmark = pytest.mark.k8s

WRONG_CLUSTER = "INVALID_REQUEST: the volume is formatted for cluster 7Hq2, this pod belongs to cl"


def _pod_status(crash: bool, restarts: int) -> dict[str, Any]:
    now = rfc3339()
    fmt: dict[str, Any] = {
        "name": "format",
        "image": "kraftkeeper:test",
        "imageID": "",
        "ready": not crash,
        "restartCount": restarts,
    }
    if crash:
        fmt["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}}
        fmt["lastState"] = {
            "terminated": {
                "exitCode": 2,
                "reason": "Error",
                "message": WRONG_CLUSTER,
                "startedAt": now,
                "finishedAt": now,
            }
        }
    else:
        fmt["state"] = {
            "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
        }
    return {
        "status": {
            "phase": "Pending" if crash else "Running",
            "conditions": [
                {"type": "Ready", "status": "False" if crash else "True", "lastTransitionTime": now}
            ],
            "initContainerStatuses": [fmt],
        }
    }


def _degraded(kube: KubeEnv, ns: str) -> dict[str, Any] | None:
    st = ((get(kube, KQ.format(ns=ns) + "/cl") or {}).get("status")) or {}
    return next((c for c in st.get("conditions") or [] if c.get("type") == "Degraded"), None)


def test_a_crash_looping_pod_is_reported_once_per_episode(
    kube: KubeEnv,
    namespace: str,
    operator: Operator,  # noqa: F811
) -> None:
    ns = namespace
    uid = create(kube, ns, kq("cl", 3))["metadata"]["uid"]
    create_quorum_pod(kube, ns, "cl", 1, ["kraftkeeper"], init=("format",))
    path = f"/api/v1/namespaces/{ns}/pods/cl-1/status"
    st, body = kube.request("PATCH", path, _pod_status(True, 3), content_type="application/merge-patch+json")
    assert st == 200, body

    cond = kube.wait_for(
        "Degraded naming the crash-looping pod",
        lambda: (c := _degraded(kube, ns)) and "pod cl-1 (replica 2) crash-looping" in c["message"] and c,
        timeout=60,
    )
    assert cond["status"] == "True"
    assert "container format CrashLoopBackOff, exit code 2, restarts 3" in cond["message"]
    assert WRONG_CLUSTER in cond["message"]
    warned = kube.wait_for("a PodCrashLooping Warning", lambda: events_of(kube, ns, uid, "PodCrashLooping"))
    assert warned[0]["type"] == "Warning" and "pod cl-1" in warned[0]["message"]

    # More crashes of the same episode: the status follows, no second Warning.
    st, body = kube.request("PATCH", path, _pod_status(True, 5), content_type="application/merge-patch+json")
    assert st == 200, body
    kube.wait_for(
        "restarts 5 in Degraded", lambda: "restarts 5" in ((_degraded(kube, ns) or {}).get("message", ""))
    )
    events = events_of(kube, ns, uid, "PodCrashLooping")
    assert len(events) == 1 and int(events[0].get("count") or 1) == 1, events
    # Nothing was taken as a disk replacement.
    status = (get(kube, KQ.format(ns=ns) + "/cl") or {}).get("status") or {}
    assert not status.get("recoveries")

    # Ready again: the episode is over.
    st, body = kube.request("PATCH", path, _pod_status(False, 5), content_type="application/merge-patch+json")
    assert st == 200, body
    kube.wait_for("a PodRecovered Event", lambda: events_of(kube, ns, uid, "PodRecovered"), timeout=60)
    kube.wait_for(
        "Degraded no longer naming the pod",
        # "pod cl-1": the unreachable quorum's message names every address, cl-1's among them
        lambda: "pod cl-1" not in ((_degraded(kube, ns) or {}).get("message", "")),
        timeout=60,
    )
    assert len(events_of(kube, ns, uid, "PodCrashLooping")) == 1
    assert operator.proc.poll() is None, operator.tail()


def test_a_node_coming_up_is_told_apart_from_ready_crashed_and_old_ones() -> None:
    """node_starting: the quorum's daemon describes often only while a node container runs, its
    pod is not Ready, and it started within the window (quorums.py next_pass_in)."""
    from kraftkeeper_operator.k8s.podhealth import node_starting

    now = 1_800_000_000_000

    def pod(started_ms: int | None, ready: bool = False, deleting: bool = False,
            container: str = "node") -> dict[str, Any]:
        state = {"running": {"startedAt": rfc3339(started_ms)}} if started_ms is not None else \
            {"waiting": {"reason": "CrashLoopBackOff"}}
        meta: dict[str, Any] = {"name": "demo-0"}
        if deleting:
            meta["deletionTimestamp"] = rfc3339(now)
        return {"metadata": meta, "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": container, "state": state}]}}

    assert node_starting([pod(now - 2_000)], now, 30)
    assert node_starting([pod(now - 60_000, ready=True), pod(now - 500)], now, 30)
    assert not node_starting([pod(now - 2_000, ready=True)], now, 30)  # up: the probe said so
    assert not node_starting([pod(now - 31_000)], now, 30)  # not Ready for long: no fast polling
    assert not node_starting([pod(None)], now, 30)  # crash-looping: nothing runs
    assert not node_starting([pod(now - 2_000, deleting=True)], now, 30)
    assert not node_starting([pod(now - 2_000, container="tls")], now, 30)
    assert not node_starting([], now, 30)

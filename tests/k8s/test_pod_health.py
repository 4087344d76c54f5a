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

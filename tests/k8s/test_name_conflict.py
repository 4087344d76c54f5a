"""Ownership against a real kube-apiserver: a KRaftQuorum whose name makes another quorum's
object name (``x-headless`` makes the Service ``x-headless``, which is ``x``'s headless Service)
is refused with a NameConflict Event and ``status.phase=Failed``, and the older quorum's objects
are untouched; a ConfigMap of a quorum's name that another resource owns is never patched."""

from __future__ import annotations

import pytest

from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import KQ, Operator, create, events_of, get, kq, operator  # noqa: F401

pytestmark = pytest.mark.k8s


def test_a_colliding_name_is_refused_and_foreign_objects_are_left_alone(
    kube: KubeEnv, namespace: str, operator: Operator  # noqa: F811
) -> None:
    x = create(kube, namespace, kq("x", 3))["metadata"]["uid"]
    ns = namespace
    svc_path = f"/api/v1/namespaces/{ns}/services/x-headless"
    headless = kube.wait_for("Service x-headless", lambda: get(kube, svc_path), timeout=60)
    assert headless["metadata"]["ownerReferences"][0]["uid"] == x
    bad = create(kube, ns, kq("x-headless", 3))["metadata"]["uid"]
    told = kube.wait_for("a NameConflict Event", lambda: events_of(kube, ns, bad, "NameConflict"), timeout=60)
    assert "x-headless" in told[0]["message"] and told[0]["type"] == "Warning"
    kube.wait_for(
        "x-headless Failed",
        lambda: (
            ((get(kube, KQ.format(ns=ns) + "/x-headless") or {}).get("status") or {}).get("phase") == "Failed"
            or None
        ),
        timeout=60,
    )
    after = get(kube, svc_path)
    assert (
        after is not None and after["metadata"]["ownerReferences"] == headless["metadata"]["ownerReferences"]
    )
    assert after["spec"]["clusterIP"] == "None"  # still x's headless Service, not a client Service
    assert get(kube, f"/apis/apps/v1/namespaces/{ns}/statefulsets/x-headless") is None

    # A ConfigMap named as quorum y's, owned by another resource: never patched.
    st, owner = kube.request(
        "POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "someone-else"}, "data": {}}
    )
    assert st == 201, owner
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "someone-else", "uid": owner["metadata"]["uid"]}
    foreign = {"metadata": {"name": "y-bootstrap", "ownerReferences": [ref]}, "data": {"mine": "yes"}}
    st, body = kube.request("POST", f"/api/v1/namespaces/{ns}/configmaps", foreign)
    assert st == 201, body
    create(kube, ns, kq("y", 3))
    kube.wait_for(
        "y Failed naming the ConfigMap",
        lambda: (
            "y-bootstrap"
            in str(((get(kube, KQ.format(ns=ns) + "/y") or {}).get("status") or {}).get("conditions") or "")
            or None
        ),
        timeout=60,
    )
    cm = get(kube, f"/api/v1/namespaces/{ns}/configmaps/y-bootstrap")
    assert cm is not None and cm["data"] == {"mine": "yes"} and cm["metadata"]["ownerReferences"] == [ref]
    assert operator.proc.poll() is None, operator.tail()

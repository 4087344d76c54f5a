"""The kopf operator against a real kube-apiserver (fixtures in conftest.py), lifecycle and spec
checks: owned objects, scaling, status, Events, finalizer cleanup (create/update/delete), the quorum
pods under the `restricted` Pod Security level, the bootstrap ConfigMap's flag under server-side
apply, invalid specs, and a status naming a voter whose UUID is not known yet. The disk-failure
recovery and scale-down with real node processes are in test_operator_recovery.py, the unclean
recovery in test_operator_unclean.py; the shared helpers in operator_support.py."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from kraftkeeper_operator.controller import Condition, ControllerStatus
from kraftkeeper_operator.core.view import QuorumView
from kraftkeeper_operator.k8s.kube import BOOTSTRAP_FIELD_MANAGER, FIELD_MANAGER
from kraftkeeper_operator.k8s.manifests import BOOTSTRAP_MOUNT, bootstrap_configmap, parse_spec

from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import KQ, Operator, create, get, kq, operator  # noqa: F401 (operator: a fixture)

pytestmark = pytest.mark.k8s


def test_create_update_delete(kube: KubeEnv, namespace: str, operator: Operator) -> None:  # noqa: F811
    ns = namespace
    obj = create(kube, ns, kq("q1", 3, recovery={"stabilizationSeconds": 5}))
    uid = obj["metadata"]["uid"]
    sts_path = f"/apis/apps/v1/namespaces/{ns}/statefulsets/q1"
    sts = kube.wait_for("StatefulSet q1", lambda: get(kube, sts_path), timeout=60)
    for path in (
        f"/api/v1/namespaces/{ns}/services/q1",
        f"/api/v1/namespaces/{ns}/services/q1-headless",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/q1",
    ):
        o = kube.wait_for(path, lambda p=path: get(kube, p), timeout=30)
        refs = o["metadata"]["ownerReferences"]
        assert refs[0]["uid"] == uid and refs[0]["controller"] is True and refs[0]["kind"] == "KRaftQuorum"
    assert sts["metadata"]["ownerReferences"][0]["uid"] == uid
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["serviceName"] == "q1-headless"
    pod = sts["spec"]["template"]["spec"]
    start = pod["containers"][0]["command"][-1]
    assert "kraftkeeper start" in start and f"3@q1-2.q1-headless.{ns}.svc:9093" in start
    assert start.index("--ignore-formatted") < start.index("exec kraftkeeper start")
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenScaled": "Delete",
        "whenDeleted": "Retain",
    }
    pdb = get(kube, f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/q1")
    assert pdb is not None and pdb["spec"]["maxUnavailable"] == 1
    headless = get(kube, f"/api/v1/namespaces/{ns}/services/q1-headless")
    assert headless is not None and headless["spec"]["clusterIP"] == "None"
    # The bootstrap ConfigMap: owned, mounted into the node container, and without the flag
    # while the quorum has not bootstrapped (here: unreachable).
    cm_path = f"/api/v1/namespaces/{ns}/configmaps/q1-bootstrap"
    cm = get(kube, cm_path)
    assert cm is not None and cm["metadata"]["ownerReferences"][0]["uid"] == uid
    assert "bootstrapped" not in (cm.get("data") or {})
    assert {"name": "bootstrap", "configMap": {"name": "q1-bootstrap", "defaultMode": 420}} in pod["volumes"]
    assert {"name": "bootstrap", "mountPath": BOOTSTRAP_MOUNT, "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]

    # The finalizer is on, status written; no pod runs (no kubelet), so the quorum is unreachable:
    # a status, never a crash.
    def reported() -> dict[str, Any] | None:
        o = get(kube, KQ.format(ns=ns) + "/q1")
        st = (o or {}).get("status") or {}
        return o if st.get("observedGeneration") == 1 and st.get("conditions") else None

    o = kube.wait_for("status of q1", reported, timeout=60)
    assert "kraftkeeper.io/cleanup" in o["metadata"]["finalizers"]
    conds = {c["type"]: c for c in o["status"]["conditions"]}
    assert conds["Available"]["status"] == "False" and conds["QuorumLost"]["status"] == "True"
    assert o["status"]["phase"] == "Bootstrapping" and o["status"]["leaderId"] == -1
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert f'kraftkeeper_operator_quorum_lost{{quorum="{ns}/q1"}} 1.0' in text
    assert operator.proc.poll() is None, operator.tail()

    # Kubernetes Events about the resource (kopf posts one per handler outcome).
    evs = kube.wait_for(
        "an Event for q1",
        lambda: [
            e
            for e in (get(kube, f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
            if e["involvedObject"].get("uid") == uid
        ],
        timeout=30,
    )
    assert evs

    # Scale up: the StatefulSet grows at once, the PDB follows the voter count.
    st, body = kube.request(
        "PATCH",
        KQ.format(ns=ns) + "/q1",
        {"spec": {"voters": 5}},
        content_type="application/merge-patch+json",
    )
    assert st == 200, body
    kube.wait_for("5 replicas", lambda: (get(kube, sts_path) or {}).get("spec", {}).get("replicas") == 5)
    kube.wait_for(
        "PDB maxUnavailable 2",
        lambda: (
            (get(kube, f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/q1") or {})["spec"][
                "maxUnavailable"
            ]
            == 2
        ),
    )
    # Pods keep their bootstrap voter list: scaling does not roll them.
    assert "4@" not in get(kube, sts_path)["spec"]["template"]["spec"]["containers"][0]["command"][-1]  # type: ignore[index]

    # Scale down: never shrink the StatefulSet before the quorum has been reassigned; with the
    # quorum unreachable, the StatefulSet must stay at 5 after the new generation was handled.
    st, body = kube.request(
        "PATCH",
        KQ.format(ns=ns) + "/q1",
        {"spec": {"voters": 3}},
        content_type="application/merge-patch+json",
    )
    assert st == 200, body
    kube.wait_for(
        "generation 3 observed",
        lambda: (get(kube, KQ.format(ns=ns) + "/q1") or {}).get("status", {}).get("observedGeneration") == 3,
    )
    assert get(kube, sts_path)["spec"]["replicas"] == 5  # type: ignore[index]

    # Delete: the finalizer removes the owned objects (no garbage collector runs here).
    st, _ = kube.request("DELETE", KQ.format(ns=ns) + "/q1")
    assert st in (200, 202)
    kube.wait_for("q1 gone", lambda: kube.request("GET", KQ.format(ns=ns) + "/q1")[0] == 404, timeout=60)
    for path in (
        sts_path,
        f"/api/v1/namespaces/{ns}/services/q1",
        f"/api/v1/namespaces/{ns}/services/q1-headless",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/q1",
        cm_path,
    ):
        assert kube.request("GET", path)[0] == 404, path
    assert operator.proc.poll() is None, operator.tail()


def restrict(kube: KubeEnv, ns: str) -> None:
    """Label namespace ``ns`` so Pod Security admission enforces the `restricted` level."""
    st, body = kube.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}",
        {
            "metadata": {
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "v1.30",
                }
            }
        },
        content_type="application/merge-patch+json",
    )
    assert st == 200, body


def test_quorum_pods_are_admitted_by_restricted_pod_security(
    kube: KubeEnv, namespace: str, operator: Operator  # noqa: F811
) -> None:
    ns = namespace
    restrict(kube, ns)
    create(kube, ns, kq("ps", 3))
    sts = kube.wait_for(
        "StatefulSet ps", lambda: get(kube, f"/apis/apps/v1/namespaces/{ns}/statefulsets/ps"), timeout=60
    )
    # No controller manager runs here: create pod ps-0 (dry run) from the template, with the
    # claim volume the StatefulSet controller adds for volumeClaimTemplates.
    tpl = sts["spec"]["template"]
    spec = json.loads(json.dumps(tpl["spec"]))
    spec["volumes"].append({"name": "data", "persistentVolumeClaim": {"claimName": "data-ps-0"}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ps-0", "namespace": ns, "labels": tpl["metadata"]["labels"]},
        "spec": spec,
    }
    st, body = kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod, {"dryRun": "All"})
    assert st == 201, body
    # The image's user owns what it writes on a fresh (root-owned) volume.
    assert body["spec"]["securityContext"]["fsGroup"] == 10001
    assert body["spec"]["securityContext"]["runAsUser"] == 10001
    # The check is real: the pod without the hardening of one container is refused.
    assert "initContainers" not in spec  # one container: the node's (TLS files by sub-path mount)
    for what in ("allowPrivilegeEscalation", "capabilities"):
        weak = json.loads(json.dumps(pod))
        del weak["spec"]["containers"][0]["securityContext"][what]
        st, body = kube.request("POST", f"/api/v1/namespaces/{ns}/pods", weak, {"dryRun": "All"})
        assert st == 403, body
        assert "restricted" in body["message"] and what in body["message"], body["message"]
    assert kube.request("GET", f"/api/v1/namespaces/{ns}/pods/ps-0")[0] == 404  # dry run stored nothing
    assert operator.proc.poll() is None, operator.tail()


def test_bootstrap_flag_is_never_removed_by_a_reapply(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str
) -> None:
    """The server-side apply ownership the operator relies on: the spec reconcile re-applies the
    ConfigMap without the key under its own field manager, which must leave the flag alone."""
    q = parse_spec({"metadata": {"name": "f", "namespace": namespace, "uid": "u-1"}, "spec": {"voters": 3}})
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "anchor", "uid": "u-1"}
    plain, flagged = (bootstrap_configmap(q, owner, bootstrapped=b) for b in (False, True))
    for obj, manager in ((plain, FIELD_MANAGER), (flagged, BOOTSTRAP_FIELD_MANAGER), (plain, FIELD_MANAGER)):
        st, body = kube.apply(obj, field_manager=manager)
        assert st in (200, 201), body
    cm = get(kube, f"/api/v1/namespaces/{namespace}/configmaps/f-bootstrap")
    assert cm is not None and cm["data"] == {"bootstrapped": "true"}
    owners = {m["manager"]: m for m in cm["metadata"]["managedFields"]}
    assert "f:data" in owners[BOOTSTRAP_FIELD_MANAGER]["fieldsV1"]
    assert "f:data" not in owners[FIELD_MANAGER]["fieldsV1"]


def test_invalid_specs_are_refused_or_reported(
    kube: KubeEnv, namespace: str, operator: Operator  # noqa: F811
) -> None:
    ns = namespace
    # The schema refuses an even voter count with a message naming the field.
    st, body = kube.request("POST", KQ.format(ns=ns), kq("even", 4))
    assert st == 422 and "spec.voters" in json.dumps(body)
    # Something the CRD cannot check (free-form affinity) but the API server refuses in the
    # StatefulSet: reported in status as InvalidSpec, and no retry storm (PermanentError).
    create(kube, ns, kq("bad", 3, scheduling={"affinity": {"nodeAffinity": {"bogusField": 1}}}))

    def failed() -> dict[str, Any] | None:
        st = (get(kube, KQ.format(ns=ns) + "/bad") or {}).get("status") or {}
        return st if st.get("phase") == "Failed" else None

    st2 = kube.wait_for("status Failed", failed, timeout=60)
    cond = next(c for c in st2["conditions"] if c["type"] == "Available")
    assert cond["reason"] == "InvalidSpec" and "StatefulSet" in cond["message"]
    assert kube.request("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/bad")[0] == 404
    assert operator.proc.poll() is None, operator.tail()
    # Fixing the spec recovers.
    st, body = kube.request(
        "PATCH",
        KQ.format(ns=ns) + "/bad",
        {"spec": {"scheduling": None}},
        content_type="application/merge-patch+json",
    )
    assert st == 200, body
    kube.wait_for(
        "StatefulSet after the fix",
        lambda: get(kube, f"/apis/apps/v1/namespaces/{ns}/statefulsets/bad"),
        timeout=60,
    )


def test_status_with_a_voter_whose_uuid_is_not_known_yet_is_written(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str
) -> None:
    """During bootstrap the leader may not know a voter's storage UUID yet. The status
    the controller builds for that moment must pass the CRD's schema (it omits the UUID), and a
    status naming the voter with "" is what the schema refuses."""
    path = KQ.format(ns=namespace) + "/boot"
    create(kube, namespace, kq("boot", 3))
    known = "0b6a1c2e-5d4f-4a3b-9c8d-7e6f5a4b3c2d"
    view = QuorumView.from_describe(
        {
            "leader_id": 1,
            "leader_epoch": 2,
            "high_watermark": 5,
            "voters": [
                {"id": 1, "uuid": known, "log_end_offset": 5, "lag": 0, "last_fetch_timestamp": 1},
                {"id": 2, "uuid": "", "log_end_offset": -1, "lag": -1, "last_fetch_timestamp": -1},
                {"id": 3, "log_end_offset": -1, "lag": -1, "last_fetch_timestamp": -1},
            ],
            "observers": [],
        }
    )
    conditions = [
        Condition("Available", True, "LeaderElected", "leader 1 epoch 2"),
        Condition("Degraded", True, "VotersDown", "voters not fetching: 2:, 3:"),
        Condition("Recovering", False, "Idle"),
        Condition("QuorumLost", False, "LiveMajority", "1 of 3 voters live"),
    ]
    status = ControllerStatus(view, conditions, []).to_crd_status(generation=1)
    assert [v.get("uuid") for v in status["voters"]] == [known, None, None]
    st, body = kube.request(
        "PATCH", path + "/status", {"status": status}, content_type="application/merge-patch+json"
    )
    assert st == 200, body.get("message", body)
    back = (get(kube, path) or {}).get("status") or {}
    assert [(v["id"], v.get("uuid")) for v in back["voters"]] == [(1, known), (2, None), (3, None)]
    # The form the operator used to write (it drew a 422): refused, naming the field.
    bad = json.loads(json.dumps(status))
    bad["voters"][1]["uuid"] = ""
    st, body = kube.request(
        "PATCH", path + "/status", {"status": bad}, content_type="application/merge-patch+json"
    )
    assert st == 422 and "uuid" in json.dumps(body), body

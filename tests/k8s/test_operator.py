"""The kopf operator against a real kube-apiserver (fixtures in conftest.py): owned objects,
scaling, status, Events, invalid specs, finalizer cleanup, the quorum pods under the `restricted`
Pod Security level, the bootstrap ConfigMap and, with real node processes on loopback standing in
for the pods (no kubelet here), an automatic disk-failure recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.controller import Condition, ControllerStatus
from kraftkeeper_operator.kube import BOOTSTRAP_FIELD_MANAGER, FIELD_MANAGER
from kraftkeeper_operator.manifests import BOOTSTRAP_MOUNT, bootstrap_configmap, parse_spec
from kraftkeeper_operator.view import QuorumView

from quorum.storage.meta import load_meta
from tests.k8s.conftest import KubeEnv, free_port
from tests.operator.operator_nodes import (
    STALE_NODE_CONFIG,
    LocalCluster,
    engine_missing,
    hold,
    kk,
    make_stale_longer_log,
    run_format_container,
)

pytestmark = pytest.mark.k8s

KQ = "/apis/kraftkeeper.io/v1alpha1/namespaces/{ns}/kraftquorums"


class Operator:
    """``kraftkeeper operator run`` in a subprocess, watching one namespace."""

    def __init__(self, kube: KubeEnv, ns: str, log: Path, overrides: str = "", interval: float = 0.5) -> None:
        self.metrics_port = free_port()
        env = kube.env()
        env.update(
            KRAFTKEEPER_METRICS_PORT=str(self.metrics_port),
            KRAFTKEEPER_METRICS_HOST="127.0.0.1",
            KRAFTKEEPER_RECONCILE_INTERVAL=str(interval),
            KRAFTKEEPER_QUORUM_TIMEOUT="2",
            KRAFTKEEPER_ENDPOINT_OVERRIDES=overrides,
            KRAFTKEEPER_DEFAULT_IMAGE="kraftkeeper:test",
        )
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "quorum.cli",
                "operator",
                "run",
                "--standalone",
                "--namespace",
                ns,
                "--verbose",
            ],
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@pytest.fixture
def operator(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> Iterator[Operator]:
    op = Operator(kube, namespace, tmp_path / "operator.log")
    yield op
    op.stop()
    print("operator log:\n" + op.tail())  # shown by pytest when the test failed


# The stand-in node processes (operator_nodes.LocalCluster) serve plaintext on loopback.
PLAINTEXT = {"mode": "Disabled"}


def kq(name: str, voters: int = 3, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kraftkeeper.io/v1alpha1",
        "kind": "KRaftQuorum",
        "metadata": {"name": name},
        "spec": {"voters": voters, **spec},
    }


def create(kube: KubeEnv, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    st, body = kube.request("POST", KQ.format(ns=ns), obj)
    assert st == 201, body
    return body  # type: ignore[no-any-return]


def get(kube: KubeEnv, path: str) -> dict[str, Any] | None:
    st, body = kube.request("GET", path)
    return body if st == 200 else None  # type: ignore[no-any-return]


def test_create_update_delete(kube: KubeEnv, namespace: str, operator: Operator) -> None:
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
    assert "--ignore-formatted" in pod["initContainers"][0]["command"][-1]
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
    # The bootstrap ConfigMap: owned, mounted into the format container, and without the flag
    # while the quorum has not bootstrapped (here: unreachable).
    cm_path = f"/api/v1/namespaces/{ns}/configmaps/q1-bootstrap"
    cm = get(kube, cm_path)
    assert cm is not None and cm["metadata"]["ownerReferences"][0]["uid"] == uid
    assert "bootstrapped" not in (cm.get("data") or {})
    assert {"name": "bootstrap", "configMap": {"name": "q1-bootstrap", "defaultMode": 420}} in pod["volumes"]
    assert {"name": "bootstrap", "mountPath": BOOTSTRAP_MOUNT, "readOnly": True} in pod["initContainers"][0][
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
    kube: KubeEnv, namespace: str, operator: Operator
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
    for container, what in (("initContainers", "allowPrivilegeEscalation"), ("containers", "capabilities")):
        weak = json.loads(json.dumps(pod))
        del weak["spec"][container][0]["securityContext"][what]
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


def test_invalid_specs_are_refused_or_reported(kube: KubeEnv, namespace: str, operator: Operator) -> None:
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
    """Issue 11: during bootstrap the leader may not know a voter's storage UUID yet. The status
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
    # The form the operator used to write (issue 11's 422): refused, naming the field.
    bad = json.loads(json.dumps(status))
    bad["voters"][1]["uuid"] = ""
    st, body = kube.request(
        "PATCH", path + "/status", {"status": bad}, content_type="application/merge-patch+json"
    )
    assert st == 422 and "uuid" in json.dumps(body), body


@pytest.mark.slow
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def status_versions(kube: KubeEnv, ns: str, name: str, resource_version: str) -> list[dict[str, Any]]:
    """Every version of one KRaftQuorum's status written since ``resource_version`` (every write,
    not whatever a poll happened to see): a watch from that version replays them, and the server
    ends it after a second."""
    params = {
        "watch": "true",
        "fieldSelector": f"metadata.name={name}",
        "resourceVersion": resource_version,
        "timeoutSeconds": "1",
    }
    st, body = kube.request("GET", KQ.format(ns=ns), params=params)
    assert st == 200, body
    if isinstance(body, str):  # several events: one JSON object a line
        events = [json.loads(line) for line in body.splitlines() if line.strip()]
    else:
        events = [body] if body else []
    assert all(e.get("type") != "ERROR" for e in events), events  # 410: the versions are gone
    return [(e["object"].get("status") or {}) for e in events if e.get("type") in ("ADDED", "MODIFIED")]


def test_disk_replacement_is_recovered_without_a_human(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    # Real node processes stand in for the pods q-0..q-2; supervision only (no local recovery).
    nodes = LocalCluster(tmp_path / "nodes", 3, extra=["--no-recovery"], insecure=True)
    overrides = ",".join(f"{ns}/q/{k}={nodes.endpoint(k + 1)}" for k in range(3))
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    try:
        create(
            kube,
            ns,
            kq(
                "q",
                3,
                recovery={"stabilizationSeconds": 1},
                eventLog={"path": str(tmp_path / "ev")},
                tls=PLAINTEXT,  # the stand-in nodes serve plaintext
            ),
        )

        def status() -> dict[str, Any]:
            return (get(kube, KQ.format(ns=ns) + "/q") or {}).get("status") or {}

        first = kube.wait_for(
            "q Running with every voter's UUID",
            lambda: (
                (s := status()).get("phase") == "Running"
                and all(v.get("uuid") for v in s.get("voters") or [])
                and s
            ),
            timeout=120,
        )
        assert first["leaderId"] > 0 and len(first["voters"]) == 3
        old = next(v["uuid"] for v in first["voters"] if v["id"] == 3)

        # Every voter has its storage UUID: the operator flips the bootstrap flag, and from then
        # on the pods' format container makes a fresh volume a replacement disk.
        cm_path = f"/api/v1/namespaces/{ns}/configmaps/q-bootstrap"

        def flagged() -> dict[str, Any] | None:
            cm = get(kube, cm_path)
            return cm if cm and (cm.get("data") or {}).get("bootstrapped") == "true" else None

        cm = kube.wait_for("ConfigMap q-bootstrap flipped", flagged, timeout=60)
        x = nodes.describe()
        assert x is not None and all(v["uuid"] for v in x["voters"])
        assert cm["metadata"]["ownerReferences"][0]["kind"] == "KRaftQuorum"
        sts = get(kube, f"/apis/apps/v1/namespaces/{ns}/statefulsets/q")
        assert sts is not None
        projected = tmp_path / "projected"  # the ConfigMap volume as the kubelet would write it
        projected.mkdir()
        for k, v in cm["data"].items():
            (projected / k).write_text(v)
        out = run_format_container(sts, 2, tmp_path / "fresh-pvc", projected)
        assert out.returncode == 0, out.stderr
        assert load_meta(tmp_path / "fresh-pvc").initial_bootstrap is False

        obj = get(kube, KQ.format(ns=ns) + "/q")
        assert obj is not None
        since = obj["metadata"]["resourceVersion"]
        out = kk("cluster", "replace-disk", "--dir", str(tmp_path / "nodes"), "--node", "3")
        assert out.returncode == 0, out.stderr
        new = out.stdout.strip().splitlines()[-1]
        assert load_meta(tmp_path / "nodes" / "node-3").initial_bootstrap is False

        def done() -> dict[str, Any] | None:
            s = status()
            recs = [r for r in s.get("recoveries") or [] if r.get("result") == "Succeeded"]
            keys = {(v["id"], v.get("uuid")) for v in s.get("voters") or []}
            return s if recs and (3, new) in keys and (3, old) not in keys else None

        s = kube.wait_for("recovery Succeeded in status", done, timeout=180)
        # Every status ever written with the Succeeded record shows the new voter set, also the
        # one written right after RemoveVoter committed (issue 11: it showed the old voter).
        written = [
            v
            for v in status_versions(kube, ns, "q", since)
            if any(r.get("result") == "Succeeded" for r in v.get("recoveries") or [])
        ]
        assert written, "the watch saw no status with the Succeeded record"
        for v in written:
            keys = {(x["id"], x.get("uuid")) for x in v.get("voters") or []}
            assert (3, new) in keys and (3, old) not in keys, v
        rec = next(r for r in s["recoveries"] if r["result"] == "Succeeded")
        assert rec["oldUuid"] == old and rec["newUuid"] == new and rec["replicaId"] == 3
        assert {"catchUp", "addVoter", "removeVoter"} <= set(rec["phaseSeconds"])
        evs = kube.wait_for(
            "RecoveryCompleted Event",
            lambda: [
                e
                for e in (get(kube, f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
                if e.get("reason") == "RecoveryCompleted"
            ],
            timeout=30,
        )
        assert evs
        lines = [
            json.loads(x)
            for f in sorted((tmp_path / "ev").rglob("*.jsonl"))
            for x in f.read_text().splitlines()
        ]
        assert [e["type"] for e in lines if e["recovery_id"] == rec["recoveryId"]][-1] == "recovery_completed"
        assert all(e["cluster"] == f"{ns}/q" for e in lines)

        # An operator restart resumes from status and the quorum: nothing is redone or forgotten.
        op.stop()
        op = Operator(kube, ns, tmp_path / "operator2.log", overrides)

        def passed_once() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5) as r:
                    return f'kraftkeeper_operator_voters{{quorum="{ns}/q"}} 3.0' in r.read().decode()
            except OSError:  # not listening yet
                return False

        kube.wait_for("a recovery pass of the restarted operator", passed_once, timeout=60)
        # The restart re-applied the ConfigMap (resume): the flag is still set, owned by its manager.
        cm = get(kube, cm_path)
        assert cm is not None and cm["data"] == {"bootstrapped": "true"}
        owners = {m["manager"]: m for m in cm["metadata"]["managedFields"]}
        assert "f:data" not in owners["kraftkeeper-operator"]["fieldsV1"]
        after = status()
        assert [r["recoveryId"] for r in after["recoveries"]] == [r["recoveryId"] for r in s["recoveries"]]
        lines2 = [
            json.loads(x)
            for f in sorted((tmp_path / "ev").rglob("*.jsonl"))
            for x in f.read_text().splitlines()
        ]
        assert len(lines2) == len(lines)  # no step logged again
    finally:
        op.stop()
        nodes.stop()


@pytest.mark.slow
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_scale_down_reassigns_before_shrinking(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    nodes = LocalCluster(tmp_path / "nodes", 3, extra=["--no-recovery"], insecure=True)
    overrides = ",".join(f"{ns}/s/{k}={nodes.endpoint(k + 1)}" for k in range(3))
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    sts_path = f"/apis/apps/v1/namespaces/{ns}/statefulsets/s"
    try:
        create(kube, ns, kq("s", 3, tls=PLAINTEXT))

        def status() -> dict[str, Any]:
            return (get(kube, KQ.format(ns=ns) + "/s") or {}).get("status") or {}

        kube.wait_for("s Running", lambda: status().get("phase") == "Running", timeout=120)
        st, body = kube.request(
            "PATCH",
            KQ.format(ns=ns) + "/s",
            {"spec": {"voters": 1}},
            content_type="application/merge-patch+json",
        )
        assert st == 200, body

        def shrunk() -> dict[str, Any] | None:
            sts = get(kube, sts_path) or {}
            return sts if sts.get("spec", {}).get("replicas") == 1 else None

        try:
            kube.wait_for("StatefulSet at 1 replica", shrunk, timeout=180)
        except AssertionError as e:
            raise AssertionError(f"{e}; status {status()}; quorum {nodes.describe()}") from None
        # The shrink happened only after the quorum itself had one voter left (reassignment first).
        x = nodes.describe()
        assert x is not None and [v["id"] for v in x["voters"]] == [1]
        pdb = get(kube, f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/s")
        assert pdb is not None and pdb["spec"]["maxUnavailable"] == 0
    finally:
        op.stop()
        nodes.stop()


def _pod_from_template(sts: dict[str, Any], ns: str, ordinal: int) -> dict[str, Any]:
    """Pod ``NAME-ordinal`` as the StatefulSet controller (not running here) would create it."""
    tpl = sts["spec"]["template"]
    name = f"{sts['metadata']['name']}-{ordinal}"
    spec = json.loads(json.dumps(tpl["spec"]))
    spec["volumes"].append({"name": "data", "persistentVolumeClaim": {"claimName": f"data-{name}"}})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": tpl["metadata"]["labels"]},
        "spec": spec,
    }


def _events_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for f in sorted(path.rglob("*.jsonl")) for x in f.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_unclean_recovery_only_when_allowed_and_only_once(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> None:
    """Two of three voters go away for good. While the resource does not allow unclean recovery,
    the operator only reports QuorumLost, however long it lasts; once allowed (afterSeconds 30,
    the CRD's minimum), it names the survivor in the bootstrap ConfigMap and deletes its pod; the
    pod's real init container (run here in the kubelet's place) makes it the sole voter, exactly
    once, and it serves the keys it had."""
    ns, name = namespace, "u"
    q = parse_spec({"metadata": {"name": name, "namespace": ns}, "spec": {"voters": 3}})
    nodes = LocalCluster(
        tmp_path / "nodes", 3, extra=["--no-recovery"], insecure=True, cluster_id=q.cluster_id
    )
    overrides = ",".join(f"{ns}/{name}/{k}={nodes.endpoint(k + 1)}" for k in range(3))
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    holds: list[Path] = []
    kq_path = KQ.format(ns=ns) + f"/{name}"
    cm_path = f"/api/v1/namespaces/{ns}/configmaps/{name}-bootstrap"
    pod_path = f"/api/v1/namespaces/{ns}/pods/{name}-1"
    ev_dir = tmp_path / "ev"

    def status() -> dict[str, Any]:
        return (get(kube, kq_path) or {}).get("status") or {}

    def cond(s: dict[str, Any], type_: str) -> dict[str, Any]:
        return next(c for c in s.get("conditions") or [] if c["type"] == type_)

    def lost_seconds() -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return -1.0
        prefix = f'kraftkeeper_operator_quorum_lost_seconds{{quorum="{ns}/{name}"}} '
        return next((float(x[len(prefix) :]) for x in text.splitlines() if x.startswith(prefix)), -1.0)

    try:
        # uncleanRecovery: default off
        create(kube, ns, kq(name, 3, eventLog={"path": str(ev_dir)}, tls=PLAINTEXT))
        first = kube.wait_for(
            "u Running with 3 known voters",
            lambda: (
                (s := status()).get("phase") == "Running"
                and len(s["voters"]) == 3
                and all(v.get("uuid") for v in s["voters"])
                and s
            ),
            timeout=120,
        )
        voters = {(v["id"], v["uuid"]) for v in first["voters"]}
        uuid2 = next(u for i, u in voters if i == 2)
        assert kk("kv", "put", "--bootstrap", nodes.bootstrap(), "k1", "v1").returncode == 0
        kube.wait_for(
            "k1 on every voter",
            lambda: (
                (x := nodes.describe())
                and all(v["log_end_offset"] >= x["high_watermark"] for v in x["voters"])
            ),
            timeout=30,
        )
        sts = get(kube, f"/apis/apps/v1/namespaces/{ns}/statefulsets/{name}")
        assert sts is not None
        st, pod = kube.request("POST", f"/api/v1/namespaces/{ns}/pods", _pod_from_template(sts, ns, 1))
        assert st == 201, pod

        # Replicas 1 and 3 are gone for good.
        for n in (1, 3):
            holds.append(hold(nodes.dir, n))
        for n in (1, 3):
            kube.wait_for(
                f"node {n} stopped", lambda n=n: (nodes.dir / "control" / f"node-{n}.stopped").exists()
            )
        kube.wait_for("QuorumLost", lambda: status().get("phase") == "QuorumLost", timeout=60)
        # Not allowed: the operator has measured an outage longer than afterSeconds would be and
        # still only reports it.
        kube.wait_for(
            "an outage of 31 s, as the operator measures it", lambda: lost_seconds() >= 31, timeout=90
        )
        s = status()
        assert (
            cond(s, "QuorumLost")["status"] == "True" and cond(s, "QuorumLost")["reason"] == "NoLiveMajority"
        )
        assert not [r for r in s.get("recoveries") or [] if r["recoveryId"].startswith("unclean-")]
        assert {(v["id"], v["uuid"]) for v in s["voters"]} == voters  # kept while no leader answers
        cm = get(kube, cm_path)
        assert cm is not None and "unclean-recovery" not in (cm.get("data") or {})
        alive = get(kube, pod_path)
        assert alive is not None and alive["metadata"]["uid"] == pod["metadata"]["uid"]
        assert not ev_dir.exists() or not [e for e in _events_of(ev_dir) if e["type"].startswith("unclean")]

        # Allowed now; the outage is already older than afterSeconds.
        st, body = kube.request(
            "PATCH",
            kq_path,
            {"spec": {"uncleanRecovery": {"enabled": True, "afterSeconds": 30}}},
            content_type="application/merge-patch+json",
        )
        assert st == 200, body
        cm = kube.wait_for(
            "the unclean-recovery request in the ConfigMap",
            lambda: (c := get(kube, cm_path)) and "unclean-recovery" in (c.get("data") or {}) and c,
            timeout=60,
        )
        rid, token, *uuids = cm["data"]["unclean-recovery"].split()
        assert rid == "2" and uuids == [uuid2]  # the only reachable former voter
        detail = json.loads(cm["data"]["unclean-recovery.json"])
        assert detail["token"] == token and detail["ordinal"] == 1 and list(detail["candidates"]) == ["2"]
        owners = {m["manager"]: m for m in cm["metadata"]["managedFields"]}
        assert "f:unclean-recovery" in json.dumps(owners["kraftkeeper-operator-unclean"]["fieldsV1"])
        assert cm["data"].get("bootstrapped") == "true"  # the other manager's key is untouched
        kube.wait_for(
            "pod u-1 deleted (restarted)", lambda: kube.request("GET", pod_path)[0] == 404, timeout=30
        )
        s = kube.wait_for(
            "status names the request",
            lambda: (
                (x := status())
                and cond(x, "QuorumLost")["reason"] == "UncleanRecoveryRequested"
                and any(r["recoveryId"] == f"unclean-{token}" for r in x.get("recoveries") or [])
                and x
            ),
            timeout=30,
        )
        assert token in cond(s, "QuorumLost")["message"]
        rec = next(r for r in s["recoveries"] if r["recoveryId"] == f"unclean-{token}")
        assert rec["result"] == "InProgress" and rec["replicaId"] == 2 and "lost" in rec["reason"]
        warn = kube.wait_for(
            "an UncleanRecovery Warning Event",
            lambda: [
                e
                for e in (get(kube, f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
                if e.get("reason") == "UncleanRecovery"
            ],
            timeout=30,
        )
        assert warn[0]["type"] == "Warning" and token in warn[0]["message"]
        evs = [e for e in _events_of(ev_dir) if e["type"] == "unclean_recovery"]
        assert len(evs) == 1 and evs[0]["replica_id"] == 2 and evs[0]["recovery_id"] == token

        # The kubelet's part: pod u-1 starts again. Its real init container runs recover-unclean on
        # replica 2's (stopped) directory, then the node starts.
        holds.append(hold(nodes.dir, 2))
        kube.wait_for("node 2 stopped", lambda: (nodes.dir / "control" / "node-2.stopped").exists())
        projected = tmp_path / "projected"
        projected.mkdir()
        for k, v in cm["data"].items():
            (projected / k).write_text(v)
        out = run_format_container(sts, 1, nodes.dir / "node-2", projected)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"UNCLEAN RECOVERY {token}" in out.stdout
        holds.pop().unlink()

        def sole_voter() -> dict[str, Any] | None:
            x = nodes.describe()
            if not x or x["leader_recovery_state"] != "RECOVERED":
                return None
            return x if [(v["id"], v["uuid"]) for v in x["voters"]] == [(2, uuid2)] else None

        kube.wait_for("replica 2 sole voter, RECOVERED", sole_voter, timeout=120)
        got = kk("kv", "get", "--bootstrap", nodes.bootstrap(), "k1")
        assert got.returncode == 0 and got.stdout.strip() == "v1", got.stderr
        assert kk("kv", "put", "--bootstrap", nodes.bootstrap(), "k2", "v2").returncode == 0

        s = kube.wait_for(
            "the unclean recovery Succeeded in status",
            lambda: (
                (x := status())
                and any(
                    r["recoveryId"] == f"unclean-{token}" and r["result"] == "Succeeded"
                    for r in x.get("recoveries") or []
                )
                and x
            ),
            timeout=60,
        )
        assert s["phase"] != "QuorumLost" and s["leaderId"] == 2
        kube.wait_for(
            "unclean_recovery_completed in the event log",
            lambda: [e for e in _events_of(ev_dir) if e["type"] == "unclean_recovery_completed"],
            timeout=30,
        )
        # Another restart of the pod: the marker on its volume stops a second recovery.
        holds.append(hold(nodes.dir, 2))
        kube.wait_for("node 2 stopped again", lambda: (nodes.dir / "control" / "node-2.stopped").exists())
        again = run_format_container(sts, 1, nodes.dir / "node-2", projected)
        assert again.returncode == 0 and "was done on this volume already" in again.stdout, again.stderr
        holds.pop().unlink()
        kube.wait_for(
            "replica 2 leads again", lambda: (x := nodes.describe()) and x["leader_id"] == 2, timeout=90
        )
        cm = get(kube, cm_path)
        assert cm is not None and cm["data"]["unclean-recovery"].split()[1] == token  # never a new token
        assert len([e for e in _events_of(ev_dir) if e["type"] == "unclean_recovery"]) == 1
    finally:
        for f in holds:
            f.unlink(missing_ok=True)
        for n in (1, 3):
            (nodes.dir / "control" / f"node-{n}.hold").unlink(missing_ok=True)
        op.stop()
        nodes.stop()


@pytest.mark.slow
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_unclean_survivor_is_the_newer_epoch_not_the_longer_stale_log(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> None:
    """Issue 12, Kubernetes mode (local processes stand in for the pods): five voters; of the two
    replicas left, the longer log is a cut-off former leader's stale tail and the shorter one holds
    a write committed at a newer epoch. Once unclean recovery is allowed, the operator names the
    newer-epoch replica in the request, as a Raft election would."""
    ns, name = namespace, "st"
    q = parse_spec({"metadata": {"name": name, "namespace": ns}, "spec": {"voters": 5}})
    cfg = tmp_path / "node.json"
    cfg.write_text(json.dumps(STALE_NODE_CONFIG))
    nodes = LocalCluster(
        tmp_path / "nodes",
        5,
        extra=["--no-recovery", "--node-config", str(cfg)],
        cluster_id=q.cluster_id,
        insecure=True,
    )
    overrides = ",".join(f"{ns}/{name}/{k}={nodes.endpoint(k + 1)}" for k in range(5))
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    holds: list[Path] = []
    kq_path = KQ.format(ns=ns) + f"/{name}"
    cm_path = f"/api/v1/namespaces/{ns}/configmaps/{name}-bootstrap"
    try:
        create(kube, ns, kq(name, 5, tls=PLAINTEXT))  # uncleanRecovery: off while the case is built
        kube.wait_for(
            "5 known voters in status",
            lambda: (
                (s := (get(kube, kq_path) or {}).get("status") or {}).get("phase") == "Running"
                and len(s["voters"]) == 5
                and all(v.get("uuid") for v in s["voters"])
            ),
            timeout=120,
        )
        stale, fresh = make_stale_longer_log(nodes, holds)
        kube.wait_for(
            "QuorumLost",
            lambda: ((get(kube, kq_path) or {}).get("status") or {}).get("phase") == "QuorumLost",
        )
        st, body = kube.request(
            "PATCH",
            kq_path,
            {"spec": {"uncleanRecovery": {"enabled": True, "afterSeconds": 30}}},
            content_type="application/merge-patch+json",
        )
        assert st == 200, body
        cm = kube.wait_for(
            "the unclean-recovery request in the ConfigMap",
            lambda: (c := get(kube, cm_path)) and "unclean-recovery" in (c.get("data") or {}) and c,
            timeout=90,
        )
        rid, _token, *_uuids = cm["data"]["unclean-recovery"].split()
        detail = json.loads(cm["data"]["unclean-recovery.json"])
        assert int(rid) == fresh and detail["replica_id"] == fresh, (detail, stale, fresh)
        cands = detail["candidates"]
        assert sorted(cands) == sorted([str(stale), str(fresh)])
        assert cands[str(stale)][1] > cands[str(fresh)][1]  # the longer log lost ...
        assert cands[str(stale)][0] < cands[str(fresh)][0]  # ... because its last epoch is older
        assert detail["last_epoch"] == cands[str(fresh)][0]
    finally:
        for f in holds:
            f.unlink(missing_ok=True)
        op.stop()
        nodes.stop()

"""The kopf operator against a real kube-apiserver (fixtures in conftest.py), with real node
processes on loopback standing in for the pods (no kubelet here): the automatic disk-replacement
recovery (status, Events, event log, the bootstrap flag, an operator restart resuming without
redoing anything) and a scale-down that reassigns the quorum before it shrinks the StatefulSet."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from quorum.storage.meta import load_meta
from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import (
    KQ,
    PLAINTEXT,
    Operator,
    create,
    get,
    kq,
    kq_status,
    overrides_for,
    wait_known_voters,
)
from tests.operator.operator_nodes import LocalCluster, engine_missing, kk, run_format_container

pytestmark = pytest.mark.k8s


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


# (These two marks sat on status_versions above, where they did nothing, until the split of
# test_operator.py showed it.)
@pytest.mark.slow
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_disk_replacement_is_recovered_without_a_human(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    # Real node processes stand in for the pods q-0..q-2; supervision only (no local recovery).
    nodes = LocalCluster(tmp_path / "nodes", 3, extra=["--no-recovery"], insecure=True)
    overrides = overrides_for(nodes, ns, "q")
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
            return kq_status(kube, ns, "q")

        first = wait_known_voters(kube, ns, "q", 3)
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
        # one written right after RemoveVoter committed (it showed the old voter).
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
    overrides = overrides_for(nodes, ns, "s")
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    sts_path = f"/apis/apps/v1/namespaces/{ns}/statefulsets/s"
    try:
        create(kube, ns, kq("s", 3, tls=PLAINTEXT))

        def status() -> dict[str, Any]:
            return kq_status(kube, ns, "s")

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

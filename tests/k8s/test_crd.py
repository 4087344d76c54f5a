"""The KRaftQuorum CRD against a real kube-apiserver: valid objects are accepted and defaulted,
invalid ones are refused with a message naming the field, and a refused write loses nothing.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from tests.k8s.conftest import KubeEnv

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.k8s

API = "/apis/kraftkeeper.io/v1alpha1"


def quorum(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def create(kube: KubeEnv, obj: dict[str, Any]) -> tuple[int, Any]:
    ns = obj["metadata"]["namespace"]
    return kube.request("POST", f"{API}/namespaces/{ns}/kraftquorums", obj, {"fieldValidation": "Strict"})


def test_valid_quorum_is_accepted_and_defaulted(kube: KubeEnv, kraftquorum_crd: Any, namespace: str) -> None:
    status, obj = create(kube, quorum("q1", namespace, voters=5, storage={"size": "2Gi"}))
    assert status == 201, obj
    spec = obj["spec"]
    assert spec["voters"] == 5
    assert spec["storage"]["size"] == "2Gi"
    # Defaults come from the schema, so every reader sees the same values the operator uses.
    assert spec["recovery"] == {"enabled": True, "order": "AddThenRemove", "stabilizationSeconds": 10,
                                "maxLagRecords": 100, "timeoutSeconds": 600}
    assert spec["uncleanRecovery"] == {"enabled": False, "afterSeconds": 300}
    assert spec["imagePullPolicy"] == "IfNotPresent"
    assert spec["ports"]["client"] == 9093
    assert spec["eventLog"]["path"] == "stdout"


def test_empty_spec_gets_three_voters(kube: KubeEnv, kraftquorum_crd: Any, namespace: str) -> None:
    status, obj = create(kube, quorum("q0", namespace))
    assert status == 201, obj
    assert obj["spec"]["voters"] == 3
    assert obj["spec"]["storage"]["size"] == "1Gi"


def test_full_spec_is_accepted(kube: KubeEnv, kraftquorum_crd: Any, namespace: str) -> None:
    spec = {
        "voters": 3, "image": "kraftkeeper:0.1.0", "imagePullPolicy": "Never",
        "storage": {"size": "512Mi", "storageClassName": "fast"},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": 1073741824}},
        "ports": {"client": 9093, "metrics": 9093},
        "scheduling": {
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "kraft",
                             "effect": "NoSchedule"}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                           "whenUnsatisfiable": "ScheduleAnyway",
                                           "labelSelector": {"matchLabels": {"app": "x"}}}],
            "priorityClassName": "high",
        },
        "recovery": {"enabled": True, "order": "RemoveThenAdd", "stabilizationSeconds": 30,
                     "maxLagRecords": 0, "timeoutSeconds": 900},
        "uncleanRecovery": {"enabled": True, "afterSeconds": 60},
        "eventLog": {"path": "/data/events/q.jsonl"},
    }
    status, obj = create(kube, quorum("full", namespace, **spec))
    assert status == 201, obj
    assert obj["spec"]["recovery"]["order"] == "RemoveThenAdd"
    assert obj["spec"]["scheduling"]["topologySpreadConstraints"][0]["labelSelector"] == {
        "matchLabels": {"app": "x"}}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"voters": 4}, "spec.voters must be odd"),
        ({"voters": 11}, "spec.voters"),
        ({"voters": 0}, "spec.voters"),
        ({"voters": "three"}, "spec.voters"),
        ({"storage": {"size": "-1Gi"}}, "spec.storage.size"),
        ({"storage": {"size": "0"}}, "spec.storage.size"),
        ({"storage": {"size": "ten gigs"}}, "spec.storage.size"),
        ({"recovery": {"order": "Sideways"}}, "spec.recovery.order"),
        ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
        ({"recovery": {"stabilizationSeconds": -1}}, "spec.recovery.stabilizationSeconds"),
        ({"recovery": {"stabilizationSeconds": 60, "timeoutSeconds": 30}},
         "spec.recovery.timeoutSeconds must be greater than spec.recovery.stabilizationSeconds"),
        ({"ports": {"client": 80}}, "spec.ports.client"),
        ({"eventLog": {"path": "relative/events.jsonl"}}, "spec.eventLog.path"),
        ({"uncleanRecovery": {"afterSeconds": 1}}, "spec.uncleanRecovery.afterSeconds"),
        ({"scheduling": {"tolerations": [{"operator": "Maybe"}]}}, "operator"),
        ({"foo": 1}, 'unknown field "spec.foo"'),
        ({"recovery": {"enable": True}}, 'unknown field "spec.recovery.enable"'),
    ],
    ids=["even-voters", "too-many-voters", "zero-voters", "voters-not-int", "negative-storage",
         "zero-storage", "garbage-storage", "bad-order-enum", "bad-pull-policy", "negative-stabilization",
         "timeout-below-stabilization", "privileged-port", "relative-event-log", "unclean-too-soon",
         "bad-toleration-operator", "unknown-field", "misspelt-nested-field"],
)
def test_invalid_quorum_is_rejected_with_a_clear_message(
    kube: KubeEnv, kraftquorum_crd: Any, namespace: str, spec: dict[str, Any], expected: str
) -> None:
    status, body = create(kube, quorum("bad", namespace, **spec))
    assert status in (400, 422), f"expected a rejection, got {status}: {body}"
    assert expected in body["message"], body["message"]
    # Nothing was stored.
    assert kube.request("GET", f"{API}/namespaces/{namespace}/kraftquorums/bad")[0] == 404


def test_rejected_update_loses_nothing(kube: KubeEnv, kraftquorum_crd: Any, namespace: str) -> None:
    status, obj = create(kube, quorum("keep", namespace, voters=3))
    assert status == 201, obj
    path = f"{API}/namespaces/{namespace}/kraftquorums/keep"
    bad = copy.deepcopy(obj)
    bad["spec"]["voters"] = 2
    status, body = kube.request("PUT", path, bad, {"fieldValidation": "Strict"})
    assert status == 422, body
    assert "spec.voters must be odd" in body["message"]
    status, now = kube.request("GET", path)
    assert status == 200
    assert now["spec"] == obj["spec"]
    assert now["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]


def test_storage_is_immutable(kube: KubeEnv, kraftquorum_crd: Any, namespace: str) -> None:
    status, obj = create(kube, quorum("imm", namespace, storage={"size": "1Gi"}))
    assert status == 201, obj
    path = f"{API}/namespaces/{namespace}/kraftquorums/imm"
    for patch, expected in (
        ({"spec": {"storage": {"size": "2Gi"}}}, "spec.storage.size cannot change after creation"),
        ({"spec": {"storage": {"storageClassName": "fast"}}},
         "spec.storage.storageClassName cannot change after creation"),
    ):
        status, body = kube.request("PATCH", path, patch, content_type="application/merge-patch+json")
        assert status == 422, body
        assert expected in body["message"], body["message"]
    # Other fields still change freely.
    status, body = kube.request("PATCH", path, {"spec": {"voters": 5}},
                                content_type="application/merge-patch+json")
    assert status == 200, body
    assert body["spec"]["storage"] == {"size": "1Gi"}


def test_status_subresource_and_printer_columns(kube: KubeEnv, kraftquorum_crd: Any, namespace: str) -> None:
    status, obj = create(kube, quorum("st", namespace))
    assert status == 201, obj
    path = f"{API}/namespaces/{namespace}/kraftquorums/st"
    uuid1 = "0b6d7f1e-8c1a-4c1e-9d6c-6f1f1d2a3b4c"
    new_status = {
        "phase": "Running", "leaderId": 1, "leaderEpoch": 7, "highWatermark": 1234, "observedGeneration": 1,
        "voters": [{"id": 1, "uuid": uuid1, "lag": 0, "logEndOffset": 1234, "endpoint": "st-0.st:9093"}],
        "observers": [],
        "conditions": [{"type": "Available", "status": "True", "reason": "LeaderKnown", "message": "ok",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
        "recoveries": [{"recoveryId": "r1", "replicaId": 3, "oldUuid": uuid1, "newUuid": None,
                        "startedAt": "2026-01-01T00:00:00Z", "completedAt": None,
                        "phaseSeconds": {"detect": 0.5, "catchUp": 2.25}, "result": "InProgress"}],
    }
    status, body = kube.request("PATCH", path + "/status", {"status": new_status},
                                content_type="application/merge-patch+json")
    assert status == 200, body
    assert body["status"]["leaderEpoch"] == 7
    # A spec write through the main resource does not touch status (the subresource owns it).
    body["spec"]["voters"] = 5
    body["status"]["phase"] = "Failed"
    status, after = kube.request("PUT", path, body)
    assert status == 200, after
    assert after["spec"]["voters"] == 5
    assert after["status"]["phase"] == "Running"
    # Status is validated as strictly as spec.
    status, err = kube.request("PATCH", path + "/status", {"status": {"phase": "Exploded"}},
                               content_type="application/merge-patch+json")
    assert status == 422 and "phase: Unsupported value: \"Exploded\"" in err["message"], err
    status, err = kube.request("PATCH", path + "/status",
                               {"status": {"voters": [{"id": 1, "uuid": "not-a-uuid"}]}},
                               content_type="application/merge-patch+json")
    assert status == 422 and "uuid" in err["message"], err
    # Printer columns, as `kubectl get kq` shows them.
    status, table = kube.request("GET", path, accept="application/json;as=Table;g=meta.k8s.io;v=v1")
    assert status == 200, table
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Voters", "Leader", "Epoch", "Phase", "Age"]
    assert table["rows"][0]["cells"][:5] == ["st", 5, 1, 7, "Running"]


def test_discovery_short_name_and_kubectl(kube: KubeEnv, kraftquorum_crd: Any, namespace: str,
                                          kubectl: Path) -> None:
    status, group = kube.request("GET", API)
    assert status == 200
    res = {r["name"]: r for r in group["resources"]}
    assert res["kraftquorums"]["shortNames"] == ["kq"]
    assert res["kraftquorums"]["namespaced"] is True
    assert "kraftquorums/status" in res
    sample = yaml.safe_load((REPO / "e2e" / "sample.yaml").read_text())
    sample["metadata"]["namespace"] = namespace
    # kubectl validates strictly against the CRD's published schema (server side).
    proc = subprocess.run([str(kubectl), "apply", "-f", "-"], input=yaml.safe_dump(sample), text=True,
                          capture_output=True, env=kube.env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([str(kubectl), "get", "kq", "-n", namespace, "-o", "name"], text=True,
                          capture_output=True, env=kube.env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"kraftquorum.kraftkeeper.io/{sample['metadata']['name']}"
    # The schema's documentation is what `kubectl explain` shows users (the order trade-off).
    proc = subprocess.run([str(kubectl), "explain", "kraftquorum.spec.recovery"], text=True,
                          capture_output=True, env=kube.env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "AddThenRemove" in proc.stdout and "RemoveThenAdd" in proc.stdout
    assert "stabilizationSeconds" in proc.stdout
    bad = copy.deepcopy(sample)
    bad["metadata"]["name"] = "bad"
    bad["spec"]["voters"] = 2
    proc = subprocess.run([str(kubectl), "apply", "-f", "-"], input=yaml.safe_dump(bad), text=True,
                          capture_output=True, env=kube.env(), timeout=60)
    assert proc.returncode != 0
    assert "spec.voters must be odd" in proc.stderr

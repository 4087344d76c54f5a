"""Spare node certificates against a real kube-apiserver (no kubelet: real node processes on
loopback stand in for the pods, with the certificates of the operator's Secret, and the tests
write the pods' status and replace their claims as the StatefulSet controller and the kubelet
would). Once the quorum bootstrapped every replica has a spare naming a fresh storage UUID, issued
after its claim and its node container. A replaced disk (a new claim) formatted with its spare is
taken at its first start: the spare becomes its certificate, a new spare is issued, the recovery
completes, and no pod is restarted for a certificate (no ``CertificateForNewDisk``). An empty disk
presenting the spare on the *same* claim is refused (a Warning Event, a new spare, no recovery),
and a node container restarted on its own volume gets its spare replaced (it read it at start)."""

from __future__ import annotations

import base64
import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kraftkeeper_operator.k8s.manifests import parse_spec
from kraftkeeper_operator.k8s.spares import Spare

from quorum.security.pki import CertificateAuthority, identity_from_cert, issue_node, load_ca
from tests.engine.cluster import LocalCluster
from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import KQ, Operator, create, create_quorum_claim, create_quorum_pod, get, kq

pytestmark = pytest.mark.k8s

NAME = "sp"


def _secret(kube: KubeEnv, ns: str) -> dict[str, bytes]:
    s = get(kube, f"/api/v1/namespaces/{ns}/secrets/{NAME}-tls") or {}
    return {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}


def _disk(pem: bytes) -> str | None:
    return identity_from_cert(x509.load_pem_x509_certificate(pem)).storage_uuid


def _spares(kube: KubeEnv, ns: str) -> dict[int, Spare] | None:
    d = _secret(kube, ns)
    out = {i: Spare.decode(d.get(f"spare-{i}.state")) for i in (1, 2, 3)}
    if not all(out.values()) or not all(f"spare-{i}.crt" in d for i in (1, 2, 3)):
        return None
    return {i: s for i, s in out.items() if s is not None}


class PodNodes(LocalCluster):
    """Nodes started as the pods' node container starts them, from a directory per pod holding
    what its ``tls`` volume would (``node.crt``, ``node.key``, ``ca.crt``, the spare)."""

    def __init__(self, root: Path, cluster_id: str) -> None:
        super().__init__(root, 3, cluster_id=cluster_id)
        self.ca: CertificateAuthority | None = None  # the quorum's, from Secret NAME-ca (use_ca)

    def use_ca(self, secret: dict[str, bytes]) -> None:
        d = self.root / "ca"
        d.mkdir(exist_ok=True)
        (d / "ca.crt").write_bytes(secret["ca.crt"])
        (d / "ca.key").write_bytes(secret["ca.key"])
        self.ca = load_ca(d)

    def tls(self, i: int) -> Path:
        return self.root / f"tls-{i}"

    def mount(self, i: int, secret: dict[str, bytes]) -> None:
        """The pod's directory from Secret ``NAME-tls``. The certificates are issued again by the
        quorum's CA for the same (replica, storage UUID) and for 127.0.0.1 (the operator reaches
        these stand-ins at loopback addresses, which the pods' certificates do not name)."""
        assert self.ca is not None
        d = self.tls(i)
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        (d / "ca.crt").write_bytes(secret["ca.crt"])
        for name in ("node", "spare"):
            if f"{name}-{i}.crt" in secret:
                crt, key = issue_node(self.ca, i, storage_uuid=_disk(secret[f"{name}-{i}.crt"]))
                (d / f"{name}.crt").write_bytes(crt.read_bytes())
                (d / f"{name}.key").write_bytes(key.read_bytes())

    def format_from(self, i: int, cert: str, replacement: bool) -> str:
        return self.format(i, replacement=replacement, uuid_from_cert=self.tls(i) / cert)

    def start_args(self, i: int) -> list[str]:
        d = self.tls(i)
        spare = ["--spare-cert", str(d / "spare.crt"), "--spare-key", str(d / "spare.key")]
        return [
            "--cert",
            str(d / "node.crt"),
            "--key",
            str(d / "node.key"),
            "--ca",
            str(d / "ca.crt"),
            *(spare if (d / "spare.crt").exists() else []),
        ]


def _run_pod(kube: KubeEnv, ns: str, ordinal: int, container: str) -> str:
    """Create pod NAME-ordinal (if missing) and write its status: node container ``container``
    running, Ready. Returns the pod's uid."""
    pod = get(kube, f"/api/v1/namespaces/{ns}/pods/{NAME}-{ordinal}") or create_quorum_pod(
        kube, ns, NAME, ordinal, ["node"]
    )
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    node = {
        "name": "node",
        "image": "kraftkeeper:test",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "containerID": f"containerd://{container}",
        "state": {"running": {"startedAt": now}},
    }
    status = {
        "status": {
            "phase": "Running",
            "containerStatuses": [node],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    st, body = kube.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{NAME}-{ordinal}/status",
        status,
        content_type="application/merge-patch+json",
    )
    assert st == 200, body
    return str(pod["metadata"]["uid"])


def _claim_uid(kube: KubeEnv, ns: str, ordinal: int) -> str:
    return str(
        (get(kube, f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data-{NAME}-{ordinal}") or {})[
            "metadata"
        ]["uid"]
    )


def _replace_claim_and_pod(kube: KubeEnv, ns: str, ordinal: int) -> None:
    """What `kubectl delete pvc,pod` and the StatefulSet controller do: a new claim (a new uid)."""
    pod = get(kube, f"/api/v1/namespaces/{ns}/pods/{NAME}-{ordinal}") or {}
    labels = pod["metadata"]["labels"]
    claim = f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data-{NAME}-{ordinal}"
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{NAME}-{ordinal}?gracePeriodSeconds=0")
    kube.request("DELETE", claim)
    # No controller-manager removes the claim's protection finalizer here.
    kube.request(
        "PATCH", claim, {"metadata": {"finalizers": None}}, content_type="application/merge-patch+json"
    )
    kube.wait_for("the old claim gone", lambda: get(kube, claim) is None, timeout=30)
    kube.wait_for(
        "the old pod gone",
        lambda: get(kube, f"/api/v1/namespaces/{ns}/pods/{NAME}-{ordinal}") is None,
        timeout=30,
    )
    create_quorum_claim(kube, ns, NAME, ordinal, labels)


def _events(kube: KubeEnv, ns: str, reason: str) -> list[dict[str, Any]]:
    items = (get(kube, f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
    return [e for e in items if e.get("reason") == reason]


def _status(kube: KubeEnv, ns: str) -> dict[str, Any]:
    return (get(kube, KQ.format(ns=ns) + f"/{NAME}") or {}).get("status") or {}


def test_a_replaced_disk_starts_once_with_its_spare(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    q = parse_spec({"metadata": {"name": NAME, "namespace": ns}, "spec": {"voters": 3}})
    nodes = PodNodes(tmp_path, q.cluster_id)
    overrides = ",".join(f"{ns}/{NAME}/{k}={nodes.endpoint(k + 1)}" for k in range(3))
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    try:
        create(kube, ns, kq(NAME, 3))
        first = kube.wait_for(
            "Secret sp-tls", lambda: (d := _secret(kube, ns)) and "node-3.crt" in d and d, timeout=60
        )
        ca = get(kube, f"/api/v1/namespaces/{ns}/secrets/{NAME}-ca") or {}
        nodes.use_ca({k: base64.b64decode(v) for k, v in (ca.get("data") or {}).items()})
        for i in (1, 2, 3):  # before the bootstrap: formatted with the UUID their certificate names
            nodes.mount(i, first)
            assert nodes.format_from(i, "node.crt", replacement=False) == _disk(first[f"node-{i}.crt"])
            nodes.start(i)
        for k in range(3):
            _run_pod(kube, ns, k, f"c{k}-a")
            labels = get(kube, f"/api/v1/namespaces/{ns}/pods/{NAME}-{k}")["metadata"]["labels"]  # type: ignore[index]
            create_quorum_claim(kube, ns, NAME, k, labels)
        # A spare issued before the operator saw its pod's container records none, and is replaced
        # by one naming that container once the replica's voter fetched after it was seen (the
        # container could have read it): poll until every spare names its pod's container.
        def spares_of_running_pods() -> dict[int, Spare] | None:
            s = _spares(kube, ns)
            ok = s is not None and all(s[i].container == f"containerd://c{i - 1}-a" for i in (1, 2, 3))
            return s if ok else None

        spares = kube.wait_for(
            "a spare per replica once bootstrapped, naming its pod's container", spares_of_running_pods,
            timeout=120,
        )
        d = _secret(kube, ns)
        for i in (1, 2, 3):
            assert _disk(d[f"spare-{i}.crt"]) == spares[i].uuid != _disk(d[f"node-{i}.crt"])
            assert spares[i].claim == _claim_uid(kube, ns, i - 1)
        st = _status(kube, ns)
        assert {v["id"]: v["uuid"] for v in st["voters"]} == {i: nodes.uuids[i] for i in (1, 2, 3)}

        # Replica 2's disk replaced: a new claim, an empty volume formatted with the spare.
        spare2 = spares[2].uuid
        nodes.kill(2)
        shutil.rmtree(nodes.data_dir(2))
        _replace_claim_and_pod(kube, ns, 1)
        nodes.mount(2, _secret(kube, ns))
        assert nodes.format_from(2, "spare.crt", replacement=True) == spare2
        nodes.start(2)
        _run_pod(kube, ns, 1, "c1-b")

        def recovered() -> dict[str, Any] | None:
            recs = _status(kube, ns).get("recoveries") or []
            done = [r for r in recs if r.get("replicaId") == 2 and r.get("result") == "Succeeded"]
            return done[-1] if done else None

        rec = kube.wait_for("replica 2 recovered on its spare's disk", recovered, timeout=120)
        assert rec["newUuid"] == spare2
        after = _secret(kube, ns)
        assert after["node-2.crt"] == d["spare-2.crt"] and after["node-2.key"] == d["spare-2.key"]
        nxt = _spares(kube, ns)
        assert nxt is not None and nxt[2].uuid not in (spare2, spares[2].uuid)
        assert nxt[2].claim == _claim_uid(kube, ns, 1) != spares[2].claim
        assert not _events(kube, ns, "CertificateForNewDisk")
        promoted = "replica 2's new disk took its spare certificate"
        assert promoted in op.log.read_text(errors="replace"), op.tail()

        # Replica 1's node container restarted on its own volume: it read the spare, so a new one.
        _run_pod(kube, ns, 0, "c0-b")
        rotated = kube.wait_for(
            "replica 1's spare replaced",
            lambda: (s := _spares(kube, ns)) and s[1].uuid != spares[1].uuid and s,
            timeout=60,
        )
        assert rotated[1].container == "containerd://c0-b"
        assert _disk(_secret(kube, ns)["node-1.crt"]) == nodes.uuids[1]  # its certificate stays

        # Replica 3's volume emptied on the same claim, formatted with the spare: refused.
        spare3 = rotated[3].uuid
        nodes.kill(3)
        shutil.rmtree(nodes.data_dir(3))
        nodes.mount(3, _secret(kube, ns))
        assert nodes.format_from(3, "spare.crt", replacement=True) == spare3
        nodes.start(3)
        _run_pod(kube, ns, 2, "c2-b")
        told = kube.wait_for(
            "a SpareCertificateRefused Event",
            lambda: _events(kube, ns, "SpareCertificateRefused"),
            timeout=60,
        )
        assert told[0]["type"] == "Warning" and spare3 in told[0]["message"], told
        burned = kube.wait_for(
            "replica 3's spare replaced",
            lambda: (s := _spares(kube, ns)) and s[3].uuid != spare3 and s,
            timeout=60,
        )
        assert burned[3].claim == _claim_uid(kube, ns, 2)
        recs = _status(kube, ns).get("recoveries") or []
        assert not [r for r in recs if r.get("replicaId") == 3], recs
        assert _disk(_secret(kube, ns)["node-3.crt"]) != spare3
        assert op.proc.poll() is None, op.tail()
    finally:
        nodes.stop()
        op.stop()
        print("operator log:\n" + op.tail())

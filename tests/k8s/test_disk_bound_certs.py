"""Node certificates follow the disk, against a real kube-apiserver (no kubelet: the pod's
status is written through ``pods/status`` as the kubelet writes it). Every node certificate the
operator issues names a storage UUID; when replica 2's pod reports that its node refused its
certificate because its volume is a new disk, the operator issues the certificate of that disk
(the old one, naming the retired disk, leaves the Secret), posts an Event, and deletes the pod
once so that the next one copies the new certificate; the other replicas keep theirs."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography import x509

from quorum.security.pki import identity_from_cert
from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import (  # noqa: F401
    Operator,
    create,
    create_quorum_claim,
    create_quorum_pod,
    get,
    kq,
    operator,
)

pytestmark = pytest.mark.k8s

NEW_DISK = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


def _disks(kube: KubeEnv, ns: str) -> dict[int, tuple[str | None, bytes]] | None:
    s = get(kube, f"/api/v1/namespaces/{ns}/secrets/db-tls")
    data = (s or {}).get("data") or {}
    out = {}
    for i in (1, 2, 3):
        if f"node-{i}.crt" not in data:
            return None
        pem = base64.b64decode(data[f"node-{i}.crt"])
        out[i] = (identity_from_cert(x509.load_pem_x509_certificate(pem)).storage_uuid, pem)
    return out


def _refused(old: str) -> dict[str, Any]:
    # What `kraftkeeper start` prints, as FallbackToLogsOnError puts it in the message.
    message = (
        f"INVALID_REQUEST: /etc/kraftkeeper/tls/node.crt is bound to storage {old}, but this node's disk "
        f"is {NEW_DISK}: issue the node a certificate for its disk (kraftkeeper tls issue-node "
        f"--node-id 2 --storage-uuid {NEW_DISK})"
    )
    terminated = {"exitCode": 1, "reason": "Error", "message": message, "startedAt": None, "finishedAt": None}
    node = {
        "name": "node",
        "image": "kraftkeeper:test",
        "imageID": "",
        "ready": False,
        "restartCount": 1,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": terminated},
    }
    return {"status": {"phase": "Running", "containerStatuses": [node]}}


def _events(kube: KubeEnv, ns: str, reason: str) -> list[dict[str, Any]]:
    items = (get(kube, f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
    return [e for e in items if e.get("reason") == reason]


def test_a_new_disk_gets_its_own_certificate(kube: KubeEnv, namespace: str, operator: Operator) -> None:  # noqa: F811
    ns = namespace
    create(kube, ns, kq("db", 3))
    before = kube.wait_for("Secret db-tls with 3 node certificates", lambda: _disks(kube, ns), timeout=60)
    uuids = [before[i][0] for i in (1, 2, 3)]
    assert all(uuids) and len(set(uuids)) == 3, uuids  # each bound to a disk of its own
    old = uuids[1]
    assert old is not None
    uid = create_quorum_pod(kube, ns, "db", 1, ["node"])["metadata"]["uid"]
    path = f"/api/v1/namespaces/{ns}/pods/db-1/status"
    st, body = kube.request("PATCH", path, _refused(old), content_type="application/merge-patch+json")
    assert st == 200, body

    after = kube.wait_for(
        "replica 2's certificate naming the new disk",
        lambda: (d := _disks(kube, ns)) and d[2][0] == NEW_DISK and d,
        timeout=60,
    )
    assert after[1] == before[1] and after[3] == before[3]  # the others keep theirs
    kube.wait_for(
        "the pod deleted to take it",
        lambda: (
            (get(kube, f"/api/v1/namespaces/{ns}/pods/db-1") or {}).get("metadata", {}).get("uid") != uid
            or None
        ),
        timeout=60,
    )
    told = kube.wait_for("a CertificateForNewDisk Event", lambda: _events(kube, ns, "CertificateForNewDisk"))
    assert NEW_DISK in told[0]["message"] and "replica 2" in told[0]["message"]
    assert operator.proc.poll() is None, operator.tail()


CORRUPT = (
    "CORRUPT_LOG: /data/kraft/__cluster_metadata-0/00000000000000000000.log: damaged batch, not a torn "
    "write: CRC mismatch in batch at offset 14 (position 1001) at position 1001 (offset 14)"
)


def test_a_damaged_log_without_a_healthy_majority_deletes_nothing(
    kube: KubeEnv,
    namespace: str,
    operator: Operator,  # noqa: F811
) -> None:
    """No leader answers here (no pods run): the operator may not take the damaged disk for lost;
    it says so in a Warning Event naming the file and offset, and the claim and pod stay."""
    ns = namespace
    create(kube, ns, kq("dl", 3))
    labels = create_quorum_pod(kube, ns, "dl", 0, ["node"])["metadata"]["labels"]
    create_quorum_claim(kube, ns, "dl", 0, labels)
    uid = (get(kube, f"/api/v1/namespaces/{ns}/pods/dl-0") or {})["metadata"]["uid"]
    status = _refused("00000000-0000-4000-8000-000000000000")
    node = status["status"]["containerStatuses"][0]
    node["lastState"]["terminated"]["message"] = "kraftkeeper: preparing dl-0\n" + CORRUPT
    st, body = kube.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/dl-0/status",
        status,
        content_type="application/merge-patch+json",
    )
    assert st == 200, body
    told = kube.wait_for("a DamagedLogNeedsAction Event", lambda: _events(kube, ns, "DamagedLogNeedsAction"))
    msg = told[0]["message"]
    assert told[0]["type"] == "Warning" and "replica 1" in msg and "position 1001 (offset 14)" in msg
    assert "nothing deleted" in msg and "replica(s) [2, 3]" in msg and "uncleanRecovery" in msg
    assert (get(kube, f"/api/v1/namespaces/{ns}/pods/dl-0") or {})["metadata"]["uid"] == uid
    assert get(kube, f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data-dl-0") is not None
    assert not _events(kube, ns, "DamagedDiskReplaced")
    assert operator.proc.poll() is None, operator.tail()

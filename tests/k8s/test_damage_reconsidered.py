"""A damaged log that could not be replaced at first is replaced once the quorum heals, against a
real kube-apiserver with real node processes standing in for the pods (no kubelet: pod dl-0's
status is written through ``pods/status`` as the kubelet writes it). Replica 1 stops on a damaged
log while replica 2 is down too: no healthy majority without it, so a ``DamagedLogNeedsAction``
Event and nothing deleted, however many passes follow. Replica 2 comes back: the operator
reconsiders the still-damaged pod, deletes its claim and pod (``DamagedDiskReplaced``), and says
each thing once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import (
    PLAINTEXT,
    Operator,
    create,
    create_quorum_claim,
    create_quorum_pod,
    get,
    kq,
    kq_status,
    overrides_for,
    wait_known_voters,
)
from tests.k8s.test_disk_bound_certs import CORRUPT, _refused
from tests.k8s.test_disk_bound_certs import _events as _events_of
from tests.operator.operator_nodes import LocalCluster, engine_missing, hold

pytestmark = pytest.mark.k8s


def _damaged_status() -> dict[str, Any]:
    """The pod's status as the kubelet reports a node container that keeps stopping with
    CORRUPT_LOG (FallbackToLogsOnError puts its last lines in the message)."""
    status = _refused("00000000-0000-4000-8000-000000000000")
    node = status["status"]["containerStatuses"][0]
    node["lastState"]["terminated"]["message"] = f"kraftkeeper: preparing dl-0\n{CORRUPT}"
    return status


@pytest.mark.slow
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_a_damaged_disk_is_replaced_once_the_quorum_heals(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    nodes = LocalCluster(tmp_path / "nodes", 3, extra=["--no-recovery"], insecure=True)
    op = Operator(kube, ns, tmp_path / "operator.log", overrides_for(nodes, ns, "dl"))
    holds: list[Path] = []
    try:
        create(kube, ns, kq("dl", 3, tls=PLAINTEXT))
        wait_known_voters(kube, ns, "dl", 3)
        # Replica 1's node stops (its log is damaged) and replica 2 is down as well.
        for node in (1, 2):
            holds.append(hold(tmp_path / "nodes", node))
        for node in (1, 2):
            kube.wait_for(
                f"stand-in node {node} stopped",
                lambda n=node: (tmp_path / "nodes" / "control" / f"node-{n}.stopped").exists(),
                timeout=60,
            )
        # The operator's view must show it too (a voter counts as healthy for 5 s after its last
        # fetch): the damage is reported only when the quorum is seen lost.
        kube.wait_for("QuorumLost reported", lambda: kq_status(kube, ns, "dl").get("phase") == "QuorumLost")
        labels = create_quorum_pod(kube, ns, "dl", 0, ["node"])["metadata"]["labels"]
        create_quorum_claim(kube, ns, "dl", 0, labels)
        uid = (get(kube, f"/api/v1/namespaces/{ns}/pods/dl-0") or {})["metadata"]["uid"]
        st, body = kube.request(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/dl-0/status",
            _damaged_status(),
            content_type="application/merge-patch+json",
        )
        assert st == 200, body
        told = kube.wait_for(
            "a DamagedLogNeedsAction Event", lambda: _events_of(kube, ns, "DamagedLogNeedsAction")
        )
        assert "replica 1" in told[0]["message"] and "no healthy majority" in told[0]["message"]
        assert get(kube, f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data-dl-0") is not None
        assert (get(kube, f"/api/v1/namespaces/{ns}/pods/dl-0") or {})["metadata"]["uid"] == uid

        # Replica 2 returns: 2 and 3 commit without replica 1, whose pod is still damaged.
        holds.pop().unlink()
        replaced = kube.wait_for(
            "a DamagedDiskReplaced Event", lambda: _events_of(kube, ns, "DamagedDiskReplaced"), timeout=120
        )
        msg = replaced[0]["message"]
        assert "replica 1" in msg and "position 1001 (offset 14)" in msg, msg
        assert "PersistentVolumeClaim data-dl-0" in msg and "pod dl-0 deleted" in msg, msg
        # Deleted: gone, or held by its pvc-protection finalizer (no controller-manager runs here)
        claim_now = get(kube, f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data-dl-0")
        assert claim_now is None or claim_now["metadata"].get("deletionTimestamp"), claim_now
        assert get(kube, f"/api/v1/namespaces/{ns}/pods/dl-0") is None
        # Many passes saw the damaged pod without a majority: still one Event (and one count).
        needs = _events_of(kube, ns, "DamagedLogNeedsAction")
        assert len(needs) == 1 and needs[0].get("count", 1) == 1, needs
        assert len(_events_of(kube, ns, "DamagedDiskReplaced")) == 1
        assert op.proc.poll() is None, op.tail()
    finally:
        for h in holds:
            h.unlink(missing_ok=True)
        op.stop()
        assert nodes.stop() == 0, nodes.tail()

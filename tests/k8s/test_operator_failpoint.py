"""The kopf operator stopped by its failpoint right after AddVoter committed (failpoints.py), then
started again: it resumes with RemoveVoter from status and the quorum, the recovery Succeeds, and
neither the event log nor the Kubernetes Events repeat the committed step. Against a real
kube-apiserver, real node processes on loopback standing in for the pods (as test_operator_recovery.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator import failpoints

from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import (
    PLAINTEXT,
    Operator,
    create,
    get,
    kq,
    kq_status,
    overrides_for,
    wait_known_voters,
)
from tests.operator.helpers import FULL
from tests.operator.operator_nodes import LocalCluster, engine_missing, kk

pytestmark = pytest.mark.k8s



def _log(d: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for f in sorted(d.rglob("*.jsonl")) for x in f.read_text().splitlines() if x]


@pytest.mark.slow
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_operator_stopped_after_add_voter_committed_resumes_with_remove_voter(
    kube: KubeEnv,
    kraftquorum_crd: dict[str, Any],
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ns = namespace
    nodes = LocalCluster(tmp_path / "nodes", 3, extra=["--no-recovery"], insecure=True)
    monkeypatch.setenv(failpoints.ENV, failpoints.AFTER_ADD_COMMITTED)
    overrides = overrides_for(nodes, ns, "q")
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    ev_dir = tmp_path / "ev"

    def status() -> dict[str, Any]:
        return kq_status(kube, ns, "q")

    try:
        spec = {"recovery": {"stabilizationSeconds": 1}, "eventLog": {"path": str(ev_dir)}, "tls": PLAINTEXT}
        uid = create(kube, ns, kq("q", 3, **spec))["metadata"]["uid"]
        first = wait_known_voters(kube, ns, "q", 3)
        old = next(v["uuid"] for v in first["voters"] if v["id"] == 3)
        out = kk("cluster", "replace-disk", "--dir", str(tmp_path / "nodes"), "--node", "3")
        assert out.returncode == 0, out.stderr
        new = out.stdout.strip().splitlines()[-1]
        assert op.proc.wait(timeout=180) == failpoints.EXIT_CODE, op.tail()
        assert "after-add-voter-committed=exit reached" in op.tail()
        x = nodes.describe()
        assert x is not None and {(3, old), (3, new)} <= {(v["id"], v["uuid"]) for v in x["voters"]}
        rec = next(r for r in status()["recoveries"] if r["newUuid"] == new)
        assert rec["result"] == "InProgress" and "atAddCommitted" not in rec["phaseSeconds"]
        rid = rec["recoveryId"]
        assert [e["type"] for e in _log(ev_dir) if e["recovery_id"] == rid][-1] == "add_voter_committed"

        monkeypatch.delenv(failpoints.ENV)
        op = Operator(kube, ns, tmp_path / "operator2.log", overrides)

        def done() -> dict[str, Any] | None:
            s = status()
            ok = [
                r for r in s.get("recoveries") or [] if r["recoveryId"] == rid and r["result"] == "Succeeded"
            ]
            keys = {(v["id"], v.get("uuid")) for v in s.get("voters") or []}
            return s if ok and (3, new) in keys and (3, old) not in keys else None

        kube.wait_for("the recovery Succeeded after the restart", done, timeout=180)
        assert [e["type"] for e in _log(ev_dir) if e["recovery_id"] == rid] == FULL

        def k8s_events(reason: str) -> list[dict[str, Any]]:
            items = (get(kube, f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
            return [
                e
                for e in items
                if e["involvedObject"].get("uid") == uid and e.get("reason") == reason and rid in e["message"]
            ]

        kube.wait_for("RecoveryCompleted Event", lambda: k8s_events("RecoveryCompleted"), timeout=30)
        # Each step's Event exactly once: the operator posts a step's Event itself before the next
        # step and before the failpoint (through kopf's queue, AddVoterCommitted was
        # lost when the process stopped there), and the restarted one does not post it again.
        for reason in ("AddVoterStarted", "AddVoterCommitted", "RemoveVoterStarted", "RemoveVoterCommitted"):
            got = k8s_events(reason)
            assert len(got) == 1 and int(got[0].get("count") or 1) == 1, (reason, got)
        assert op.proc.poll() is None, op.tail()
    finally:
        op.stop()
        nodes.stop()

"""The kopf operator's unclean recovery against a real kube-apiserver (fixtures in conftest.py),
with real node processes on loopback standing in for the pods and the pods' real init container run
in the kubelet's place: only when the resource allows it and only once, and the survivor chosen by
the newer epoch, not the longer stale log."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.k8s.manifests import parse_spec

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

def _allow_unclean(kube: KubeEnv, kq_path: str, cm_path: str, timeout: float) -> dict[str, Any]:
    """Allow unclean recovery (afterSeconds 30) on the KRaftQuorum and wait for the operator's
    request to appear in the bootstrap ConfigMap; that ConfigMap."""
    st, body = kube.request(
        "PATCH",
        kq_path,
        {"spec": {"uncleanRecovery": {"enabled": True, "afterSeconds": 30}}},
        content_type="application/merge-patch+json",
    )
    assert st == 200, body
    return kube.wait_for(  # type: ignore[no-any-return]
        "the unclean-recovery request in the ConfigMap",
        lambda: (c := get(kube, cm_path)) and "unclean-recovery" in (c.get("data") or {}) and c,
        timeout=timeout,
    )

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
    overrides = overrides_for(nodes, ns, name)
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    holds: list[Path] = []
    kq_path = KQ.format(ns=ns) + f"/{name}"
    cm_path = f"/api/v1/namespaces/{ns}/configmaps/{name}-bootstrap"
    pod_path = f"/api/v1/namespaces/{ns}/pods/{name}-1"
    ev_dir = tmp_path / "ev"

    def status() -> dict[str, Any]:
        return kq_status(kube, ns, name)

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
        first = wait_known_voters(kube, ns, name, 3)
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
        cm = _allow_unclean(kube, kq_path, cm_path, timeout=60)
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
    """The survivor rule, Kubernetes mode (local processes stand in for the pods): five voters; of the two
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
    overrides = overrides_for(nodes, ns, name)
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    holds: list[Path] = []
    kq_path = KQ.format(ns=ns) + f"/{name}"
    cm_path = f"/api/v1/namespaces/{ns}/configmaps/{name}-bootstrap"
    try:
        create(kube, ns, kq(name, 5, tls=PLAINTEXT))  # uncleanRecovery: off while the case is built
        wait_known_voters(kube, ns, name, 5)
        stale, fresh = make_stale_longer_log(nodes, holds)
        kube.wait_for(
            "QuorumLost",
            lambda: kq_status(kube, ns, name).get("phase") == "QuorumLost",
        )
        cm = _allow_unclean(kube, kq_path, cm_path, timeout=90)
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

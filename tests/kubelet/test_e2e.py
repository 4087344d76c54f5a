"""The product as a user runs it, on a real single-node Kubernetes (kubelet + containerd).

The path of e2e/kind.sh, for real: the image built by scripts/build-image.sh and imported into
containerd, `helm install` of the chart (the operator runs as a pod), `kubectl apply -f
e2e/sample.yaml` in a namespace that enforces the `restricted` Pod Security level, writes through
the client Service from a client pod, and a lost disk (pod deleted together with its PVC) that
heals with no human step while a client keeps writing. Every acknowledged write reads back.

One cluster, one operator and one quorum are shared by every test of this package (the fixtures in
conftest.py); the tests run in file order and each leaves the quorum Available with 3 voters.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
from typing import Any

import pytest
from cryptography import x509

from quorum.security.pki import identity_from_cert
from tests.kubelet.conftest import (
    CLIENT_CONFIG,
    OPERATOR_NS,
    QUORUM,
    QUORUM_NS,
    NodeCluster,
    quorum_available,
    wait_available,
)

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
CLIENT_BOOTSTRAP = f"{QUORUM}.{QUORUM_NS}.svc:9093"  # the client Service (a ClusterIP)
RECOVERY_TIMEOUT_S = 300.0

# Runs inside the client pod: writes PREFIX-0, PREFIX-1, ... through the client Service until
# /tmp/stop-PREFIX exists, printing "ACK key" only for writes the quorum acknowledged. A failed
# write is retried with the same key and value (a put is idempotent), so nothing is skipped.
CLIENT = f"""
import os
from quorum.client import QuorumClient
from quorum.security.clientconfig import load_client_config
def client(boot, timeout):
    cfg = load_client_config("{CLIENT_CONFIG}") if os.path.exists("{CLIENT_CONFIG}") else None
    return QuorumClient(boot, timeout=timeout, client_config=cfg)
"""
WRITER = CLIENT + """
import asyncio, sys
prefix, boot = sys.argv[1], sys.argv[2]
if os.path.exists("/tmp/stop-" + prefix):
    os.remove("/tmp/stop-" + prefix)  # left by an earlier run on a cluster that was kept up
async def main():
    i = 0
    async with client(boot, 5) as c:
        while not os.path.exists("/tmp/stop-" + prefix):
            key = f"{prefix}-{i}"
            try:
                await c.put(key, f"value-{i}".encode())
            except Exception as e:
                # Tried again at once: the client itself waits out an election (its timeout).
                print(f"ERR {key} {type(e).__name__}: {e}", flush=True)
                continue
            print(f"ACK {key}", flush=True)
            i += 1
            await asyncio.sleep(0.05)  # the write rate (20/s), so the keys read back stay few
    print("DONE", flush=True)
asyncio.run(main())
"""

# Runs inside the client pod: reads every key given on stdin back, prints the ones that differ.
READER = CLIENT + """
import asyncio, sys
boot = sys.argv[1]
keys = sys.stdin.read().split()
async def main():
    bad = 0
    async with client(boot, 10) as c:
        for key in keys:
            want = ("value-" + key.rsplit("-", 1)[1]).encode()
            got = await c.get(key)
            if got != want:
                bad += 1
                print(f"LOST {key}: {got!r}", flush=True)
    print(f"CHECKED {len(keys)} BAD {bad}", flush=True)
asyncio.run(main())
"""


class Writer:
    """A client pod process writing continuously; acked() are the keys the quorum acknowledged so
    far (its output is read by a thread while it runs)."""

    def __init__(self, cluster: NodeCluster, prefix: str, pod: str = "client",
                 bootstrap: str = CLIENT_BOOTSTRAP, namespace: str = QUORUM_NS) -> None:
        self.cluster, self.prefix, self.pod, self.namespace = cluster, prefix, pod, namespace
        self.proc = subprocess.Popen(
            [str(cluster.bin_dir / "kubectl"), "exec", "-n", namespace, pod, "--",
             "python", "-c", WRITER, prefix, bootstrap],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def acked(self) -> list[str]:
        return [line.split()[1] for line in list(self.lines) if line.startswith("ACK ")]

    def wait_acked(self, more_than: int, what: str) -> None:
        self.cluster.wait_for(what, lambda: len(self.acked()) > more_than or None, timeout=120, interval=0.2,
                              context=lambda: "\n".join(self.lines[-20:]))

    def stop(self) -> list[str]:
        self.cluster.kubectl("exec", "-n", self.namespace, self.pod, "--", "touch",
                             f"/tmp/stop-{self.prefix}")
        self.proc.wait(timeout=120)
        self._reader.join(timeout=30)
        assert "DONE" in self.lines, "the writer did not finish cleanly:\n" + "\n".join(self.lines[-30:])
        return self.acked()


def read_back(cluster: NodeCluster, keys: list[str], pod: str = "client",
              bootstrap: str = CLIENT_BOOTSTRAP, namespace: str = QUORUM_NS) -> None:
    proc = cluster.kubectl("exec", "-i", "-n", namespace, pod, "--", "python", "-c", READER,
                           bootstrap, stdin="\n".join(keys), timeout=300)
    assert f"CHECKED {len(keys)} BAD 0" in proc.stdout, f"acknowledged writes lost:\n{proc.stdout[-4000:]}"


def kv(cluster: NodeCluster, *args: str) -> str:
    """`kraftkeeper kv ...` in the client pod, with the mounted client credential when there is one."""
    script = (f'[ -f {CLIENT_CONFIG} ] && export KRAFTKEEPER_CLIENT_CONFIG={CLIENT_CONFIG}; '
              f'exec kraftkeeper kv "$@" --bootstrap {CLIENT_BOOTSTRAP}')
    return cluster.kubectl("exec", "-n", QUORUM_NS, "client", "--", "sh", "-c", script, "kv", *args).stdout


def voter_uuids(status: dict[str, Any]) -> dict[int, str]:
    return {int(v["id"]): str(v["uuid"]) for v in status.get("voters") or []}


def test_operator_runs_as_a_pod_from_the_chart(node_cluster: NodeCluster, operator_release: str) -> None:
    c = node_cluster
    dep = c.get_json("deployment", "kraftkeeper", "-n", OPERATOR_NS)
    assert dep["status"].get("readyReplicas") == 1, dep["status"]
    pods = c.get_json("pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=kraftkeeper")["items"]
    assert len(pods) == 1 and pods[0]["status"]["phase"] == "Running", [p["status"] for p in pods]
    pod = pods[0]
    container = pod["spec"]["containers"][0]
    assert container["image"].endswith("kraftkeeper:dev")
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # The liveness probe has passed on a real kubelet: the container was never restarted.
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    # Namespace-scoped RBAC (the chart's default): a Role in the watched namespace, nothing
    # cluster-wide, and the operator started without one refused request (no cluster scanning).
    assert c.get_json("role", "kraftkeeper", "-n", QUORUM_NS) is not None
    assert c.get_json("clusterrole", "kraftkeeper") is None
    assert f"--namespace={QUORUM_NS}" in container["args"]
    log = c.kubectl("logs", "-n", OPERATOR_NS, pod["metadata"]["name"]).stdout
    assert "forbidden" not in log.lower() and "Not enough permissions" not in log, log[-3000:]
    # The image carries Kafka's membership schemas, so a spec.kafka quorum heals with nothing
    # mounted (AddRaftVoter built from them inside the running operator container).
    probe = ("from quorum.kafka.schemas import find_clients_jar, membership_messages; "
             "print(find_clients_jar(), membership_messages()['AddRaftVoterRequest'].API_KEY)")
    out = c.kubectl("exec", "-n", OPERATOR_NS, pod["metadata"]["name"], "--", "python3", "-c", probe).stdout
    assert out.split()[0].startswith("/opt/kraftkeeper-kafka/kafka-clients-") and out.split()[1] == "80", out


def test_quorum_forms_under_restricted_pod_security(node_cluster: NodeCluster, quorum_ns: str) -> None:
    c = node_cluster
    ns = c.get_json("namespace", quorum_ns)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = c.get_json("pods", "-n", quorum_ns, "-l", "app.kubernetes.io/component=quorum")["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["demo-0", "demo-1", "demo-2"]
    assert all(p["status"]["phase"] == "Running" for p in pods), [p["status"]["phase"] for p in pods]
    st = wait_available(c)
    uuids = voter_uuids(st)
    assert sorted(uuids) == [1, 2, 3], st["voters"]
    assert all(UUID.match(u) for u in uuids.values()), st["voters"]
    assert len(set(uuids.values())) == 3
    assert st["leaderId"] in uuids and st["leaderEpoch"] >= 1
    assert st["phase"] == "Running", st
    # Bootstrap published voters whose UUIDs were not known yet; no status write may have been
    # refused for it (a 422 was seen on `voters[0].uuid: ""`).
    log = c.kubectl("logs", "-n", OPERATOR_NS, "deploy/kraftkeeper").stdout
    assert not re.search(r"Unprocessable|Invalid value|[Pp]atching failed", log), log[-4000:]


def test_writes_through_the_client_service(node_cluster: NodeCluster, quorum_ns: str) -> None:
    out = kv(node_cluster, "put", "e2e-key", "hello")
    assert out.startswith("OK offset="), out
    assert kv(node_cluster, "get", "e2e-key").strip() == "hello"


# Runs inside the client pod: the retired disk's certificate (JSON on stdin: ca, crt, key) sends
# a Fetch to the leader claiming the new disk's UUID, then its own; prints both answers.
RETIRED = """
import http.client, json, sys, tempfile, os
from quorum.core import messages as m
from quorum.runtime import wire
from quorum.security.tlsctx import client_context
d = json.loads(sys.stdin.read())
tmp = tempfile.mkdtemp()
for k in ("ca", "crt", "key"):
    with open(os.path.join(tmp, k), "w") as f:
        f.write(d[k])
ctx = client_context(os.path.join(tmp, "ca"), os.path.join(tmp, "crt"), os.path.join(tmp, "key"))
for uuid in (d["new"], d["old"]):
    msg = m.FetchRequest(1, d["cluster"], d["id"], uuid, d["epoch"], 0, 0, 0, 1024, None)
    conn = http.client.HTTPSConnection(d["host"], 9093, timeout=30, context=ctx)
    conn.request("POST", "/raft/v1/" + m.RPC_PATHS[m.FetchRequest], body=wire.encode(msg))
    r = conn.getresponse()
    raw = r.read()
    code = wire.decode(m.FetchResponse, raw).error_code.value if r.status == 200 else raw.decode()[:200]
    print("ANSWER", uuid, r.status, code, flush=True)
"""


def _node_credential(c: NodeCluster, replica_id: int) -> dict[str, str]:
    data = c.get_json("secret", f"{QUORUM}-tls", "-n", QUORUM_NS)["data"]
    out = {k: base64.b64decode(data[f"node-{replica_id}.{k}"]).decode() for k in ("crt", "key")}
    out["ca"] = base64.b64decode(data["ca.crt"]).decode()
    return out


def _disk_of(credential: dict[str, str]) -> str | None:
    return identity_from_cert(x509.load_pem_x509_certificate(credential["crt"].encode())).storage_uuid


def _retired_certificate_refused(c: NodeCluster, stolen: dict[str, str], replica_id: int, old: str,
                                 new: str, st: dict[str, Any]) -> None:
    """The replaced disk's certificate, kept by whoever kept the disk, claiming the new disk is
    refused (403); as itself, the retired (id, old UUID), it gets NOT_VOTER."""
    leader = int(st["leaderId"])
    host = f"{QUORUM}-{leader - 1}.{QUORUM}-headless.{QUORUM_NS}.svc"
    cluster = identity_from_cert(x509.load_pem_x509_certificate(stolen["crt"].encode())).cluster_id
    ask = {**stolen, "cluster": cluster, "id": replica_id, "old": old, "new": new, "host": host,
           "epoch": int(st["leaderEpoch"])}
    out = c.kubectl("exec", "-i", "-n", QUORUM_NS, "client", "--", "python", "-c", RETIRED,
                    stdin=json.dumps(ask), timeout=120).stdout
    assert f"ANSWER {new} 403 " in out and "PERMISSION_DENIED" in out, out
    assert f"ANSWER {old} 200 NOT_VOTER" in out, out


def _replace_disk(c: NodeCluster, ordinal: int, prefix: str) -> dict[str, Any]:
    """Deletes pod demo-ORDINAL together with its PVC under continuous writes, waits for the
    operator's recovery, checks the new voter and that every acknowledged write reads back. The
    node certificates name their disk: the new pod's certificate names the new disk, and the old
    one is refused by the quorum."""
    st = wait_available(c)
    replica_id = ordinal + 1
    old_uuid = voter_uuids(st)[replica_id]
    stolen = _node_credential(c, replica_id)
    assert _disk_of(stolen) == old_uuid, "a node certificate names its disk"
    recoveries_before = len(st.get("recoveries") or [])
    pod = f"{QUORUM}-{ordinal}"
    volumes = c.get_json("pod", pod, "-n", QUORUM_NS)["spec"]["volumes"]
    pvc = next(v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v)
    old_pv = c.get_json("pvc", pvc, "-n", QUORUM_NS)["spec"]["volumeName"]

    writer = Writer(c, prefix)
    writer.wait_acked(0, "the writer's first acknowledged write")
    c.kubectl("delete", "pvc", pvc, "-n", QUORUM_NS, "--wait=false")
    c.kubectl("delete", "pod", pod, "-n", QUORUM_NS, "--wait=false")

    def recovered() -> dict[str, Any] | None:
        s = (c.get_json("kraftquorum", QUORUM, "-n", QUORUM_NS) or {}).get("status") or {}
        recs = s.get("recoveries") or []
        if len(recs) > recoveries_before and recs[-1].get("result") == "Succeeded":
            return recs[-1]  # type: ignore[no-any-return]
        return None

    rec = c.wait_for(f"the recovery of replica {replica_id}", recovered, timeout=RECOVERY_TIMEOUT_S,
                     interval=1.0, context=c.describe)
    # The status written with the Succeeded record lists the voter set the recovery made (the
    # controller publishes its committed changes, tests/operator/test_committed_status.py); here
    # the quorum must also be Available with the new voter.
    def recovered_voters() -> dict[str, Any] | None:
        s = quorum_available(c)
        return s if s and voter_uuids(s).get(replica_id) == rec.get("newUuid") else None

    final = c.wait_for("the quorum Available with the new voter", recovered_voters, timeout=120,
                       context=c.describe)
    # The client keeps writing through the recovered quorum, then everything acknowledged reads back.
    writer.wait_acked(len(writer.acked()), "a write acknowledged after the recovery")
    acked = writer.stop()
    read_back(c, acked)

    new_uuid = voter_uuids(final)[replica_id]
    assert new_uuid != old_uuid and UUID.match(new_uuid), (old_uuid, final["voters"])
    assert old_uuid not in voter_uuids(final).values()
    assert rec["replicaId"] == replica_id and rec.get("newUuid") == new_uuid, rec
    assert _disk_of(_node_credential(c, replica_id)) == new_uuid, "the new disk has its own certificate"
    _retired_certificate_refused(c, stolen, replica_id, old_uuid, new_uuid, final)
    new_pv = c.get_json("pvc", pvc, "-n", QUORUM_NS)["spec"]["volumeName"]
    assert new_pv != old_pv, "the StatefulSet's new claim must be bound to a fresh volume"
    _assert_story_told(c, str(rec["recoveryId"]))
    return rec


def _assert_story_told(c: NodeCluster, recovery_id: str) -> None:
    """A person reading the KRaftQuorum's Events and the operator's log sees every step."""
    events = c.get_json("events", "-n", QUORUM_NS,
                        "--field-selector", "involvedObject.kind=KRaftQuorum")["items"]
    reasons = {e["reason"] for e in events if recovery_id in e.get("message", "")}
    for step in ("DiskReplacementDetected", "AddVoterCommitted", "RemoveVoterCommitted", "RecoveryCompleted"):
        assert step in reasons, f"no {step} Event for recovery {recovery_id}: {sorted(reasons)}"
    log = c.kubectl("logs", "-n", OPERATOR_NS, "deploy/kraftkeeper").stdout
    ours = "\n".join(line for line in log.splitlines() if f"recovery {recovery_id}" in line)
    for step in ("disk_replacement_detected", "add_voter_committed", "remove_voter_committed",
                 "recovery_completed"):
        assert step in ours, f"the operator's log lacks {step} for recovery {recovery_id}:\n{log[-3000:]}"


def test_disk_replacement_of_a_follower_under_writes(node_cluster: NodeCluster, quorum_ns: str) -> None:
    st = wait_available(node_cluster)
    follower = next(i for i in sorted(voter_uuids(st)) if i != st["leaderId"])
    _replace_disk(node_cluster, follower - 1, "follower")


def test_disk_replacement_of_the_leader_under_writes(node_cluster: NodeCluster, quorum_ns: str) -> None:
    st = wait_available(node_cluster)
    _replace_disk(node_cluster, int(st["leaderId"]) - 1, "leader")


def _evict(c: NodeCluster, pod: str) -> tuple[bool, str]:
    body = json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": pod, "namespace": QUORUM_NS}})
    proc = c.kubectl("create", "--raw", f"/api/v1/namespaces/{QUORUM_NS}/pods/{pod}/eviction", "-f", "-",
                     stdin=body, check=False)
    return proc.returncode == 0, proc.stdout + proc.stderr


def test_pdb_refuses_evicting_two_quorum_pods_at_once(node_cluster: NodeCluster, quorum_ns: str) -> None:
    """A node drain evicts pod after pod; the PodDisruptionBudget (maxUnavailable 1 of 3) lets the
    first go and refuses the second while the first is not back, so a majority always stays."""
    c = node_cluster
    st = wait_available(c)
    follower = next(i for i in sorted(voter_uuids(st)) if i != st["leaderId"])
    other = next(i for i in sorted(voter_uuids(st)) if i not in (follower, st["leaderId"]))
    def pdb_allows_one() -> bool:
        pdb = c.get_json("pdb", QUORUM, "-n", QUORUM_NS) or {}
        return bool(pdb.get("status", {}).get("disruptionsAllowed") == 1)

    c.wait_for("the PDB to allow one disruption", pdb_allows_one, timeout=60)
    ok, out = _evict(c, f"{QUORUM}-{follower - 1}")
    assert ok, f"the first eviction should be allowed: {out}"
    ok, out = _evict(c, f"{QUORUM}-{other - 1}")
    assert not ok and ("disruption budget" in out or "429" in out or "TooManyRequests" in out), out
    # The evicted pod comes back on its own volume (same identity: no recovery) and the quorum
    # is whole again.
    c.wait_for("the quorum Available with 3 voters after the eviction", lambda: quorum_available(c),
               timeout=180, context=c.describe)
    assert voter_uuids(quorum_available(c) or {}) == voter_uuids(st)


def test_invalid_kraftquorum_is_refused_by_the_schema(node_cluster: NodeCluster, quorum_ns: str) -> None:
    bad = {"apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum",
           "metadata": {"name": "bad", "namespace": QUORUM_NS},
           "spec": {"voters": 0, "storage": {"size": "not-a-size"}}}
    proc = node_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert proc.returncode != 0, proc.stdout
    assert "spec.voters" in proc.stderr, proc.stderr
    assert node_cluster.get_json("kraftquorum", "bad", "-n", QUORUM_NS) is None

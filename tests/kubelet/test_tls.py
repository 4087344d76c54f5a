"""TLS on the real single-node cluster: e2e/sample.yaml runs in the default mode
(the operator creates the quorum's CA, node certificates and the applications' client Secret), the
client pod talks to the quorum over https with the mounted client credential, a request without
one is refused, and a certificate renewal of every node, forced through ``spec.tls``, restarts the
pods one at a time under continuous writes without the quorum losing its majority; every
acknowledged write reads back.
"""

from __future__ import annotations

import datetime as dt
import json
import time
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
    pod_ready,
    quorum_available,
    quorum_pods,
    secret_data,
    wait_available,
)
from tests.kubelet.test_e2e import CLIENT_BOOTSTRAP, Writer, kv, read_back, voter_uuids

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

# Runs in the client pod: GET a key over https, verifying the node certificate against the quorum's
# CA and the client Service's DNS name, but presenting no client credential.
ANONYMOUS_GET = f"""
import json, ssl, urllib.error, urllib.request
ctx = ssl.create_default_context(cafile="{CLIENT_CONFIG.rsplit('/', 1)[0]}/ca.crt")
try:
    urllib.request.urlopen("https://{CLIENT_BOOTSTRAP}/v1/kv/e2e-tls", context=ctx, timeout=10)
    print("STATUS 200")
except urllib.error.HTTPError as e:
    print("STATUS", e.code, e.read().decode()[:200])
"""
PLAINTEXT_GET = f"""
import urllib.request
try:
    urllib.request.urlopen("http://{CLIENT_BOOTSTRAP}/v1/kv/e2e-tls", timeout=10)
    print("PLAINTEXT SERVED")
except Exception as e:
    print("REFUSED", type(e).__name__)
"""


def _secret(c: NodeCluster, name: str) -> dict[str, bytes]:
    data = secret_data(c, name)
    assert data is not None, f"Secret {QUORUM_NS}/{name} does not exist"
    return data


def _not_after(pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


def _quorum_pods(c: NodeCluster) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in quorum_pods(c)}


def test_tls_is_on_by_default_and_clients_need_a_credential(node_cluster: NodeCluster,
                                                            quorum_ns: str) -> None:
    c = node_cluster
    wait_available(c)
    spec_tls = c.quorum()["spec"].get("tls") or {}
    assert spec_tls.get("mode", "Operator") == "Operator", spec_tls
    ca = _secret(c, f"{QUORUM}-ca")["ca.crt"]
    ca_cert = x509.load_pem_x509_certificate(ca)
    nodes = _secret(c, f"{QUORUM}-tls")
    client = _secret(c, f"{QUORUM}-client")
    assert json.loads(client["client.json"])  # the config the client pod mounts
    assert client["ca.crt"] == ca and nodes["ca.crt"] == ca
    cluster_id = c.quorum()["status"].get("clusterId")
    for i in (1, 2, 3):
        cert = x509.load_pem_x509_certificate(nodes[f"node-{i}.crt"])
        cert.verify_directly_issued_by(ca_cert)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
        # Bound to its disk: kraftkeeper://CLUSTER/replica/N?storage=UUID
        assert any(u.split("?")[0].endswith(f"/replica/{i}") and "?storage=" in u for u in uris), uris
        if cluster_id:
            assert any(cluster_id in u for u in uris), (cluster_id, uris)
        assert f"{QUORUM}.{QUORUM_NS}.svc" in sans.get_values_for_type(x509.DNSName)
    # The node container never mounts the Secret holding every node's key (only its own key is
    # copied out by the tls init container).
    pod = c.get_json("pod", f"{QUORUM}-0", "-n", QUORUM_NS)
    node = next(x for x in pod["spec"]["containers"] if x["name"] == "node")
    secret_vols = {v["name"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert not secret_vols & {m["name"] for m in node.get("volumeMounts") or []}, node["volumeMounts"]

    # With the mounted credential (role readwrite): writes and reads over https.
    assert kv(c, "put", "e2e-tls", "secret-value").startswith("OK offset=")
    assert kv(c, "get", "e2e-tls").strip() == "secret-value"
    # Without a credential: the TLS handshake succeeds (the CA verifies the Service name) and the
    # request is refused as unauthenticated; plaintext HTTP is not served at all.
    out = c.kubectl("exec", "-n", QUORUM_NS, "client", "--", "python", "-c", ANONYMOUS_GET).stdout
    assert "STATUS 401" in out and "UNAUTHENTICATED" in out, out
    out = c.kubectl("exec", "-n", QUORUM_NS, "client", "--", "python", "-c", PLAINTEXT_GET).stdout
    assert out.startswith("REFUSED"), out


def test_certificate_renewal_one_pod_at_a_time_under_writes(node_cluster: NodeCluster,
                                                            quorum_ns: str) -> None:
    """Forced through spec.tls: renewBeforeDays 2999 of validityDays 3000 makes every current node
    certificate (issued for 90 days) due at once, and the renewed ones (3000 days) not due, so
    exactly one renewal round runs. The operator renews a node only while the quorum is fully
    healthy and restarts the next pod only once the previous one fetches again."""
    c = node_cluster
    st = wait_available(c)
    before = voter_uuids(st)
    old_certs = _secret(c, f"{QUORUM}-tls")
    old_uids = {name: p["metadata"]["uid"] for name, p in _quorum_pods(c).items()}
    assert len(old_uids) == 3, old_uids
    writer = Writer(c, "renew")
    writer.wait_acked(0, "the writer's first acknowledged write")

    c.kubectl("patch", "kraftquorum", QUORUM, "-n", QUORUM_NS, "--type=merge",
              "-p", json.dumps({"spec": {"tls": {"validityDays": 3000, "renewBeforeDays": 2999}}}))
    # Each poll also records what it saw on the way: the most pods unready at once and the
    # order in which pods were replaced.
    most_unready, restarted_order = 0, []

    def renewed_and_back() -> dict[str, bytes] | None:
        nonlocal most_unready
        pods = _quorum_pods(c)
        most_unready = max(most_unready, 3 - len([p for p in pods.values() if pod_ready(p)]))
        for name, p in pods.items():
            if p["metadata"]["uid"] != old_uids.get(name) and name not in restarted_order:
                restarted_order.append(name)
        now = _secret(c, f"{QUORUM}-tls")
        renewed = [i for i in (1, 2, 3) if now[f"node-{i}.crt"] != old_certs[f"node-{i}.crt"]]
        done = (len(renewed) == 3 and len(restarted_order) == 3 and all(pod_ready(p) for p in pods.values())
                and quorum_available(c))
        return now if done else None

    certs = c.wait_for("every certificate renewed and every pod restarted and Ready", renewed_and_back,
                       timeout=600, interval=0.5,
                       context=lambda: f"restarted {restarted_order}\n{c.describe()}")
    # One pod at a time: never more than one of three down, so a majority always stayed.
    assert most_unready <= 1, f"{most_unready} pods were unready at once during the renewal"
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=2900)
    for i in (1, 2, 3):
        assert _not_after(certs[f"node-{i}.crt"]) > soon, f"node {i}'s certificate not renewed for 3000 days"
    final = quorum_available(c)
    assert final is not None and voter_uuids(final) == before, "a renewal restart keeps every identity"
    # The operator's log tells a person which node was renewed and when it came back.
    log = c.kubectl("logs", "-n", OPERATOR_NS, "deploy/kraftkeeper").stdout
    for i in (1, 2, 3):
        assert f"restarting node {i} with its renewed certificate" in log, log[-3000:]
    assert log.count("is back in the quorum with its renewed certificate") >= 2, log[-3000:]
    # ... and so do the KRaftQuorum's Events (kubectl describe kraftquorum demo).
    events = c.get_json("events", "-n", QUORUM_NS,
                        "--field-selector", "involvedObject.kind=KRaftQuorum")["items"]
    told = {(e["reason"], e.get("message", "")) for e in events}
    for i in (1, 2, 3):
        started = ("CertificateRenewalStarted", f"restarting node {i} with its renewed certificate")
        assert started in told, told
    assert sum(1 for reason, _ in told if reason == "CertificateRenewed") >= 2, told
    writer.wait_acked(len(writer.acked()), "a write acknowledged after the renewal")
    read_back(c, writer.stop())
    # The renewed certificates are not due again: no second round. (The spares beside them are
    # replaced after each restart: a restarted node read its spare.)
    assert _nodes_only(_secret(c, f"{QUORUM}-tls")) == _nodes_only(certs)


def _nodes_only(secret: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in secret.items() if not k.startswith("spare-")}


def _disk(pem: bytes) -> str | None:
    return identity_from_cert(x509.load_pem_x509_certificate(pem)).storage_uuid


def test_a_replaced_disk_starts_once_with_its_spare_certificate(node_cluster: NodeCluster,
                                                                quorum_ns: str) -> None:
    """A follower's pod and claim deleted: the new pod's empty volume is formatted with the
    spare certificate's storage UUID, its node serves that certificate at its first start, the
    operator makes it the current one (the claim is new) and the recovery completes without a
    second start of the pod: no ``CertificateForNewDisk``, one pod, its container never restarted."""
    c = node_cluster
    st = wait_available(c)
    i = next(v for v in sorted(voter_uuids(st)) if v != st["leaderId"])
    pod, done = f"{QUORUM}-{i - 1}", len(st.get("recoveries") or [])

    def settled() -> dict[str, bytes] | None:
        """The pod's spare, once issued after its running node container started (spares.py)."""
        d = _secret(c, f"{QUORUM}-tls")
        state = d.get(f"spare-{i}.state", b"").decode().split()
        running = [s.get("containerID") for s in c.get_json("pod", pod, "-n", QUORUM_NS)["status"].get(
            "containerStatuses") or [] if s["name"] == "node" and "running" in (s.get("state") or {})]
        return d if len(state) == 3 and running and state[2] == running[0] else None

    spare = c.wait_for(f"replica {i}'s spare issued after its node started", settled, timeout=120,
                       context=c.describe)[f"spare-{i}.crt"]
    old_uid = c.get_json("pod", pod, "-n", QUORUM_NS)["metadata"]["uid"]
    t0 = time.monotonic()
    c.kubectl("delete", "pvc", f"data-{pod}", "-n", QUORUM_NS, "--wait=false")
    c.kubectl("delete", "pod", pod, "-n", QUORUM_NS, "--wait=false")
    seen: dict[str, int] = {}  # the new pod(s): uid -> the node container's restart count

    def recovered() -> dict[str, Any] | None:
        p = _quorum_pods(c).get(pod)
        if p is not None and p["metadata"]["uid"] != old_uid:
            node = [s for s in (p.get("status") or {}).get("containerStatuses") or [] if s["name"] == "node"]
            seen[p["metadata"]["uid"]] = max([seen.get(p["metadata"]["uid"], 0),
                                              *(int(s.get("restartCount") or 0) for s in node)])
        recs = (c.quorum().get("status") or {}).get("recoveries") or []
        ok = len(recs) > done and recs[-1].get("result") == "Succeeded" and recs[-1].get("replicaId") == i
        return recs[-1] if ok else None  # type: ignore[no-any-return]

    rec = c.wait_for(f"the recovery of replica {i} on its spare's disk", recovered, timeout=300, interval=0.2,
                     context=c.describe)
    took = time.monotonic() - t0
    assert rec["newUuid"] == _disk(spare), (rec, _disk(spare))
    recovered()  # the pod as it is now
    assert len(seen) == 1 and list(seen.values()) == [0], f"the new pod started more than once: {seen}"
    now = _secret(c, f"{QUORUM}-tls")
    assert now[f"node-{i}.crt"] == spare, "the spare became the node's certificate"
    assert _disk(now[f"spare-{i}.crt"]) not in (None, rec["newUuid"], rec["oldUuid"]), "and a new spare"
    events = c.get_json("events", "-n", QUORUM_NS,
                        "--field-selector", "involvedObject.kind=KRaftQuorum")["items"]
    told = [e for e in events
            if e["reason"] == "CertificateForNewDisk" and rec["newUuid"] in e.get("message", "")]
    assert not told, told
    print(f"\nTLS: replica {i}'s disk replaced, `kubectl delete pvc,pod` to recovery Succeeded in "
          f"{took:.1f} s, the pod started once")

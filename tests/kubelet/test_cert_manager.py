"""``spec.tls.certManager`` with a real cert-manager controller on the single-node cluster.

cert-manager's controllers (scripts/cert-manager.sh: the Issuer/ClusterIssuer controllers, the
CertificateRequest approver and CA signer, the Certificate controllers, built from the published
module) run on the host against the cluster, with cert-manager's own CRDs. A ClusterIssuer of kind
CA holds the quorum's CA key pair in namespace ``cert-manager``, which the operator's
namespace-scoped RBAC cannot read: the operator never holds the CA key. A KRaftQuorum ``cm`` in
the operator's namespace asks for its certificates from that issuer; cert-manager issues them, the
pods serve with them (the operator reaches the quorum with its cert-manager credential, a client
pod writes with its own). Then a renewal forced through cert-manager (the Issuing condition set on
the node Certificates, as ``cmctl renew`` does) makes cert-manager issue new certificates, and the
operator rolls the pods one at a time under continuous writes. Last, a follower's disk is replaced
(pod and claim deleted): the new disk gets its own cert-manager certificate naming its new storage
UUID and the recovery swaps the voter; every acknowledged write reads back.
"""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kraftkeeper_operator.k8s.manifests import parse_spec

from quorum.security.pki import identity_from_cert, init_ca
from quorum.timefmt import rfc3339
from testkit.kubeapi import stop_child
from tests.kubelet.conftest import (
    CACHE,
    IMAGE,
    OPERATOR_NS,
    QUORUM_NS,
    REPO,
    NodeCluster,
    _lacking,
    pod_ready,
    quorum_available,
    quorum_pods,
    secret_data,
)
from tests.kubelet.conftest import CLIENT_POD as DEMO_CLIENT
from tests.kubelet.test_e2e import Writer, read_back, voter_uuids

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

NAME = "cm"
ISSUER = "kk-e2e-ca"
CM_NS = "cert-manager"  # the controller's --cluster-resource-namespace: a ClusterIssuer's Secret
CA_SECRET = "kk-e2e-ca-keypair"
CLIENT_POD = "cm-client"
BOOT = f"{NAME}.{QUORUM_NS}.svc:9093"


@pytest.fixture(scope="module")
def cert_manager(node_cluster: NodeCluster) -> Iterator[Path]:
    """cert-manager's CRDs applied and its controller running on the host; its log's path."""
    c = node_cluster
    check = subprocess.run(["bash", str(REPO / "scripts" / "cert-manager.sh"), "check"],
                           capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        _lacking("cert-manager's controller is not built (run scripts/cert-manager.sh install):\n"
                 + check.stdout)
    crds = CACHE / "cert-manager-crds"
    c.kubectl("apply", "--server-side", "-f", str(crds))
    for crd in ("certificates", "certificaterequests", "issuers", "clusterissuers"):
        c.kubectl("wait", "--for=condition=Established", f"crd/{crd}.cert-manager.io", "--timeout=60s")
    if c.get_json("namespace", CM_NS) is None:
        c.kubectl("create", "namespace", CM_NS)
    log = Path(tempfile.mkdtemp(prefix="kk-cert-manager-")) / "controller.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(CACHE / "bin" / "cert-manager-controller"), "--kubeconfig",
                                 str(c.kubeconfig), "--cluster-resource-namespace", CM_NS],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        yield log
    finally:
        stop_child(proc)
        print("cert-manager controller log (tail):\n" + log.read_text(errors="replace")[-3000:])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _ready(obj: dict[str, Any] | None) -> bool:
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conds)


def _pods(c: NodeCluster) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in quorum_pods(c, instance=NAME)}


def _serial(c: NodeCluster, i: int) -> int | None:
    d = secret_data(c, f"{NAME}-node-{i}-tls") or {}
    return x509.load_pem_x509_certificate(d["tls.crt"]).serial_number if d.get("tls.crt") else None


def _issuer_and_quorum(c: NodeCluster, tmp: Path) -> x509.Certificate:
    cid = parse_spec({"metadata": {"name": NAME, "namespace": QUORUM_NS}, "spec": {}}).cluster_id
    ca = init_ca(tmp / "ca", cid)
    c.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": CA_SECRET, "namespace": CM_NS},
        "data": {"tls.crt": _b64(ca.cert_file.read_bytes()),
                 "tls.key": _b64((tmp / "ca" / "ca.key").read_bytes())},
    }))
    c.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer", "metadata": {"name": ISSUER},
        "spec": {"ca": {"secretName": CA_SECRET}},
    }))
    c.kubectl("apply", "-n", QUORUM_NS, "-f", "-", stdin=json.dumps({
        "apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum", "metadata": {"name": NAME},
        "spec": {
            "voters": 3, "image": IMAGE, "imagePullPolicy": "Never", "storage": {"size": "128Mi"},
            "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            "tls": {"certManager": {"issuerRef": {"name": ISSUER, "kind": "ClusterIssuer"}}},
        },
    }))
    return x509.load_pem_x509_certificate(ca.cert_file.read_bytes())


def _client_pod(c: NodeCluster) -> None:
    """A client pod with the quorum's cert-manager client credential and a client.json for it."""
    c.kubectl("apply", "-n", QUORUM_NS, "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{CLIENT_POD}-config"},
        "data": {"client.json": json.dumps({"ca_file": "ca.crt", "cert_file": "tls.crt",
                                            "key_file": "tls.key"})},
    }))
    c.kubectl("apply", "-n", QUORUM_NS, "-f", "-", stdin=json.dumps(_client_pod_template()))
    c.kubectl("wait", "-n", QUORUM_NS, "--for=condition=Ready", f"pod/{CLIENT_POD}", "--timeout=120s")


def _client_pod_template() -> dict[str, Any]:
    pod: dict[str, Any] = json.loads(json.dumps(DEMO_CLIENT))  # a deep copy
    pod["metadata"] = {"name": CLIENT_POD, "labels": {"app": "kk-e2e-client", "kraftkeeper.io/client": NAME}}
    pod["spec"]["volumes"] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "client", "projected": {"sources": [
            {"secret": {"name": f"{NAME}-client-tls"}},
            {"configMap": {"name": f"{CLIENT_POD}-config"}},
        ]}},
    ]
    return pod


def _cleanup(c: NodeCluster) -> None:
    c.kubectl("delete", "-n", QUORUM_NS, f"pod/{CLIENT_POD}", f"configmap/{CLIENT_POD}-config",
              "--ignore-not-found", "--wait=false", check=False)
    c.kubectl("delete", "kraftquorum", NAME, "-n", QUORUM_NS, "--ignore-not-found", "--wait=true",
              "--timeout=120s", check=False)
    # whenDeleted: Retain keeps the claims (manifests.py): this test's are removed by hand.
    c.kubectl("delete", "pvc", "-n", QUORUM_NS, "-l", f"app.kubernetes.io/instance={NAME}",
              "--ignore-not-found", "--wait=false", check=False)
    c.kubectl("delete", "clusterissuer", ISSUER, "--ignore-not-found", check=False)
    c.kubectl("delete", "secret", CA_SECRET, "-n", CM_NS, "--ignore-not-found", check=False)


def _spare_disk(c: NodeCluster, i: int) -> str | None:
    """The storage UUID of replica ``i``'s spare as cert-manager issued it (None: not yet)."""
    d = secret_data(c, f"{NAME}-node-{i}-spare-tls") or {}
    return identity_from_cert(x509.load_pem_x509_certificate(d["tls.crt"])).storage_uuid if d else None


def _replace_a_disk(c: NodeCluster, st: dict[str, Any], log: Callable[[], str]) -> None:
    """A follower's pod deleted with its claim (a replaced disk): the new pod formats its empty
    volume with the UUID of its spare Certificate (``NAME-node-<id>-spare``, issued by
    cert-manager), serves it at its first start, the operator puts that UUID in the node
    Certificate's ``uris`` and asks cert-manager for the next spare, and the KIP-856 recovery swaps
    the voter without a second start of the pod (docs/operator.md "Certificates bound to the
    disk")."""
    i = next(v for v in sorted(voter_uuids(st)) if v != st["leaderId"])
    old, done = voter_uuids(st)[i], len(st.get("recoveries") or [])
    pod = f"{NAME}-{i - 1}"

    def settled() -> str | None:
        """The spare cert-manager issued for the spare Certificate as it is now."""
        uris = c.get_json("certificate", f"{NAME}-node-{i}-spare", "-n", QUORUM_NS)["spec"]["uris"]
        disk = _spare_disk(c, i)
        return disk if disk is not None and any(u.endswith(f"?storage={disk}") for u in uris) else None

    spare = c.wait_for(f"replica {i}'s spare issued", settled, timeout=180, context=log)
    old_uid = c.get_json("pod", pod, "-n", QUORUM_NS)["metadata"]["uid"]
    c.kubectl("delete", "pvc", f"data-{pod}", "-n", QUORUM_NS, "--wait=false")
    c.kubectl("delete", "pod", pod, "-n", QUORUM_NS, "--wait=false")
    seen: dict[str, int] = {}  # the new pod(s): uid -> the node container's restart count

    def recovered() -> dict[str, Any] | None:
        p = _pods(c).get(pod)
        if p is not None and p["metadata"]["uid"] != old_uid:
            node = [s for s in (p.get("status") or {}).get("containerStatuses") or [] if s["name"] == "node"]
            seen[p["metadata"]["uid"]] = max([seen.get(p["metadata"]["uid"], 0),
                                              *(int(s.get("restartCount") or 0) for s in node)])
        s = quorum_available(c, name=NAME)
        recs = (s or {}).get("recoveries") or []
        ok = s is not None and len(recs) > done and recs[-1].get("result") == "Succeeded"
        return s if ok and voter_uuids(s).get(i) not in (None, old) else None

    final = c.wait_for(f"the recovery of replica {i} on a new disk", recovered, timeout=300, interval=0.5,
                       context=log)
    new = voter_uuids(final)[i]
    assert new == spare, (new, spare)
    recovered()
    assert len(seen) == 1 and list(seen.values()) == [0], f"the new pod started more than once: {seen}"
    assert {k: u for k, u in voter_uuids(final).items() if k != i} == \
        {k: u for k, u in voter_uuids(st).items() if k != i}
    uris = c.get_json("certificate", f"{NAME}-node-{i}", "-n", QUORUM_NS)["spec"]["uris"]
    assert any(u.endswith(f"/replica/{i}?storage={new}") for u in uris), (new, uris)

    def issued() -> bool:
        d = secret_data(c, f"{NAME}-node-{i}-tls") or {}
        return identity_from_cert(x509.load_pem_x509_certificate(d["tls.crt"])).storage_uuid == new

    c.wait_for(f"cert-manager's certificate of replica {i}'s new disk", issued, timeout=120, context=log)
    c.wait_for(f"the next spare of replica {i}", lambda: _spare_disk(c, i) not in (None, new, spare),
               timeout=120, context=log)
    events = c.get_json("events", "-n", QUORUM_NS, "--field-selector",
                        f"involvedObject.kind=KRaftQuorum,involvedObject.name={NAME}")["items"]
    told = [e.get("message", "") for e in events if e["reason"] == "CertificateForNewDisk"]
    assert not told, told  # no second start of the pod for a certificate


def test_cert_manager_issues_and_renews_the_quorum_certificates(
    node_cluster: NodeCluster, quorum_ns: str, cert_manager: Path, tmp_path: Path
) -> None:
    c = node_cluster
    # The operator's ServiceAccount (namespace-scoped RBAC) cannot read the CA key pair.
    sa = f"system:serviceaccount:{OPERATOR_NS}:kraftkeeper"
    can = c.kubectl("auth", "can-i", "get", f"secret/{CA_SECRET}", "-n", CM_NS, "--as", sa, check=False)
    assert can.stdout.strip() == "no", can.stdout + can.stderr
    t0 = time.monotonic()
    try:
        ca = _issuer_and_quorum(c, tmp_path)

        def log() -> str:
            return cert_manager.read_text(errors="replace")[-3000:] + "\n" + c.describe()

        c.wait_for(f"ClusterIssuer {ISSUER} Ready", lambda: _ready(c.get_json("clusterissuer", ISSUER)),
                   timeout=120, context=log)
        names = [f"{NAME}-node-1", f"{NAME}-node-2", f"{NAME}-node-3", f"{NAME}-operator", f"{NAME}-client"]
        c.wait_for("every Certificate issued (Ready)",
                   lambda: all(_ready(c.get_json("certificate", n, "-n", QUORUM_NS)) for n in names),
                   timeout=180, context=log)
        issued = time.monotonic() - t0
        for i in (1, 2, 3):
            d = secret_data(c, f"{NAME}-node-{i}-tls")
            assert d is not None
            cert = x509.load_pem_x509_certificate(d["tls.crt"])
            cert.verify_directly_issued_by(ca)  # signed by cert-manager with the ClusterIssuer's CA
            assert identity_from_cert(cert).replica_id == i
            assert "ca.key" not in d and x509.load_pem_x509_certificate(d["ca.crt"]) == ca
        # No CA of the operator's own in CertManager mode.
        assert secret_data(c, f"{NAME}-ca") is None and secret_data(c, f"{NAME}-tls") is None
        st = c.wait_for(f"KRaftQuorum {NAME} Available over cert-manager's certificates",
                        lambda: quorum_available(c, name=NAME), timeout=300, context=log)
        available = time.monotonic() - t0
        before = voter_uuids(st)
        _client_pod(c)
        writer = Writer(c, "cmrenew", pod=CLIENT_POD, bootstrap=BOOT)
        writer.wait_acked(0, "the writer's first acknowledged write")

        # Renewal forced through cert-manager, as `cmctl renew` does: the Issuing condition.
        serials = {i: _serial(c, i) for i in (1, 2, 3)}
        old_uids = {n: p["metadata"]["uid"] for n, p in _pods(c).items()}
        t1 = time.monotonic()
        now = rfc3339()
        issuing = {"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
                   "message": "renewal forced by the test", "lastTransitionTime": now}
        for i in (1, 2, 3):
            c.kubectl("patch", "certificate", f"{NAME}-node-{i}", "-n", QUORUM_NS, "--subresource=status",
                      "--type=json",
                      "-p", json.dumps([{"op": "add", "path": "/status/conditions/-", "value": issuing}]))
        most_unready, restarted = 0, []

        def renewed_and_rolled() -> bool:
            nonlocal most_unready
            pods = _pods(c)
            most_unready = max(most_unready, 3 - len([p for p in pods.values() if pod_ready(p)]))
            for n, p in pods.items():
                if p["metadata"]["uid"] != old_uids.get(n) and n not in restarted:
                    restarted.append(n)
            new = all(_serial(c, i) not in (None, serials[i]) for i in (1, 2, 3))
            return (new and len(restarted) == 3 and all(pod_ready(p) for p in pods.values())
                    and quorum_available(c, name=NAME) is not None)

        c.wait_for("cert-manager renewed every node certificate and every pod rolled", renewed_and_rolled,
                   timeout=600, interval=0.5, context=lambda: f"restarted {restarted}\n{log()}")
        renewal = time.monotonic() - t1
        assert most_unready <= 1, f"{most_unready} pods were unready at once during the renewal"
        final = quorum_available(c, name=NAME)
        assert final is not None and voter_uuids(final) == before, "a renewal restart keeps every identity"
        writer.wait_acked(len(writer.acked()), "a write acknowledged after the renewal")
        t2 = time.monotonic()
        _replace_a_disk(c, final, log)
        replaced = time.monotonic() - t2
        writer.wait_acked(len(writer.acked()), "a write acknowledged after the disk replacement")
        read_back(c, writer.stop(), pod=CLIENT_POD, bootstrap=BOOT)
        print(f"cert-manager: certificates issued in {issued:.1f} s, quorum Available in {available:.1f} s, "
              f"forced renewal rolled 3 pods in {renewal:.1f} s (restart order {restarted}), "
              f"a replaced disk recovered with its own certificate in {replaced:.1f} s")
    finally:
        _cleanup(c)

"""``spec.tls.certManager`` against a real cert-manager controller (scripts/cert-manager.sh) on the
test kube-apiserver: issuance needs no kubelet. A ClusterIssuer of kind CA keeps the quorum's CA
key pair in namespace ``cert-manager``, outside the operator's namespace; the operator asks for its
Certificates, cert-manager issues them (signed by that CA, with the replica URI SANs), the
operator takes its own credential from its Secret and configures the quorum, and it never creates
or reads a CA. A forced renewal (the ``Issuing`` condition, as ``cmctl renew`` sets it) makes
cert-manager issue a new node certificate. Pods serving with the certificates, and the rolling
restart, are tests/kubelet/test_cert_manager.py."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kraftkeeper_operator.k8s.manifests import parse_spec

from quorum.security.pki import identity_from_cert, init_ca
from quorum.timefmt import rfc3339
from testkit.kubeapi import KubeEnv, cache_bin, stop_child
from tests.k8s.operator_support import KQ, Operator, create, get, kq

pytestmark = pytest.mark.k8s

CONTROLLER = cache_bin() / "cert-manager-controller"
CRDS = cache_bin().parent / "cert-manager-crds"
CM_NS = "cert-manager"
ISSUER = "kk-real-ca"


def _kubectl(kube: KubeEnv, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run([str(kube.bin_dir / "kubectl"), "--kubeconfig", str(kube.kubeconfig), *args],
                          capture_output=True, text=True, timeout=120, input=stdin)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@pytest.fixture
def cert_manager(kube: KubeEnv, tmp_path: Path) -> Iterator[Path]:
    if not CONTROLLER.exists() or not (CRDS / "version").exists():
        pytest.skip(f"cert-manager's controller is not built ({CONTROLLER}; scripts/cert-manager.sh install)")
    # The real CRDs replace the stand-in of test_operator_tls.py if a test applied it; both are
    # removed again at the end, so the stand-in's test finds no other.
    _kubectl(kube, "apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    for crd in ("certificates", "certificaterequests", "issuers", "clusterissuers"):
        _kubectl(kube, "wait", "--for=condition=Established", f"crd/{crd}.cert-manager.io", "--timeout=60s")
    if kube.request("GET", f"/api/v1/namespaces/{CM_NS}")[0] == 404:
        st, body = kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": CM_NS}})
        assert st == 201, body
    log = tmp_path / "cert-manager.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(CONTROLLER), "--kubeconfig", str(kube.kubeconfig),
                                 "--cluster-resource-namespace", CM_NS],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        yield log
    finally:
        stop_child(proc)
        print("cert-manager log (tail):\n" + log.read_text(errors="replace")[-3000:])
        _kubectl(kube, "delete", "--ignore-not-found", "--wait=true", "-f", str(CRDS))


def _ready(obj: dict[str, Any] | None) -> bool:
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _secret(kube: KubeEnv, ns: str, name: str) -> dict[str, bytes] | None:
    obj = get(kube, f"/api/v1/namespaces/{ns}/secrets/{name}")
    return None if obj is None else {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def test_real_cert_manager_issues_and_renews_what_the_operator_asks_for(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, cert_manager: Path, tmp_path: Path
) -> None:
    ns, name = namespace, "real"
    cid = parse_spec({"metadata": {"name": name, "namespace": ns}, "spec": {}}).cluster_id
    ca = init_ca(tmp_path / "ca", cid)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_file.read_bytes())
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
              "metadata": {"name": "kk-real-ca-keypair", "namespace": CM_NS},
              "data": {"tls.crt": base64.b64encode(ca.cert_file.read_bytes()).decode(),
                       "tls.key": base64.b64encode((tmp_path / "ca" / "ca.key").read_bytes()).decode()}}
    _kubectl(kube, "apply", "-f", "-", stdin=json.dumps(secret))
    _kubectl(kube, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer", "metadata": {"name": ISSUER},
        "spec": {"ca": {"secretName": "kk-real-ca-keypair"}}}))
    op = Operator(kube, ns, tmp_path / "operator.log")
    t0 = time.monotonic()
    try:
        def log() -> str:
            return cert_manager.read_text(errors="replace")[-3000:] + "\n" + op.tail()

        issuer = f"/apis/cert-manager.io/v1/clusterissuers/{ISSUER}"
        kube.wait_for(f"ClusterIssuer {ISSUER} Ready", lambda: _ready(get(kube, issuer)), timeout=60)
        ref = {"name": ISSUER, "kind": "ClusterIssuer"}
        create(kube, ns, kq(name, 3, tls={"certManager": {"issuerRef": ref}}))
        certs = f"/apis/cert-manager.io/v1/namespaces/{ns}/certificates"
        names = [f"{name}-node-1", f"{name}-node-2", f"{name}-node-3", f"{name}-operator", f"{name}-client"]
        try:
            kube.wait_for("cert-manager issued all 5 Certificates",
                          lambda: all(_ready(get(kube, f"{certs}/{n}")) for n in names), timeout=120)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log()}") from None
        issued = time.monotonic() - t0
        for i in (1, 2, 3):
            d = _secret(kube, ns, f"{name}-node-{i}-tls")
            assert d is not None and "ca.key" not in d
            cert = x509.load_pem_x509_certificate(d["tls.crt"])
            cert.verify_directly_issued_by(ca_cert)
            assert identity_from_cert(cert).replica_id == i
            assert x509.load_pem_x509_certificate(d["ca.crt"]) == ca_cert
        # With its cert-manager credential the operator configures the quorum; it made no CA.
        kube.wait_for("the quorum configured",
                      lambda: ((get(kube, KQ.format(ns=ns) + f"/{name}") or {}).get("status") or {})
                      .get("observedGeneration") == 1, timeout=60)
        assert _secret(kube, ns, f"{name}-ca") is None and _secret(kube, ns, f"{name}-tls") is None
        # A renewal forced through cert-manager: a new certificate, same identity.
        old = x509.load_pem_x509_certificate((_secret(kube, ns, f"{name}-node-2-tls") or {})["tls.crt"])
        now = rfc3339()
        issuing = {"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
                   "message": "renewal forced by the test", "lastTransitionTime": now}
        t1 = time.monotonic()
        _kubectl(kube, "patch", "certificate", f"{name}-node-2", "-n", ns, "--subresource=status",
                 "--type=json",
                 "-p", json.dumps([{"op": "add", "path": "/status/conditions/-", "value": issuing}]))

        def renewed() -> x509.Certificate | None:
            d = _secret(kube, ns, f"{name}-node-2-tls") or {}
            c = x509.load_pem_x509_certificate(d["tls.crt"]) if d.get("tls.crt") else None
            return c if c is not None and c.serial_number != old.serial_number else None

        new = kube.wait_for("cert-manager renewed node 2's certificate", renewed, timeout=120)
        new.verify_directly_issued_by(ca_cert)
        assert identity_from_cert(new).replica_id == 2
        print(f"real cert-manager: 5 certificates issued in {issued:.1f} s, "
              f"a forced renewal in {time.monotonic() - t1:.1f} s")
        assert op.proc.poll() is None, op.tail()
    finally:
        op.stop()
        kube.request("DELETE", f"/apis/cert-manager.io/v1/clusterissuers/{ISSUER}")

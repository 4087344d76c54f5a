"""Secure by default on Kubernetes, against a real kube-apiserver: the operator makes a
CA per KRaftQuorum, node certificates for every replica (their DNS names and the replica URI
SAN), a client Secret for applications, a NetworkPolicy, and pods that start with TLS; with
``spec.tls.certManager`` it makes cert-manager Certificates instead and never a CA; bad tls specs
are refused by the schema or reported in status, naming the field."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import http.client
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kraftkeeper_operator.k8s.manifests import parse_spec

from quorum.localports import free_port_range
from quorum.security.clientconfig import parse_client_config
from quorum.security.identity import parse_identity_uri
from quorum.security.pki import identity_from_cert, init_ca, issue_client, peer_hostname
from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import KQ, Operator, create, get, kq
from tests.operator.operator_nodes import LocalCluster, engine_missing
from tests.operator.test_local_tls import _Writer

pytestmark = pytest.mark.k8s

CM_CRD = Path(__file__).with_name("certmanager-certificate-crd.yaml")
CM_NAME = "certificates.cert-manager.io"
CERTS = "/apis/cert-manager.io/v1/namespaces/{ns}/certificates"


@pytest.fixture
def operator(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> Iterator[Operator]:
    op = Operator(kube, namespace, tmp_path / "operator.log")
    yield op
    op.stop()
    print("operator log:\n" + op.tail())


@pytest.fixture
def cert_manager_crd(kube: KubeEnv) -> None:
    st, body = kube.apply(yaml.safe_load(CM_CRD.read_text()))
    assert st in (200, 201), body

    def established() -> bool:
        _, crd = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CM_NAME}")
        conds = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    kube.wait_for("the Certificate CRD", established, timeout=60)


def secret_data(kube: KubeEnv, ns: str, name: str) -> dict[str, bytes] | None:
    s = get(kube, f"/api/v1/namespaces/{ns}/secrets/{name}")
    if s is None:
        return None
    return {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _dns(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(san.get_values_for_type(x509.DNSName))


def test_operator_mode_by_default_makes_ca_node_and_client_secrets(
    kube: KubeEnv, namespace: str, operator: Operator
) -> None:
    ns = namespace
    obj = create(kube, ns, kq("t1", 3))
    uid = obj["metadata"]["uid"]
    cid = parse_spec({"metadata": {"name": "t1", "namespace": ns}, "spec": {}}).cluster_id
    ca_data = kube.wait_for("Secret t1-ca", lambda: secret_data(kube, ns, "t1-ca"), timeout=60)
    ca = _cert(ca_data["ca.crt"])
    nodes = kube.wait_for("Secret t1-tls", lambda: secret_data(kube, ns, "t1-tls"), timeout=60)
    assert nodes["ca.crt"] == ca_data["ca.crt"]
    for i in (1, 2, 3):
        cert = _cert(nodes[f"node-{i}.crt"])
        cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
        ident = identity_from_cert(cert)
        assert (ident.cluster_id, ident.replica_id) == (cid, i)
        dns = _dns(cert)
        assert f"t1-{i - 1}.t1-headless.{ns}.svc" in dns and f"t1.{ns}.svc" in dns
        assert peer_hostname(cid, i) in dns
        assert nodes[f"node-{i}.key"].startswith(b"-----BEGIN PRIVATE KEY-----")
    client = kube.wait_for("Secret t1-client", lambda: secret_data(kube, ns, "t1-client"), timeout=60)
    ident = identity_from_cert(_cert(client["tls.crt"]))
    assert ident.role == "readwrite" and ident.cluster_id == cid  # applications: KV only, no admin
    cfg = parse_client_config(client["client.json"], "t1-client/client.json", "/etc/kk")
    assert cfg.cert_file == Path("/etc/kk/tls.crt") and cfg.ca_file == Path("/etc/kk/ca.crt")
    sec = get(kube, f"/api/v1/namespaces/{ns}/secrets/t1-tls")
    assert sec is not None and sec["metadata"]["ownerReferences"][0]["uid"] == uid
    # The pods start with TLS: their own certificate only, in memory; HTTPS probes.
    sts = kube.wait_for(
        "StatefulSet t1", lambda: get(kube, f"/apis/apps/v1/namespaces/{ns}/statefulsets/t1"), timeout=60
    )
    pod = sts["spec"]["template"]["spec"]
    node = pod["containers"][0]
    start = node["command"][-1]
    assert "--insecure" not in start and "--cert /etc/kraftkeeper/tls/node.crt" in start
    tls_mounts = [m for m in node["volumeMounts"] if m["name"].startswith("tls")]
    assert [(m["name"], m["subPathExpr"]) for m in tls_mounts] == [("tls", "$(POD_NAME)")]  # its own dir
    assert node["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert "initContainers" not in pod
    vols = {v["name"]: v for v in pod["volumes"]}
    secret_src = vols["tls"]["projected"]["sources"][0]["secret"]
    assert secret_src["name"] == "t1-tls"
    assert {"key": "node-2.key", "path": "t1-1/node.key"} in secret_src["items"]
    # The NetworkPolicy: peers, the operator, and the default client selector.
    np = kube.wait_for(
        "NetworkPolicy t1",
        lambda: get(kube, f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/t1"),
        timeout=60,
    )
    rules = np["spec"]["ingress"]
    assert np["spec"]["policyTypes"] == ["Ingress"]
    assert rules[0]["from"] == [{"podSelector": {"matchLabels": sts["spec"]["selector"]["matchLabels"]}}]
    assert rules[1]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert rules[2]["from"] == [{"podSelector": {"matchLabels": {"kraftkeeper.io/client": "t1"}}}]
    assert all(r["ports"] == [{"protocol": "TCP", "port": 9093}] for r in rules)
    # Scaling up: the CA stays, existing certificates stay, the new replicas get theirs.
    st, body = kube.request(
        "PATCH",
        KQ.format(ns=ns) + "/t1",
        {"spec": {"voters": 5}},
        content_type="application/merge-patch+json",
    )
    assert st == 200, body
    more = kube.wait_for(
        "certificates of replicas 4 and 5",
        lambda: (d := secret_data(kube, ns, "t1-tls")) and "node-5.crt" in d and d,
        timeout=60,
    )
    assert more["node-1.crt"] == nodes["node-1.crt"]
    assert secret_data(kube, ns, "t1-ca") == ca_data
    assert identity_from_cert(_cert(more["node-4.crt"])).replica_id == 4
    # Deleting the resource removes the Secrets and the NetworkPolicy (PVCs stay, manifests.py).
    assert kube.request("DELETE", KQ.format(ns=ns) + "/t1")[0] == 200
    kube.wait_for("the Secrets gone", lambda: secret_data(kube, ns, "t1-ca") is None, timeout=60)
    assert secret_data(kube, ns, "t1-tls") is None and secret_data(kube, ns, "t1-client") is None
    assert get(kube, f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/t1") is None
    assert operator.proc.poll() is None, operator.tail()


def test_cert_manager_issuer_gets_certificates_and_no_ca(
    kube: KubeEnv, namespace: str, operator: Operator, cert_manager_crd: None, tmp_path: Path
) -> None:
    ns = namespace
    spec = {
        "tls": {
            "certManager": {"issuerRef": {"name": "quorum-ca", "kind": "ClusterIssuer"}},
            "validityDays": 30,
            "renewBeforeDays": 10,
        },
        "clientSelector": [{"namespaceSelector": {"matchLabels": {"team": "payments"}}}],
    }
    create(kube, ns, kq("cm", 3, **spec))
    cid = parse_spec({"metadata": {"name": "cm", "namespace": ns}, "spec": {}}).cluster_id
    path = CERTS.format(ns=ns)

    def certs() -> dict[str, Any] | None:
        st, body = kube.request("GET", path)
        items = {c["metadata"]["name"]: c["spec"] for c in body.get("items") or []} if st == 200 else {}
        return items if len(items) == 5 else None

    got = kube.wait_for("5 Certificates", certs, timeout=60)
    assert sorted(got) == ["cm-client", "cm-node-1", "cm-node-2", "cm-node-3", "cm-operator"]
    for i in (1, 2, 3):
        c = got[f"cm-node-{i}"]
        # Bound to a disk the operator chose (the pod formats its empty volume with it).
        assert len(c["uris"]) == 1 and c["uris"][0].startswith(f"kraftkeeper://{cid}/replica/{i}?storage=")
        assert parse_identity_uri(c["uris"][0]).storage_uuid is not None
        assert f"cm-{i - 1}.cm-headless.{ns}.svc" in c["dnsNames"] and peer_hostname(cid, i) in c["dnsNames"]
        assert c["issuerRef"] == {"name": "quorum-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
        assert c["secretName"] == f"cm-node-{i}-tls" and "server auth" in c["usages"]
        assert c["duration"] == "720h" and c["renewBefore"] == "240h"
    assert got["cm-operator"]["uris"] == [f"kraftkeeper://{cid}/client/operator?role=admin"]
    assert got["cm-client"]["uris"] == [f"kraftkeeper://{cid}/client/app?role=readwrite"]
    assert "server auth" not in got["cm-client"]["usages"]
    # The operator never made or saw a CA.
    assert secret_data(kube, ns, "cm-ca") is None and secret_data(kube, ns, "cm-tls") is None
    sts = kube.wait_for(
        "StatefulSet cm", lambda: get(kube, f"/apis/apps/v1/namespaces/{ns}/statefulsets/cm"), timeout=60
    )
    vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    sources = vols["tls"]["projected"]["sources"]
    assert sources[0]["secret"]["name"] == "cm-node-1-tls" and sources[0]["secret"]["optional"] is True
    assert {"key": "tls.key", "path": "cm-0/node.key"} in sources[0]["secret"]["items"]
    np = get(kube, f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/cm")
    assert np is not None
    assert np["spec"]["ingress"][2]["from"] == [{"namespaceSelector": {"matchLabels": {"team": "payments"}}}]
    # Until cert-manager issued the operator's credential, the resource is not configured ...
    kq_path = KQ.format(ns=ns) + "/cm"
    assert ((get(kube, kq_path) or {}).get("status") or {}).get("observedGeneration") is None
    # ... and once the Secret is there (issued here by hand, as cert-manager would), it is.
    ca = init_ca(tmp_path / "ca", cid)
    crt, key = issue_client(ca, "operator", "admin")
    data = {"ca.crt": ca.cert_file.read_bytes(), "tls.crt": crt.read_bytes(), "tls.key": key.read_bytes()}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "cm-operator-tls", "namespace": ns},
        "type": "kubernetes.io/tls",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
    st, body = kube.request("POST", f"/api/v1/namespaces/{ns}/secrets", secret)
    assert st == 201, body
    kube.wait_for(
        "the quorum configured",
        lambda: ((get(kube, kq_path) or {}).get("status") or {}).get("observedGeneration") == 1,
        timeout=60,
    )
    assert secret_data(kube, ns, "cm-ca") is None
    assert operator.proc.poll() is None, operator.tail()


@pytest.mark.parametrize(
    ("tls", "field"),
    [
        ({"mode": "Bogus"}, "spec.tls.mode"),
        ({"mode": "Operator", "certManager": {"issuerRef": {"name": "x"}}}, "spec.tls"),
        ({"certManager": {"issuerRef": {"name": "x", "kind": "Vault"}}}, "issuerRef.kind"),
        ({"certManager": {}}, "issuerRef"),
        ({"validityDays": 0}, "spec.tls.validityDays"),
    ],
)
def test_bad_tls_specs_are_refused_by_the_schema(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tls: dict[str, Any], field: str
) -> None:
    st, body = kube.request("POST", KQ.format(ns=namespace), kq("bad", 3, tls=tls))
    assert st == 422 and field in json.dumps(body), body


def test_bad_tls_specs_the_schema_cannot_see_are_reported(
    kube: KubeEnv, namespace: str, operator: Operator
) -> None:
    ns = namespace
    create(kube, ns, kq("cmless", 3, tls={"mode": "CertManager"}))
    create(kube, ns, kq("renew", 3, tls={"validityDays": 10, "renewBeforeDays": 10}))
    # A path-like field in tls is not part of the schema: the API server drops it, so no spec
    # can make the operator read or write a file of its choosing.
    create(kube, ns, kq("pathy", 3, tls={"mode": "Disabled", "caFile": "/etc/shadow"}))
    assert "caFile" not in ((get(kube, KQ.format(ns=ns) + "/pathy") or {})["spec"]["tls"])

    def failed(name: str) -> Any:
        st = (get(kube, KQ.format(ns=ns) + f"/{name}") or {}).get("status") or {}
        return st if st.get("phase") == "Failed" else None

    for name, field in (("cmless", "spec.tls.certManager"), ("renew", "spec.tls.renewBeforeDays")):
        st = kube.wait_for(f"{name} Failed", lambda n=name: failed(n), timeout=60)
        cond = next(c for c in st["conditions"] if c["type"] == "Available")
        assert cond["reason"] == "InvalidSpec" and field in cond["message"], cond
        assert kube.request("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/{name}")[0] == 404
        assert secret_data(kube, ns, f"{name}-ca") is None
    assert operator.proc.poll() is None, operator.tail()


@pytest.mark.slow
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_operator_reaches_a_tls_quorum_and_renews_certificates_under_writes(
    kube: KubeEnv,
    kraftquorum_crd: dict[str, Any],
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real node processes stand in for the pods (no kubelet here), serving TLS with certificates
    of the quorum's CA from Secret NAME-ca: the operator, holding only its in-memory admin
    credential, describes the quorum and publishes its voters; a client without a credential is
    refused. With a "day" of 10 s (test hook) certificates live 30 s and are renewed 20 s before
    expiry (short: the test waits for the first credential to expire): every node certificate
    in NAME-tls is renewed, and the operator renews its own credential and still reaches the
    quorum after the first one expired, while a client writes; every acknowledged write reads
    back. (No pod restarts here: nothing runs pods.)"""
    ns, name = namespace, "tq"
    monkeypatch.setenv("KRAFTKEEPER_TLS_DAY_SECONDS", "10")
    q = parse_spec({"metadata": {"name": name, "namespace": ns}, "spec": {"voters": 3}})
    base = free_port_range(4)
    overrides = ",".join(f"{ns}/{name}/{k}=127.0.0.1:{base + k + 1}" for k in range(3))
    op = Operator(kube, ns, tmp_path / "operator.log", overrides)
    nodes: LocalCluster | None = None
    writer: _Writer | None = None
    try:
        create(kube, ns, kq(name, 3, tls={"validityDays": 3, "renewBeforeDays": 2}))
        ca = kube.wait_for("Secret tq-ca", lambda: secret_data(kube, ns, "tq-ca"), timeout=60)
        tls_dir = tmp_path / "nodes" / "tls"
        tls_dir.mkdir(parents=True)
        (tls_dir / "ca.crt").write_bytes(ca["ca.crt"])
        (tls_dir / "ca.key").write_bytes(ca["ca.key"])
        nodes = LocalCluster(
            tmp_path / "nodes", 3, extra=["--no-recovery"], cluster_id=q.cluster_id, base_port=base
        )
        kq_path = KQ.format(ns=ns) + f"/{name}"

        def running() -> dict[str, Any] | None:
            st = (get(kube, kq_path) or {}).get("status") or {}
            ok = st.get("phase") == "Running" and len(st.get("voters") or []) == 3
            return st if ok and all(v.get("uuid") for v in st["voters"]) else None

        st = kube.wait_for("the operator sees 3 voters over TLS", running, timeout=120)
        assert st["leaderId"] in (1, 2, 3)
        # Without a credential: plaintext gets no HTTP answer, https without a certificate a 401.
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{base + 1}/v1/quorum/describe", timeout=5)
        ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"https://127.0.0.1:{base + 1}/v1/quorum/describe", timeout=5, context=ctx)
        assert e.value.code == 401
        # Renewal while a client writes.
        first = kube.wait_for("Secret tq-tls", lambda: secret_data(kube, ns, "tq-tls"), timeout=30)
        serials = {i: _cert(first[f"node-{i}.crt"]).serial_number for i in (1, 2, 3)}
        first_expiry = _cert(first["node-1.crt"]).not_valid_after_utc  # the admin's: issued alike
        writer = _Writer(nodes)
        writer.start()

        def renewed() -> dict[str, bytes] | None:
            d = secret_data(kube, ns, "tq-tls") or {}
            new = {i: _cert(d[f"node-{i}.crt"]).serial_number for i in (1, 2, 3) if f"node-{i}.crt" in d}
            return d if all(new.get(i, serials[i]) != serials[i] for i in (1, 2, 3)) else None

        kube.wait_for("every node certificate renewed", renewed, timeout=120)
        # The operator still reaches the quorum after its first credential expired.
        kube.wait_for(
            "the first certificates expired",
            lambda: dt.datetime.now(dt.UTC) > first_expiry + dt.timedelta(seconds=5),
            timeout=120,
        )
        before = int(((get(kube, kq_path) or {}).get("status") or {}).get("leaderEpoch") or 0)
        assert nodes.kk("quorum", "describe", "--bootstrap", nodes.bootstrap()).returncode == 0
        assert "admin credential was renewed" in op.log.read_text(errors="replace"), op.tail()
        kube.wait_for("status still Running", running, timeout=60)
        assert int((get(kube, kq_path) or {})["status"]["leaderEpoch"]) >= before
        assert len(writer.acked) > 20
        assert op.proc.poll() is None, op.tail()
    finally:
        if writer is not None:
            writer.stop_flag.set()
            writer.join(timeout=60)
            lost = asyncio.run(writer.read_back()) if nodes is not None else []
            assert lost == [], f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}"
        if nodes is not None:
            assert nodes.stop() == 0, nodes.tail()
        op.stop()
        print("operator log:\n" + op.tail())

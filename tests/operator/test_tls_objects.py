"""spec.tls / spec.clientSelector validation, the TLS parts of the pods, the NetworkPolicy, the
cert-manager Certificates, the operator-held CA (tlsspec.py, kubetls.py), and the
one-node-at-a-time renewal rule (rotation.py). No API server here: tests/k8s has those."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kraftkeeper_operator.core import rotation
from kraftkeeper_operator.core.rotation import CertRotator
from kraftkeeper_operator.core.view import QuorumView, Replica
from kraftkeeper_operator.k8s.manifests import SpecError, parse_spec, statefulset
from kraftkeeper_operator.k8s.tlsobjects import (
    OperatorCa,
    cert_due,
    cert_identity,
    certificates,
    network_policy,
)
from kraftkeeper_operator.k8s.tlsspec import TLS_MOUNT, parse_tls

from quorum.security.pki import Identity, identity_from_cert, peer_hostname

OWNER = {"apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum", "name": "q", "uid": "u-1"}


def spec(**s: Any) -> dict[str, Any]:
    return {"metadata": {"name": "q", "namespace": "ns", "uid": "u-1"}, "spec": {"voters": 3, **s}}


@pytest.mark.parametrize(
    ("tls", "field"),
    [
        ("on", "spec.tls: must be an object"),
        ({"mode": "Strict"}, "spec.tls.mode"),
        ({"mode": "CertManager"}, "spec.tls.certManager"),
        ({"mode": "Operator", "certManager": {"issuerRef": {"name": "x"}}}, "spec.tls.certManager"),
        ({"certManager": {"issuerRef": {"name": "Bad Name"}}}, "issuerRef.name"),
        ({"certManager": {"issuerRef": {"name": "x", "kind": "Vault"}}}, "issuerRef.kind"),
        ({"certManager": {"issuerRef": {"name": "x", "secretPath": "/x"}}}, "secretPath"),
        ({"caFile": "/etc/shadow"}, "caFile"),  # nothing in spec.tls names a path
        ({"validityDays": True}, "spec.tls.validityDays"),
        ({"validityDays": 10, "renewBeforeDays": 10}, "spec.tls.renewBeforeDays"),
    ],
)
def test_bad_tls_specs_are_refused_naming_the_field(tls: Any, field: str) -> None:
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        parse_spec(spec(tls=tls))


@pytest.mark.parametrize(
    "sel",
    ["app", [{"podSelector": {"matchLabels": {"a": 1}}}], [{"ipBlock": {"cidr": "0.0.0.0/0"}}], [{}]],
)
def test_bad_client_selectors_are_refused(sel: Any) -> None:
    with pytest.raises(SpecError, match=r"spec\.clientSelector"):
        parse_spec(spec(clientSelector=sel))


def test_tls_defaults_to_the_operator_mode() -> None:
    assert parse_tls(None).mode == "Operator" and parse_tls({}).enabled
    t = parse_tls({"certManager": {"issuerRef": {"name": "ca"}}})
    assert t.cert_manager and t.issuer_kind == "Issuer" and t.issuer_group == "cert-manager.io"
    assert not parse_tls({"mode": "Disabled"}).enabled


def test_pods_start_with_tls_and_only_their_own_key() -> None:
    pod = statefulset(parse_spec(spec()), OWNER, replicas=3, bootstrap_voters=3)["spec"]["template"]["spec"]
    node = pod["containers"][0]
    assert "--insecure" not in node["command"][-1] and f"--ca {TLS_MOUNT}/ca.crt" in node["command"][-1]
    assert {m["name"] for m in node["volumeMounts"]} == {"data", "tmp", "bootstrap", "tls"}  # no Secret
    assert node["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    plain = statefulset(parse_spec(spec(tls={"mode": "Disabled"})), OWNER, replicas=3, bootstrap_voters=3)
    pod2 = plain["spec"]["template"]["spec"]
    assert "--insecure" in pod2["containers"][0]["command"][-1]
    assert "initContainers" not in pod2  # the node container prepares its volume itself


def _project(volume: dict[str, Any], secrets: dict[str, dict[str, str]], root: Path, pod: str) -> None:
    """The kubelet's projection of the ``tls`` volume (secrets by name; an optional one or key
    that is missing is skipped), files at ``root``; the downward-API files hold ``pod``."""
    for src in volume["projected"]["sources"]:
        if "secret" in src:
            data = secrets.get(src["secret"]["name"])
            assert src["secret"]["optional"] is True
            for item in src["secret"]["items"] if data is not None else []:
                if item["key"] in data:
                    (root / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                    (root / item["path"]).write_text(data[item["key"]])
        else:
            for item in src["downwardAPI"]["items"]:
                (root / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (root / item["path"]).write_text(pod)


def _node_check(pod: dict[str, Any], own_dir: Path, ordinal: int) -> subprocess.CompletedProcess[str]:
    """The node container's command up to its TLS check, run as the kubelet would with the pod's
    own directory of the tls volume (subPathExpr $(POD_NAME)) at a local path."""
    script = pod["containers"][0]["command"][2].split("\n")[0].replace(TLS_MOUNT, str(own_dir))
    env = {**os.environ, "POD_NAME": f"q-{ordinal}"}
    return subprocess.run(
        ["sh", "-c", script + "; echo checked"], env=env, capture_output=True, text=True, timeout=30,
        check=False,
    )


@pytest.mark.slow  # runs the node container's shell step
@pytest.mark.parametrize("cert_manager", [False, True])
def test_the_node_container_mounts_only_its_replicas_files(tmp_path: Path, cert_manager: bool) -> None:
    tls = {"certManager": {"issuerRef": {"name": "ca"}}} if cert_manager else {}
    sts = statefulset(parse_spec(spec(tls=tls)), OWNER, replicas=3, bootstrap_voters=3)
    pod = sts["spec"]["template"]["spec"]
    assert "initContainers" not in pod  # no second container start on the pod's path
    node = pod["containers"][0]
    mount = next(m for m in node["volumeMounts"] if m["name"] == "tls")
    assert mount == {"name": "tls", "mountPath": TLS_MOUNT, "subPathExpr": "$(POD_NAME)", "readOnly": True}
    assert any(e["name"] == "POD_NAME" for e in node["env"])  # what subPathExpr expands
    volume = next(v for v in pod["volumes"] if v["name"] == "tls")
    if cert_manager:  # one Secret per replica id; replica 3's not issued yet
        secrets = {
            f"q-node-{i}-tls": {"tls.crt": f"crt{i}", "tls.key": f"key{i}", "ca.crt": "CA"} for i in (1, 2)
        }
    else:
        files = {f"node-{i}.{x}": f"{x}{i}" for i in (1, 2) for x in ("crt", "key")}
        secrets = {"q-tls": {"ca.crt": "CA", **files}}
    root = tmp_path / "vol"
    _project(volume, secrets, root, "q-1")
    # Every pod's directory exists (a sub-path the kubelet had to create would shadow the Secret).
    assert all((root / f"q-{k}").is_dir() for k in range(9))
    own = root / "q-1"  # pod q-1 is replica 2
    assert sorted(f.name for f in own.iterdir()) == ["ca.crt", "node.crt", "node.key", "pod"]
    assert (own / "node.key").read_text() == "key2" and (own / "ca.crt").read_text() == "CA"
    p = _node_check(pod, own, ordinal=1)
    assert p.returncode == 0 and p.stdout.strip().endswith("checked"), p.stderr
    # Replica 3 has no certificate yet: its node container exits before anything else, saying so.
    p = _node_check(pod, root / "q-2", ordinal=2)
    assert p.returncode == 1 and "no certificate for replica 3" in p.stdout and "checked" not in p.stdout


def test_network_policy_admits_peers_the_operator_and_the_selected_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KRAFTKEEPER_OPERATOR_NAMESPACE", "kk-system")
    monkeypatch.setenv("KRAFTKEEPER_OPERATOR_POD_LABELS", "app.kubernetes.io/instance=kk,role=op")
    sel = [{"podSelector": {"matchLabels": {"app": "payments"}}}]
    np = network_policy(parse_spec(spec(clientSelector=sel, ports={"client": 9100})), OWNER)
    peers, op, clients = np["spec"]["ingress"]
    assert peers["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "q"
    assert op["from"] == [
        {
            "podSelector": {"matchLabels": {"app.kubernetes.io/instance": "kk", "role": "op"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kk-system"}},
        }
    ]
    assert clients["from"] == sel
    assert all(r["ports"] == [{"protocol": "TCP", "port": 9100}] for r in (peers, op, clients))
    monkeypatch.setenv("KRAFTKEEPER_OPERATOR_POD_LABELS", "nonsense")
    with pytest.raises(ValueError, match="KRAFTKEEPER_OPERATOR_POD_LABELS"):
        network_policy(parse_spec(spec()), OWNER)


def test_cert_manager_certificates_bind_each_replica() -> None:
    q = parse_spec(spec(tls={"certManager": {"issuerRef": {"name": "ca", "kind": "ClusterIssuer"}}}))
    disk = "5f0c6a3e-2b1d-4c8e-9a7f-0d3b2e1c4a55"
    certs = {c["metadata"]["name"]: c["spec"] for c in certificates(q, OWNER, 3, {2: disk})}
    assert set(certs) == {"q-node-1", "q-node-2", "q-node-3", "q-operator", "q-client"}
    # Replica 2's certificate names its disk; one without a known disk stays unbound.
    assert certs["q-node-2"]["uris"] == [Identity(q.cluster_id, replica_id=2, storage_uuid=disk).uri()]
    assert certs["q-node-2"]["uris"][0].endswith(f"/replica/2?storage={disk}")
    assert certs["q-node-1"]["uris"] == [Identity(q.cluster_id, replica_id=1).uri()]
    assert "q-1.q-headless.ns.svc" in certs["q-node-2"]["dnsNames"]
    assert peer_hostname(q.cluster_id, 2) in certs["q-node-2"]["dnsNames"]
    assert certs["q-operator"]["uris"][0].endswith("/client/operator?role=admin")


def test_operator_ca_issues_node_certificates_and_refuses_another_clusters_ca() -> None:
    q = parse_spec(spec())
    ca = OperatorCa(q)
    try:
        crt, key = ca.node(2)
        cert = x509.load_pem_x509_certificate(crt)
        assert identity_from_cert(cert).replica_id == 2 and key.startswith(b"-----BEGIN")
        assert not cert_due(crt, dt.timedelta(days=30), Identity(q.cluster_id, replica_id=2))
        assert cert_due(crt, dt.timedelta(days=100))  # valid 90 days by default
        assert cert_due(crt, dt.timedelta(0), Identity(q.cluster_id, replica_id=3))  # another replica
        assert cert_due(b"garbage", dt.timedelta(0))
        disk = "5f0c6a3e-2b1d-4c8e-9a7f-0d3b2e1c4a55"
        bound, _ = ca.node(2, disk)
        assert cert_identity(bound) == Identity(q.cluster_id, replica_id=2, storage_uuid=disk)
        # Bound to a disk is no reason to re-issue: the callers compare the binding.
        assert not cert_due(bound, dt.timedelta(0), Identity(q.cluster_id, replica_id=2))
        assert cert_identity(b"garbage") is None
        cfg = ca.admin_config()
        assert cfg.cert_file is not None and identity_from_cert(
            x509.load_pem_x509_certificate(cfg.cert_file.read_bytes())
        ).role == "admin"
        crt_pem, key_pem = ca.ca_pems()
    finally:
        ca.close()
    assert not ca.dir.exists()
    other = parse_spec({**spec(), "metadata": {"name": "other", "namespace": "ns"}})
    with pytest.raises(ValueError, match="not"):
        OperatorCa(other, crt_pem, key_pem)


# ---------------------------------------------------------------------------------------------
# rotation.py


def view(leader: int, lags: dict[int, int], fetched: dict[int, int], **kw: Any) -> QuorumView:
    voters = tuple(
        Replica(i, f"u{i}", lag=lags.get(i, 0), last_fetch_ms=fetched.get(i, 0)) for i in sorted(lags)
    )
    return QuorumView(leader, 5, 100, voters, **kw)


def test_rotation_renews_one_node_at_a_time_and_waits_for_it_to_return() -> None:
    due = {1, 2, 3}
    restarted: list[int] = []

    async def get_due() -> list[int]:
        return sorted(due)

    async def renew(i: int) -> None:
        due.discard(i)

    async def restart(i: int) -> None:
        restarted.append(i)

    r = CertRotator(get_due, renew, restart, lambda: [1, 2, 3], max_lag=10, fresh_ms=3000)

    async def run() -> None:
        import time

        now = int(time.time() * 1000) - 100  # fetched before any restart below
        fresh = {1: now, 2: now, 3: now}
        # Not healthy (node 3 lags): nothing starts.
        assert await r.step(view(2, {1: 0, 2: 0, 3: 50}, fresh)) is None
        # A voter change in flight: nothing starts either.
        pending = view(2, {1: 0, 2: 0, 3: 0}, fresh, target_voters=(1, 2))
        assert await r.step(pending) is None
        assert await r.step(view(2, {1: 0, 2: 0, 3: 0}, fresh)) == 1
        # Node 1 has not fetched since its restart: node 2 must wait, healthy or not.
        assert await r.step(view(2, {1: 0, 2: 0, 3: 0}, fresh)) is None
        later = int(time.time() * 1000) + 1000
        back = {1: later, 2: later, 3: later}
        assert await r.step(view(2, {1: 0, 2: 0, 3: 0}, back)) == 2
        # Node 2 (the leader) comes back leading again: that counts as back.
        assert await r.step(view(2, {1: 0, 2: 0, 3: 0}, back)) == 3
        not_yet = {1: later, 2: later, 3: now}  # node 3 last fetched before its restart
        assert await r.step(view(1, {1: 0, 2: 0, 3: 0}, not_yet)) is None
        assert r.in_flight is not None and r.in_flight[0] == 3

    asyncio.run(run())
    assert restarted == [1, 2, 3] and r.rotations == {1: 1, 2: 1, 3: 1}


def test_rotation_tells_each_step_once() -> None:
    """What the operator posts as Kubernetes Events on the KRaftQuorum during a renewal."""
    due = {1}
    told: list[tuple[str, str, bool]] = []

    async def get_due() -> list[int]:
        return sorted(due)

    async def renew(i: int) -> None:
        due.discard(i)

    async def restart(i: int) -> None:
        pass

    async def notify(reason: str, msg: str, warn: bool) -> None:
        told.append((reason, msg, warn))

    r = CertRotator(get_due, renew, restart, lambda: [1, 2, 3], max_lag=10, fresh_ms=3000,
                    notify=notify, label="ns/q")

    async def run() -> None:
        import time

        now = int(time.time() * 1000) - 100
        fresh = {1: now, 2: now, 3: now}
        lagging = view(2, {1: 0, 2: 0, 3: 50}, fresh)
        assert await r.step(lagging) is None
        assert await r.step(lagging) is None  # the same wait is told once, not every pass
        assert await r.step(view(2, {1: 0, 2: 0, 3: 0}, fresh)) == 1
        later = int(time.time() * 1000) + 1000
        assert await r.step(view(2, {1: 0, 2: 0, 3: 0}, {1: later, 2: later, 3: later})) is None

    asyncio.run(run())
    assert [(reason, warn) for reason, _, warn in told] == [
        ("CertificateRenewalWaiting", True),
        ("CertificateRenewalStarted", False),
        ("CertificateRenewed", False),
    ]
    assert "node 1" in told[1][1] and "node 1" in told[2][1]


def test_rotation_ignores_fetches_made_while_the_restart_was_under_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old process of a deleted pod may fetch until it is gone (graceful termination): a
    fetch timed during ``restart`` is not "back", only one after it returned (found on the real
    kubelet, where a pod event woke the operator at once and two nodes went down together)."""
    # The rotator's clock is a stand-in that only the restart moves: the old pod's going away
    # takes 50 ms of it, whatever the machine's load (no real sleep).
    clock = [1_700_000_000_000]
    monkeypatch.setattr(rotation, "time", types.SimpleNamespace(time=lambda: clock[0] / 1000))
    during: list[int] = []

    async def get_due() -> list[int]:
        return [1, 2]

    async def renew(i: int) -> None:
        return None

    async def restart(i: int) -> None:
        during.append(clock[0])
        clock[0] += 50  # the old pod going away; its last fetch falls in here

    r = CertRotator(get_due, renew, restart, lambda: [1, 2, 3], max_lag=10, fresh_ms=3000)

    async def run() -> None:
        now = clock[0]
        assert await r.step(view(2, {1: 0, 2: 0, 3: 0}, {1: now, 2: now, 3: now})) == 1
        old_process = during[0] + 1  # after the restart began, before it returned
        seen = {1: old_process, 2: now, 3: now}
        assert await r.step(view(2, {1: 0, 2: 0, 3: 0}, seen)) is None
        assert r.in_flight is not None and r.in_flight[0] == 1

    asyncio.run(run())

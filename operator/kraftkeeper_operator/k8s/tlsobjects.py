"""TLS objects of one KRaftQuorum on Kubernetes, and the operator's own credential.

Objects (``spec.tls``, tlsspec.py):

* mode ``Operator``: Secret ``NAME-ca`` (``ca.crt``, ``ca.key``: the quorum's CA, created once,
  never replaced: every certificate it issued would stop verifying); Secret ``NAME-tls`` (``ca.crt``
  and ``node-<id>.crt`` / ``node-<id>.key`` per replica id: URI SAN
  ``kraftkeeper://CLUSTER_ID/replica/<id>?storage=UUID`` (bound to the replica's disk, below),
  the pod's DNS names, the client Service's names and
  the per-replica peer name of pki.py); Secret ``NAME-client`` (a ``readwrite`` client
  certificate for applications, with ``client.json``, docs/reference.md's client config, relative
  paths: mount the Secret and point ``KRAFTKEEPER_CLIENT_CONFIG`` at ``client.json``). The
  operator's admin credential is issued in memory (a private temporary directory) and never
  stored: it holds the CA key anyway.
* mode ``CertManager``: cert-manager ``Certificate`` objects (cert-manager.io/v1) against
  ``spec.tls.certManager.issuerRef``: ``NAME-node-<id>`` (Secret ``NAME-node-<id>-tls``, same
  SANs as above), ``NAME-operator`` (the operator's admin credential, Secret
  ``NAME-operator-tls``) and ``NAME-client`` (Secret ``NAME-client-tls``, readwrite). The
  operator never sees a CA key; it reads only its own Secret.

Disk binding (KIP-856 storage UUIDs; docs/operator.md "Certificates bound to the disk"): every
node certificate names the storage UUID of the volume its pod runs on. Before the quorum
bootstrapped the operator chooses it (a random UUID) and the pod formats its empty volume with
the UUID its certificate names (manifests.py ``format_command``). A volume formatted later (a
replaced disk, a scale-up) takes the UUID of the replica's spare certificate (spares.py: Secret
keys ``spare-<id>.crt``/``.key``/``.state``, or Certificate ``NAME-node-<id>-spare``), which
the operator promotes for a replaced claim; without a spare it gets a random UUID, the node
refuses its old certificate and exits naming its disk (:func:`disk_of_pod`), and the operator
issues the certificate of that disk (quorumtls.py). A replaced disk's old certificate thus speaks
only for the old (id, UUID), which the quorum retires. Certificates issued before disks were
bound (no ``storage``) keep working; the rotation replaces them with bound ones, one pod at a
time.

The NetworkPolicy ``NAME`` (every mode) lets into the quorum's pods, on the client port, only
its own pods (peer traffic), the operator's pods (admin), and the peers of
``spec.clientSelector``; everything else is dropped.

Renewal (Operator mode): :class:`OperatorCa` issues node certificates valid
``spec.tls.validityDays``; rotation.py's CertRotator renews those due within
``renewBeforeDays``, one pod at a time (restart = delete the pod; its node container mounts the
new certificate: tlsspec.py). In CertManager mode cert-manager renews the Secrets; the operator
restarts a pod the same way, one at a time, once its Secret holds a certificate issued after the
pod started.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509

from quorum.security.clientconfig import ClientConfig
from quorum.security.identity import renewal_due
from quorum.security.pki import (
    CA_CERT,
    CA_KEY,
    Identity,
    identity_from_cert,
    init_ca,
    issue_client,
    issue_node,
    load_ca,
    peer_hostname,
)
from quorum.types import KraftError

from .manifests import QuorumSpec
from .tlsspec import MAX_REPLICA_ID

SPARE_ANNOTATION = "kraftkeeper.io/spare"  # on Certificate NAME-node-<id>-spare (spares.py)
DISK_ANNOTATION = "kraftkeeper.io/disk"  # on Certificate NAME-node-<id>: the disk it was applied for
CERT_MANAGER_GROUP = "cert-manager.io"
CERT_MANAGER_VERSION = "v1"
CERT_MANAGER_PLURAL = "certificates"
CLIENT_NAME = "app"  # the client certificate of the NAME-client Secret
OPERATOR_NAME = "operator"  # the operator's admin client certificate
DEFAULT_OPERATOR_LABELS = {"app.kubernetes.io/name": "kraftkeeper", "app.kubernetes.io/component": "operator"}


def day_seconds() -> float:
    """Seconds in one of ``spec.tls``'s days: 86400, except under the test hook
    ``KRAFTKEEPER_TLS_DAY_SECONDS`` (as ``KRAFTKEEPER_ENDPOINT_OVERRIDES``: tests with a running
    quorum need certificates that expire within minutes)."""
    raw = os.environ.get("KRAFTKEEPER_TLS_DAY_SECONDS", "").strip()
    try:
        value = float(raw) if raw else 86400.0
    except ValueError:
        raise ValueError(f"KRAFTKEEPER_TLS_DAY_SECONDS={raw!r}: must be a number of seconds") from None
    if not value > 0:
        raise ValueError(f"KRAFTKEEPER_TLS_DAY_SECONDS={raw!r}: must be > 0")
    return value


def tls_days(days: int) -> dt.timedelta:
    return dt.timedelta(seconds=days * day_seconds())


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(data: Mapping[str, str] | None, key: str) -> bytes | None:
    raw = (data or {}).get(key)
    try:
        return base64.b64decode(raw, validate=True) if raw else None
    except ValueError:
        return None


def node_hosts(q: QuorumSpec, replica_id: int) -> list[str]:
    """DNS SANs of replica ``replica_id``: its pod's names and the client Service's names."""
    pod = f"{q.name}-{replica_id - 1}.{q.headless}.{q.namespace}.svc"
    svc = f"{q.name}.{q.namespace}.svc"
    return [pod, f"{pod}.cluster.local", q.name, f"{q.name}.{q.namespace}", svc, f"{svc}.cluster.local"]


def _meta(q: QuorumSpec, name: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": q.namespace, "labels": q.labels(), "ownerReferences": [dict(owner)]}


def secret(q: QuorumSpec, owner: Mapping[str, Any], name: str, data: Mapping[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(q, name, owner),
        "data": {k: b64(v) for k, v in sorted(data.items())},
    }


def client_json() -> bytes:
    """The client config inside the ``NAME-client`` Secret (paths relative to its folder)."""
    return (json.dumps({"ca_file": "ca.crt", "cert_file": "tls.crt", "key_file": "tls.key"}) + "\n").encode()


# ---------------------------------------------------------------------------------------------
# NetworkPolicy


def operator_peer() -> dict[str, Any]:
    """The operator's pods, from ``KRAFTKEEPER_OPERATOR_NAMESPACE`` and
    ``KRAFTKEEPER_OPERATOR_POD_LABELS`` (``k=v,k=v``; both set by the Helm chart)."""
    raw = os.environ.get("KRAFTKEEPER_OPERATOR_POD_LABELS", "")
    labels = dict(DEFAULT_OPERATOR_LABELS)
    if raw.strip():
        labels = {}
        for part in raw.split(","):
            k, sep, v = part.strip().partition("=")
            if not sep or not k:
                raise ValueError(f"KRAFTKEEPER_OPERATOR_POD_LABELS: {part!r} is not key=value")
            labels[k] = v
    peer: dict[str, Any] = {"podSelector": {"matchLabels": labels}}
    ns = os.environ.get("KRAFTKEEPER_OPERATOR_NAMESPACE", "").strip()
    if ns:
        peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": ns}}
    return peer


def network_policy(q: QuorumSpec, owner: Mapping[str, Any]) -> dict[str, Any]:
    """NetworkPolicy ``NAME`` (module docstring)."""
    port = [{"protocol": "TCP", "port": q.port}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(q, q.name, owner),
        "spec": {
            "podSelector": {"matchLabels": q.selector()},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": q.selector()}}], "ports": port},  # peers
                {"from": [operator_peer()], "ports": port},  # the operator's admin calls
                {"from": [dict(p) for p in q.client_selector], "ports": port},  # applications
            ],
        },
    }


# ---------------------------------------------------------------------------------------------
# cert-manager


def _certificate(
    q: QuorumSpec, owner: Mapping[str, Any], name: str, uri: str, dns: list[str], server: bool
) -> dict[str, Any]:
    t = q.tls
    usages = ["digital signature", "key encipherment", "client auth"] + (["server auth"] if server else [])
    spec: dict[str, Any] = {
        "secretName": f"{name}-tls",
        "issuerRef": {"name": t.issuer_name, "kind": t.issuer_kind, "group": t.issuer_group},
        "uris": [uri],
        "usages": usages,
        "duration": f"{t.validity_days * 24}h",
        "renewBefore": f"{t.renew_before_days * 24}h",
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
    }
    if dns:
        spec["dnsNames"] = dns
    return {
        "apiVersion": f"{CERT_MANAGER_GROUP}/{CERT_MANAGER_VERSION}",
        "kind": "Certificate",
        "metadata": _meta(q, name, owner),
        "spec": spec,
    }


def certificates(
    q: QuorumSpec,
    owner: Mapping[str, Any],
    replicas: int,
    disks: Mapping[int, str | None],
    spares: Mapping[int, Any] | None = None,
) -> list[dict[str, Any]]:
    """The cert-manager Certificates of a CertManager-mode quorum (module docstring); ``disks``
    maps a replica id to the storage UUID its certificate names (missing or None: unbound),
    ``spares`` a replica id to its spare (spares.py ``Spare``: Certificate ``NAME-node-<id>-spare``
    naming the spare's UUID, the spare's record in an annotation)."""
    cid = q.cluster_id
    spare_certs = []
    for i, sp in sorted((spares or {}).items()):
        if i > min(replicas, MAX_REPLICA_ID):
            continue
        uri = Identity(cid, replica_id=i, storage_uuid=sp.uuid).uri()
        hosts = [*node_hosts(q, i), peer_hostname(cid, i)]
        obj = _certificate(q, owner, f"{q.name}-node-{i}-spare", uri, hosts, True)
        obj["metadata"]["annotations"] = {SPARE_ANNOTATION: sp.encode()}
        spare_certs.append(obj)
    out = [
        _certificate(
            q,
            owner,
            f"{q.name}-node-{i}",
            Identity(cid, replica_id=i, storage_uuid=disks.get(i)).uri(),
            [*node_hosts(q, i), peer_hostname(cid, i)],
            True,
        )
        for i in range(1, min(replicas, MAX_REPLICA_ID) + 1)
    ]
    for i, obj in enumerate(out, 1):
        if disks.get(i):  # what it was applied for, before cert-manager issues it (quorumtls.py)
            obj["metadata"]["annotations"] = {DISK_ANNOTATION: str(disks[i])}
    for name, role in ((OPERATOR_NAME, "admin"), (CLIENT_NAME, "readwrite")):
        uri = Identity(cid, name=name, role=role).uri()
        obj_name = f"{q.name}-operator" if name == OPERATOR_NAME else f"{q.name}-client"
        out.append(_certificate(q, owner, obj_name, uri, [], False))
    return out + spare_certs


# ---------------------------------------------------------------------------------------------
# The operator's CA (Operator mode)


def cert_identity(pem: bytes | None) -> Identity | None:
    """Who a PEM certificate names; None if missing or unreadable."""
    try:
        return identity_from_cert(x509.load_pem_x509_certificate(pem)) if pem else None
    except (ValueError, KraftError):
        return None


def cert_due(pem: bytes | None, renew_before: dt.timedelta, identity: Identity | None = None) -> bool:
    """The renewal rule (:func:`quorum.security.identity.renewal_due`) on a Secret's PEM; the
    disk binding is compared by the callers (``identity`` names no disk)."""
    return renewal_due(pem, renew_before, identity)


def cert_serial(pem: bytes | None) -> int | None:
    try:
        return x509.load_pem_x509_certificate(pem).serial_number if pem else None
    except ValueError:
        return None


def not_after(pem: bytes | None) -> dt.datetime | None:
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc if pem else None
    except ValueError:
        return None


def not_before(pem: bytes | None) -> dt.datetime | None:
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_before_utc if pem else None
    except ValueError:
        return None


class OperatorCa:
    """A quorum's CA held by the operator, in a private temporary directory (mode 0700) for
    pki.py, which works on files. :meth:`close` removes it."""

    def __init__(self, q: QuorumSpec, ca_crt: bytes | None = None, ca_key: bytes | None = None) -> None:
        self.q = q
        self.dir = Path(tempfile.mkdtemp(prefix="kraftkeeper-tls-"))
        if ca_crt is None or ca_key is None:
            self.ca = init_ca(self.dir, q.cluster_id)
        else:
            (self.dir / CA_CERT).write_bytes(ca_crt)
            fd = os.open(self.dir / CA_KEY, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(ca_key)
            self.ca = load_ca(self.dir)
            if self.ca.cluster_id != q.cluster_id:
                raise ValueError(
                    f"Secret {q.name}-ca holds the CA of cluster {self.ca.cluster_id!r}, not {q.cluster_id!r}"
                )
        self.admin: ClientConfig | None = None

    @property
    def days(self) -> float:
        return tls_days(self.q.tls.validity_days).total_seconds() / 86400.0

    def ca_pems(self) -> tuple[bytes, bytes]:
        return (self.dir / CA_CERT).read_bytes(), (self.dir / CA_KEY).read_bytes()

    def _take(self, crt: Path, key: Path) -> tuple[bytes, bytes]:
        out = crt.read_bytes(), key.read_bytes()
        if crt.stem != OPERATOR_NAME:  # the operator's own files stay for its client
            crt.unlink()
            key.unlink()
        return out

    def node(self, replica_id: int, storage_uuid: str | None = None) -> tuple[bytes, bytes]:
        hosts = node_hosts(self.q, replica_id)
        crt, key = issue_node(self.ca, replica_id, hosts, days=self.days, storage_uuid=storage_uuid)
        return self._take(crt, key)

    def client(self) -> tuple[bytes, bytes]:
        crt, key = issue_client(self.ca, CLIENT_NAME, "readwrite", days=self.days)
        return self._take(crt, key)

    def admin_config(self) -> ClientConfig:
        """The operator's admin credential, issued now if missing or due."""
        renew = tls_days(self.q.tls.renew_before_days)
        crt = self.dir / f"{OPERATOR_NAME}.crt"
        if self.admin is None or cert_due(crt.read_bytes() if crt.exists() else None, renew):
            crt, key = issue_client(self.ca, OPERATOR_NAME, "admin", days=self.days)
            self.admin = ClientConfig(f"{self.dir}/operator", self.dir / CA_CERT, crt, key)
        return self.admin

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def client_config_from_secret(q: QuorumSpec, data: Mapping[str, str], directory: Path) -> ClientConfig:
    """The operator's admin credential from cert-manager's Secret ``NAME-operator-tls``."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = {}
    for key in ("ca.crt", "tls.crt", "tls.key"):
        raw = unb64(data, key)
        if not raw:
            raise ValueError(f"Secret {q.name}-operator-tls has no {key} yet")
        p = directory / key
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        paths[key] = p
    return ClientConfig(f"Secret {q.name}-operator-tls", paths["ca.crt"], paths["tls.crt"], paths["tls.key"])

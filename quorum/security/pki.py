"""The per-cluster PKI: a CA, node certificates, client certificates, identities.

All certificate work is PyCA ``cryptography``; nothing is hand-rolled. Keys are ECDSA P-256
(fast to make and to verify, accepted by every TLS 1.2+ stack).

Identities live in one URI subject alternative name per certificate, the SPIFFE-style
convention (a URI SAN names a workload; host names stay in DNS / IP SANs for TLS's own
hostname check):

* node (peer) certificate: ``kraftkeeper://CLUSTER_ID/replica/N?storage=UUID`` plus DNS / IP SANs for the
  hosts the node is reached at (``127.0.0.1`` and ``localhost`` in local mode, pod DNS names on
  Kubernetes) and the per-replica name of :func:`peer_hostname`, which a peer verifies as the
  TLS server name; extended key usage serverAuth and clientAuth (a node is both). The
  ``storage`` query binds the credential to one disk, the storage UUID (KIP-856 directory id)
  in that node's ``meta.properties``: a replaced disk gets a new credential, and the old one can
  speak only as the retired (N, old UUID) (:func:`quorum.security.auth.check_peer_message`).
  A certificate without it (issued before disks were bound) names the replica alone;
* client certificate: ``kraftkeeper://CLUSTER_ID/client/NAME?role=ROLE`` with ROLE one of
  ``admin``, ``readwrite``, ``read``; extended key usage clientAuth only, so a client
  certificate can never serve as a node;
* the CA: ``kraftkeeper://CLUSTER_ID/ca``, basic constraints CA with path length 0.

The cluster id in the URI matters even though each cluster has its own CA: a CA shared
between clusters (one cert-manager issuer for several quorums) must still not let a node of
one cluster speak for another. :func:`identity_from_peercert` parses the dictionary that
``ssl.SSLSocket.getpeercert()`` returns for a *verified* peer; :func:`peercert_dict` renders a
certificate in that same shape (tests, and callers that hold a ``cryptography`` object).

Files in a TLS directory (``kraftkeeper tls ...``): ``ca.crt``, ``ca.key``, ``node-N.crt`` /
``node-N.key``, ``NAME.crt`` / ``NAME.key`` / ``NAME.token`` / ``NAME.json`` for clients and
``tokens.json`` (hashed bearer tokens, see :mod:`quorum.security.tokens`). Private keys and
token files are created with mode 0600 (never readable by others, not even for a moment).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from quorum.security.identity import (
    MAX_ID,
    NAME_RE,
    SCHEME,
    Identity,
    check_validity,
    identity_from_cert,
    identity_from_peercert,
    peercert_dict,
    peercert_validity,
)
from quorum.security.roles import LEAF_DAYS, ROLES
from quorum.types import ErrorCode, KraftError, canonical_uuid, validate_cluster_id

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "ROLES",
    "CertificateAuthority",
    "Identity",
    "check_validity",
    "identity_from_cert",
    "identity_from_peercert",
    "init_ca",
    "issue_client",
    "issue_node",
    "load_ca",
    "peer_hostname",
    "peercert_dict",
    "peercert_validity",
    "write_private",
]

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CA_DAYS = 3650


# ---- files ----------------------------------------------------------------------------------


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a secret (key, token) created with mode 0600, replacing any older file atomically."""
    p = os.fspath(path)
    tmp = f"{p}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask cannot widen it, but an existing tmp file could be wider
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class CertificateAuthority:
    """A loaded cluster CA: its certificate, key and the cluster id it was made for."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cluster_id: str
    directory: Path

    @property
    def cert_file(self) -> Path:
        return self.directory / CA_CERT


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _builder(subject: str, issuer: x509.Name, public: Any, days: float, start: dt.datetime) -> Any:
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - dt.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(start + dt.timedelta(days=days))
    )


def init_ca(
    directory: str | os.PathLike[str], cluster_id: str, *, days: float = CA_DAYS
) -> CertificateAuthority:
    """Create ``directory/ca.crt`` and ``ca.key`` for ``cluster_id``; refuses to overwrite an
    existing CA (ALREADY_FORMATTED), since every certificate it issued would stop verifying."""
    validate_cluster_id(cluster_id)
    d = Path(directory)
    if (d / CA_KEY).exists() or (d / CA_CERT).exists():
        raise KraftError(ErrorCode.ALREADY_FORMATTED, f"{d} already holds a CA ({CA_CERT}); not replacing it")
    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kraftkeeper CA {cluster_id}")])
    start = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - dt.timedelta(minutes=5))
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"{SCHEME}://{cluster_id}/ca")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    write_private(d / CA_KEY, _key_pem(key))
    _write_public(d / CA_CERT, _cert_pem(cert))
    return CertificateAuthority(cert, key, cluster_id, d)


def load_ca(directory: str | os.PathLike[str]) -> CertificateAuthority:
    """Load the CA of a TLS directory; NOT_FORMATTED if there is none, INVALID_REQUEST naming
    the file if it does not parse."""
    d = Path(directory)
    cert_path, key_path = d / CA_CERT, d / CA_KEY
    if not cert_path.exists() or not key_path.exists():
        raise KraftError(ErrorCode.NOT_FORMATTED, f"{d} holds no CA; run kraftkeeper tls init-ca first")
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError as e:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{cert_path}: not a PEM certificate ({e})") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{key_path}: not an unencrypted PEM key ({e})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{key_path}: expected an EC private key")
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    uris = [
        u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(f"{SCHEME}://")
    ]
    parts = urlsplit(uris[0]) if uris else None
    if parts is None or parts.path != "/ca":
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{cert_path}: not a kraftkeeper cluster CA")
    return CertificateAuthority(cert, key, parts.netloc, d)


def _host_sans(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            if not re.match(r"^[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})$", h):
                raise KraftError(
                    ErrorCode.INVALID_REQUEST, f"--host {h!r:.60} is not a host name or IP"
                ) from None
            out.append(x509.DNSName(h))
    return out


def _issue(
    ca: CertificateAuthority,
    cn: str,
    sans: list[x509.GeneralName],
    usages: list[x509.ObjectIdentifier],
    days: float,
    base: Path,
    now: dt.datetime | None,
) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    start = now or _now()
    cert = (
        _builder(cn, ca.cert.subject, key.public_key(), days, start)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, True, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_path, cert_path = base.parent / f"{base.name}.key", base.parent / f"{base.name}.crt"
    write_private(key_path, _key_pem(key))
    _write_public(cert_path, _cert_pem(cert))
    return cert_path, key_path


def issue_node(
    ca: CertificateAuthority,
    node_id: int,
    hosts: list[str] | None = None,
    *,
    days: float = LEAF_DAYS,
    now: dt.datetime | None = None,
    storage_uuid: str | None = None,
) -> tuple[Path, Path]:
    """Issue ``node-N.crt`` / ``node-N.key`` binding (cluster, replica N) and, given
    ``storage_uuid``, that replica's disk; ``hosts`` default to ``127.0.0.1`` and ``localhost``
    (local mode). Returns (cert path, key path)."""
    if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id <= MAX_ID:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"invalid node id {node_id!r}: must be 0..{MAX_ID}")
    if storage_uuid is not None:
        try:
            storage_uuid = canonical_uuid(storage_uuid)
        except ValueError:
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"invalid storage UUID {storage_uuid!r:.60}"
            ) from None
    ident = Identity(ca.cluster_id, replica_id=node_id, storage_uuid=storage_uuid)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(ident.uri())]
    sans += _host_sans(list(hosts) if hosts else ["127.0.0.1", "localhost"])
    sans.append(x509.DNSName(peer_hostname(ca.cluster_id, node_id)))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    return _issue(
        ca, f"kraftkeeper node {node_id}", sans, usages, days, ca.directory / f"node-{node_id}", now
    )


def issue_client(
    ca: CertificateAuthority, name: str, role: str, *, days: float = LEAF_DAYS, now: dt.datetime | None = None
) -> tuple[Path, Path]:
    """Issue ``NAME.crt`` / ``NAME.key`` for a client with ``role`` (admin | readwrite | read)."""
    check_client_name(name)
    if role not in ROLES:
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"invalid role {role!r:.40}: use one of {', '.join(ROLES)}"
        )
    ident = Identity(ca.cluster_id, name=name, role=role)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(ident.uri())]
    return _issue(
        ca,
        f"kraftkeeper {role} {name}",
        sans,
        [ExtendedKeyUsageOID.CLIENT_AUTH],
        days,
        ca.directory / name,
        now,
    )


def peer_hostname(cluster_id: str, replica_id: int) -> str:
    """The DNS SAN that names replica ``replica_id`` of ``cluster_id`` in its node certificate:
    ``replica-N.<20 hex of sha256(cluster id)>.kraftkeeper.invalid`` (``.invalid`` never
    resolves, RFC 2606; the hash keeps any cluster id a valid, case-exact DNS label).

    A node calling replica N passes this as the TLS ``server_hostname`` (aiohttp's
    ``server_hostname=``), so the handshake itself refuses any certificate but replica N's of
    this cluster, even when every node listens on 127.0.0.1."""
    digest = hashlib.sha256(cluster_id.encode("utf-8")).hexdigest()[:20]
    return f"replica-{replica_id}.{digest}.kraftkeeper.invalid"


def check_client_name(name: str) -> str:
    """Client names: 1-64 of ``[A-Za-z0-9._-]``, not starting with ``node-`` and not ``ca`` /
    ``tokens`` (those file names are taken)."""
    if not NAME_RE.match(name) or name.startswith("node-") or name in ("ca", "tokens"):
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"invalid client name {name!r:.60}: 1-64 of letters, digits, '.', '_', '-' "
            "(not 'ca', 'tokens' or node-*)",
        )
    return name

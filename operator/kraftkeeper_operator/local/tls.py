"""TLS of a local cluster (``kraftkeeper operator local``): secure by default.

Under DIR the supervisor keeps::

    tls/ca.crt, tls/ca.key         the cluster's CA (quorum/security/pki.py), made once
    tls/node-<i>.crt, .key         node i's certificate, bound to its disk: URI SAN
                                   kraftkeeper://CLUSTER_ID/replica/i?storage=UUID
    tls/admin.crt, admin.key       the operator's own admin credential
    client.json                    the admin client config (docs/reference.md "Client config"), mode 0600

:class:`LocalTls` issues what is missing, what does not name the right (cluster, replica), and
what expires within ``renew_before``; certificates are issued for ``validity``. A cluster
directory made with ``--insecure`` and started later without it simply gets its CA then; with
``--insecure`` no ``client.json`` is left behind (a stale one would point at nothing that serves
TLS).

Rotation (rotation.py's :class:`CertRotator`, with :meth:`LocalTls.due` and
:meth:`LocalTls.issue_node`): node certificates are renewed before they expire, one node at a time,
never while the quorum is not fully healthy, and the node is restarted with its new certificate.
The CA stays, so peers keep trusting the renewed node.

A node certificate names the storage UUID of the disk it was issued for (``node-<i>/meta.properties``),
so a new disk gets a new credential: before the supervisor starts node i (:meth:`LocalTls.ensure_node`,
after ``kraftkeeper cluster replace-disk`` or after it formatted a wiped directory) a certificate
that names another disk is re-issued for this one. The old certificate can then only speak as the
old (i, UUID), which the quorum retires with RemoveVoter (quorum/security/auth.py).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from quorum.security.clientconfig import ClientConfig, load_client_config
from quorum.security.identity import Identity, renewal_due
from quorum.security.pki import (
    CA_CERT,
    CertificateAuthority,
    init_ca,
    issue_client,
    issue_node,
    load_ca,
    write_private,
)
from quorum.types import ErrorCode, KraftError

from .cluster import meta_uuid

log = logging.getLogger("kraftkeeper.operator.local")

ADMIN_NAME = "admin"
DEFAULT_VALIDITY = dt.timedelta(days=365)
DEFAULT_RENEW_BEFORE = dt.timedelta(days=30)
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd])$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, option: str) -> dt.timedelta:
    """``30s``, ``15m``, ``12h``, ``365d``; ValueError naming ``option`` otherwise."""
    m = _DURATION.match(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"{option} {text!r}: expected a positive duration such as 30s, 15m, 12h or 365d")
    return dt.timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def _cert(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None


@dataclass
class LocalTls:
    """The credentials of one local cluster (module docstring)."""

    dir: Path  # the cluster directory
    cluster_id: str
    node_ids: list[int]
    validity: dt.timedelta = DEFAULT_VALIDITY
    renew_before: dt.timedelta = DEFAULT_RENEW_BEFORE

    def __post_init__(self) -> None:
        if self.renew_before >= self.validity:
            raise ValueError(
                f"--renew-before ({self.renew_before}) must be shorter than --cert-validity ({self.validity})"
            )

    @property
    def tls_dir(self) -> Path:
        return self.dir / "tls"

    @property
    def client_json(self) -> Path:
        return self.dir / "client.json"

    def node_args(self) -> list[str]:
        return ["--tls-dir", str(self.tls_dir)]

    def _ca(self) -> CertificateAuthority:
        if not (self.tls_dir / CA_CERT).exists():
            log.info("created the cluster CA in %s", self.tls_dir)
            return init_ca(self.tls_dir, self.cluster_id)
        ca = load_ca(self.tls_dir)
        if ca.cluster_id != self.cluster_id:
            raise KraftError(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"{self.tls_dir / CA_CERT} is the CA of cluster {ca.cluster_id!r}, not {self.cluster_id!r}",
            )
        return ca

    def node_cert(self, i: int) -> Path:
        return self.tls_dir / f"node-{i}.crt"

    def storage_uuid(self, i: int) -> str | None:
        """The storage UUID of node i's disk (None before it is formatted)."""
        return meta_uuid(self.dir / f"node-{i}")

    def needs_renewal(self, path: Path, now: dt.datetime | None = None, replica: int | None = None) -> bool:
        """The renewal rule (:func:`quorum.security.identity.renewal_due`) for a file: node
        ``replica``'s certificate must name this cluster, that replica and its disk (once formatted)."""
        expect = None
        if replica is not None:
            expect = Identity(self.cluster_id, replica_id=replica, storage_uuid=self.storage_uuid(replica))
        return renewal_due(_cert(path), self.renew_before, expect, now)

    def _days(self) -> float:
        return self.validity.total_seconds() / 86400.0

    async def due(self) -> list[int]:
        """The nodes whose certificate needs renewal, soonest expiry first."""
        due = [i for i in self.node_ids if self.needs_renewal(self.node_cert(i), replica=i)]
        return sorted(due, key=lambda i: _expiry(self.node_cert(i)))

    async def renew_node(self, i: int) -> None:
        await asyncio.to_thread(self.issue_node, i)

    def issue_node(self, i: int) -> None:
        disk = self.storage_uuid(i)
        issue_node(self._ca(), i, days=self._days(), storage_uuid=disk)
        log.info("issued the certificate of node %d for storage %s (valid %s)", i, disk, self.validity)

    def ensure_node(self, i: int) -> None:
        """Before node i starts: a certificate for the disk it starts on (module docstring)."""
        if self.needs_renewal(self.node_cert(i), replica=i):
            self.issue_node(i)

    def renew_admin_if_due(self) -> bool:
        """Re-issue the admin credential when due; True if it was (the caller rebuilds clients)."""
        if not self.needs_renewal(self.tls_dir / f"{ADMIN_NAME}.crt"):
            return False
        issue_client(self._ca(), ADMIN_NAME, "admin", days=self._days())
        log.info("issued the admin credential (valid %s)", self.validity)
        return True

    def provision(self) -> ClientConfig:
        """Make every credential ready before any node starts; writes ``client.json``."""
        self._ca()
        for i in self.node_ids:
            if self.needs_renewal(self.node_cert(i), replica=i):
                self.issue_node(i)
        self.renew_admin_if_due()
        cfg = {
            "ca_file": f"tls/{CA_CERT}",
            "cert_file": f"tls/{ADMIN_NAME}.crt",
            "key_file": f"tls/{ADMIN_NAME}.key",
        }
        write_private(self.client_json, (json.dumps(cfg, indent=2) + "\n").encode())
        return load_client_config(self.client_json)


def add_tls_args(p: argparse.ArgumentParser) -> None:
    """The TLS options of ``kraftkeeper operator local``."""
    p.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS and no credentials: nodes serve plaintext HTTP on loopback, no client.json is written",
    )
    p.add_argument(
        "--cert-validity",
        default=f"{DEFAULT_VALIDITY.days}d",
        help="validity of the node and admin certificates issued (30s, 15m, 12h, 365d; default %(default)s)",
    )
    p.add_argument(
        "--renew-before",
        default=f"{DEFAULT_RENEW_BEFORE.days}d",
        help="renew a certificate this long before it expires, one node at a time (default %(default)s)",
    )


def tls_from_args(a: argparse.Namespace, d: Path, cluster_id: str, node_ids: list[int]) -> LocalTls | None:
    """None with ``--insecure``; ValueError naming a bad duration option."""
    validity = parse_duration(a.cert_validity, "--cert-validity")
    renew_before = parse_duration(a.renew_before, "--renew-before")
    tls = LocalTls(d, cluster_id, node_ids, validity, renew_before)  # checks the pair
    return None if a.insecure else tls


def remove_client_json(d: Path) -> None:
    """``--insecure``: no client config may point at a TLS setup that is not serving."""
    try:
        os.unlink(d / "client.json")
        log.warning("--insecure: removed %s (the nodes serve plaintext HTTP on loopback)", d / "client.json")
    except FileNotFoundError:
        pass


def _expiry(path: Path) -> dt.datetime:
    cert = _cert(path)
    return cert.not_valid_after_utc if cert is not None else dt.datetime.min.replace(tzinfo=dt.UTC)

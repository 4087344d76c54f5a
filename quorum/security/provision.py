"""Provisioning a whole local cluster's credentials at once, idempotently (for
``kraftkeeper operator local`` and ``kraftkeeper demo``, which are secure by default).

:func:`ensure_local_pki` makes ``TLS_DIR`` hold a CA for the cluster, a certificate for every
node, an admin client certificate, and writes the admin client config (interfaces.md:
``DIR/client.json``) with paths relative to the config's folder. Run again, it keeps what is
there and valid, issues what is missing, and re-issues leaf certificates that expire within
``renew_within`` (rotation: a node picks a new certificate up when it restarts; the CA stays,
so peers keep trusting it). A TLS directory made for another cluster is refused.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from quorum.security.pki import (
    CA_CERT,
    identity_from_cert,
    init_ca,
    issue_client,
    issue_node,
    load_ca,
    write_private,
)
from quorum.types import ErrorCode, KraftError

__all__ = ["ADMIN_NAME", "LocalPki", "ensure_local_pki", "expires_within"]

ADMIN_NAME = "admin"
RENEW_WITHIN = dt.timedelta(days=30)


@dataclass(frozen=True)
class LocalPki:
    tls_dir: Path
    client_config: Path
    issued: tuple[str, ...]  # file names (re)issued by this call, for logs

    def node_args(self) -> list[str]:
        """The ``kraftkeeper start`` options of a node of this cluster."""
        return ["--tls-dir", str(self.tls_dir)]


def expires_within(cert_file: Path, window: dt.timedelta, now: dt.datetime | None = None) -> bool:
    """True if ``cert_file`` is missing, unreadable, or expires before ``now + window``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError):
        return True
    return cert.not_valid_after_utc <= (now or dt.datetime.now(dt.UTC)) + window


def ensure_local_pki(
    tls_dir: str | os.PathLike[str],
    cluster_id: str,
    node_ids: list[int],
    client_config: str | os.PathLike[str],
    *,
    hosts: list[str] | None = None,
    renew_within: dt.timedelta = RENEW_WITHIN,
) -> LocalPki:
    """Make ``tls_dir`` ready for ``node_ids`` of ``cluster_id`` and write the admin
    ``client_config`` (mode 0600: it leads to the admin key)."""
    d = Path(tls_dir)
    issued: list[str] = []
    if (d / CA_CERT).exists():
        ca = load_ca(d)
        if ca.cluster_id != cluster_id:
            raise KraftError(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"{d / CA_CERT} is the CA of cluster {ca.cluster_id!r}, not {cluster_id!r}",
            )
    else:
        ca = init_ca(d, cluster_id)
        issued.append(CA_CERT)
    for n in node_ids:
        cert = d / f"node-{n}.crt"
        if expires_within(cert, renew_within) or not _names(cert, cluster_id, n):
            issue_node(ca, n, hosts)
            issued.append(cert.name)
    admin = d / f"{ADMIN_NAME}.crt"
    if expires_within(admin, renew_within):
        issue_client(ca, ADMIN_NAME, "admin")
        issued.append(admin.name)
    cfg_path = Path(client_config)
    cfg = {
        "ca_file": os.path.relpath(d / CA_CERT, cfg_path.parent),
        "cert_file": os.path.relpath(admin, cfg_path.parent),
        "key_file": os.path.relpath(d / f"{ADMIN_NAME}.key", cfg_path.parent),
    }
    write_private(cfg_path, (json.dumps(cfg, indent=2) + "\n").encode())
    return LocalPki(d, cfg_path, tuple(issued))


def _names(cert_file: Path, cluster_id: str, node_id: int) -> bool:
    try:
        ident = identity_from_cert(x509.load_pem_x509_certificate(cert_file.read_bytes()))
    except (OSError, ValueError, KraftError):
        return False
    return ident.cluster_id == cluster_id and ident.replica_id == node_id

"""TLS contexts for nodes and clients (Python's :mod:`ssl`, TLS 1.2 or later only).

* :func:`server_context`: what a node serves with. The client certificate is *optional* at the
  TLS level (``CERT_OPTIONAL``: a presented certificate must verify against the cluster CA or
  the handshake fails; none at all is allowed) so that ``/healthz``, ``/readyz`` and
  ``/metrics`` stay reachable by probes and token clients can connect; the authorization
  middleware (:mod:`quorum.security.middleware`) then requires a certificate where the route
  needs one. This is the model of etcd's ``--client-cert-auth`` plus Kubernetes probes.
* :func:`peer_client_context`: what a node uses to call another node. It presents the node's
  own certificate (mutual TLS) and verifies the server against the CA. The caller passes
  ``server_hostname=pki.peer_hostname(cluster_id, N)`` with each request to replica N, so the
  handshake accepts only replica N's certificate of this cluster (a certificate of replica 3
  cannot answer for replica 2, even on one host). :func:`check_peer` does the same check on
  a connection's certificate for callers that hold one.
* :func:`client_context`: for CLI and library clients (:mod:`quorum.security.clientconfig`).
"""

from __future__ import annotations

import os
import ssl
from typing import Any

from quorum.security.pki import Identity, identity_from_peercert
from quorum.types import ErrorCode, KraftError

__all__ = ["check_peer", "client_context", "peer_client_context", "peer_identity", "server_context"]

PathLike = str | os.PathLike[str]


def _harden(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


def _load(
    ctx: ssl.SSLContext,
    what: str,
    ca_file: PathLike | None,
    cert_file: PathLike | None,
    key_file: PathLike | None,
) -> None:
    try:
        if ca_file is not None:
            ctx.load_verify_locations(cafile=os.fspath(ca_file))
        if cert_file is not None:
            ctx.load_cert_chain(os.fspath(cert_file), os.fspath(key_file) if key_file else None)
    except (OSError, ssl.SSLError) as e:
        files = ", ".join(os.fspath(f) for f in (ca_file, cert_file, key_file) if f is not None)
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{what}: cannot load {files}: {e}") from None


def server_context(ca_file: PathLike, cert_file: PathLike, key_file: PathLike) -> ssl.SSLContext:
    """A node's server side: its certificate, client certificates optional but verified."""
    ctx = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    _load(ctx, "server TLS", ca_file, cert_file, key_file)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def peer_client_context(ca_file: PathLike, cert_file: PathLike, key_file: PathLike) -> ssl.SSLContext:
    """A node calling another node: presents its own certificate, verifies the CA and host."""
    ctx = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    _load(ctx, "peer TLS", ca_file, cert_file, key_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.check_hostname = True
    return ctx


def client_context(
    ca_file: PathLike | None, cert_file: PathLike | None = None, key_file: PathLike | None = None
) -> ssl.SSLContext:
    """A client: verifies nodes against ``ca_file`` (the system store when None) and presents a
    client certificate when given."""
    ctx = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    if ca_file is None:
        ctx.load_default_certs()
    _load(ctx, "client TLS", ca_file, cert_file, key_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.check_hostname = True
    return ctx


def peer_identity(transport: Any) -> Identity | None:
    """The identity of the verified certificate on an asyncio transport, None if it has none."""
    if transport is None:
        return None
    obj = transport.get_extra_info("ssl_object")
    cert = obj.getpeercert() if obj is not None else None
    return identity_from_peercert(cert) if cert else None


def check_peer(peercert: dict[str, Any] | None, cluster_id: str, replica_id: int) -> None:
    """After connecting to replica ``replica_id``: its certificate must name exactly it, in
    ``cluster_id``. Raises UNAUTHENTICATED otherwise (the caller treats the RPC as failed)."""
    if not peercert:
        raise KraftError(ErrorCode.UNAUTHENTICATED, f"replica {replica_id} presented no certificate")
    ident = identity_from_peercert(peercert)
    if ident.cluster_id != cluster_id or ident.replica_id != replica_id:
        raise KraftError(
            ErrorCode.UNAUTHENTICATED,
            f"expected replica {replica_id} of cluster {cluster_id!r}, the server's certificate names "
            f"{ident.uri()}",
        )

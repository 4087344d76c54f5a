"""TLS contexts for nodes and clients (Python's :mod:`ssl`, TLS 1.2 or later only).

* :func:`server_context`: what a node serves with. The client certificate is *optional* at the
  TLS level (``CERT_OPTIONAL``: a presented certificate must verify against the cluster CA or
  the handshake fails; none at all is allowed) so that ``/healthz``, ``/readyz`` and
  ``/metrics`` stay reachable by probes and token clients can connect; the authorization
  middleware (:mod:`quorum.runtime.middleware`) then requires a certificate where the route
  needs one. This is the model of etcd's ``--client-cert-auth`` plus Kubernetes probes.
* :func:`peer_client_context`: what a node uses to call another node. It presents the node's
  own certificate (mutual TLS) and verifies the server against the CA. The caller passes
  ``server_hostname=pki.peer_hostname(cluster_id, N)`` with each request to replica N, so the
  handshake accepts only replica N's certificate of this cluster (a certificate of replica 3
  cannot answer for replica 2, even on one host). :func:`check_peer` does the same check on
  a connection's certificate for callers that hold one.
* :func:`client_context`: for CLI and library clients (:mod:`quorum.security.clientconfig`).
* :class:`PeerIdentities`: the identity of each verified certificate, parsed once and reused
  for every request that arrives with it (the authorization middleware's per-request cost).

What a handshake costs (measured with OpenSSL 3.0, ECDSA P-256, both sides in one process):
about 1.65 ms of server CPU with OpenSSL's default of two TLS 1.3 session tickets, 0.9 ms with
none. None of our clients resumes a session (aiohttp and asyncio streams never pass a saved
session back), so a node issues no tickets (RFC 8446 §4.6.1 lets a server send zero); clients
keep their connections open instead (one pooled keep-alive connection per peer).
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
import time
from typing import Any

from quorum.security.pki import (
    Identity,
    check_validity,
    identity_from_peercert,
    peercert_validity,
)
from quorum.types import ErrorCode, KraftError

__all__ = [
    "PeerIdentities",
    "check_peer",
    "client_context",
    "peer_client_context",
    "peer_identity",
    "server_context",
]

PathLike = str | os.PathLike[str]


# TLS 1.2 only with forward-secret AEAD suites (ECDHE with AES-GCM or ChaCha20-Poly1305, what
# etcd's Go stack offers by default); TLS 1.3, preferred, has only AEAD suites anyway.
_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def _harden(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.set_ciphers(_TLS12_CIPHERS)
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
    ctx.num_tickets = 0  # no client of ours resumes (module docstring): tickets are pure cost
    ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
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


class PeerIdentities:
    """The identity of each verified peer certificate, parsed once (the cost of TLS).

    ``getpeercert()`` builds a dictionary from the certificate and parsing its dates and URI
    SAN took about 90 us per request, on every request of a keep-alive connection. The
    certificate's DER bytes (about 1.5 us to fetch) key the parsed identity and its validity
    period, so a request with a known certificate costs a dictionary lookup and a clock
    comparison; the validity is still checked on every request (a connection can outlive its
    certificate). Only certificates that passed the handshake against the cluster CA reach
    this cache, and it is emptied when it holds ``max_entries``."""

    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self._known: dict[bytes, tuple[Identity, dt.datetime, dt.datetime, float, float]] = {}

    def of_transport(self, transport: Any, now: dt.datetime | None = None) -> Identity | None:
        """The identity of the verified certificate on an asyncio transport; None when the
        connection is plaintext or the client presented no certificate. UNAUTHENTICATED when
        the certificate names no valid identity or is outside its validity period."""
        obj = transport.get_extra_info("ssl_object") if transport is not None else None
        if obj is None:
            return None
        der = obj.getpeercert(binary_form=True)
        if not der:
            return None
        hit = self._known.get(der)
        if hit is None:
            cert = obj.getpeercert()
            ident = identity_from_peercert(cert, now)  # raises for a bad or expired certificate
            nb, na = peercert_validity(cert)
            if len(self._known) >= self.max_entries:
                self._known.clear()
            self._known[der] = (ident, nb, na, nb.timestamp(), na.timestamp())
            return ident
        ident, nb, na, nb_ts, na_ts = hit
        t = now.timestamp() if now is not None else time.time()
        if not nb_ts <= t <= na_ts:
            check_validity(nb, na, now)  # raises, naming the validity period
        return ident

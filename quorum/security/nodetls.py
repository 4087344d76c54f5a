"""TLS for one node (``kraftkeeper start --tls-dir D`` or ``--cert/--key/--ca [--tokens]``).

Assembles, from the node's certificate, key, cluster CA and token store, what the runtime
needs: the server context, the peer client context with the per-replica TLS server name, and
the token source of the authorization middleware (:mod:`quorum.runtime.middleware`). Start-up
refuses a certificate that does not name this node (cluster id and replica id from
``meta.properties``), so a node can never serve, or call its peers, under another replica's
identity.

Plaintext is for loopback only (docs/reference.md, `kraftkeeper start`): :func:`check_plaintext_listen`
refuses a non-loopback ``--listen`` without TLS unless ``--insecure`` is given.
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from quorum.security.pki import CA_CERT, Identity, identity_from_cert, peer_hostname
from quorum.security.tlsctx import peer_client_context, server_context
from quorum.security.tokens import TOKENS_FILE, TokenStore
from quorum.storage.meta import load_meta
from quorum.types import ErrorCode, KraftError

__all__ = [
    "NodeTls",
    "check_plaintext_listen",
    "is_loopback_host",
    "load_node_tls",
    "node_identity",
    "storage_uuid_of_cert",
]


def is_loopback_host(host: str) -> bool:
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def node_identity(cert_file: str | Path, cluster_id: str, node_id: int) -> Identity:
    """The identity of the node certificate ``cert_file``, which must name replica ``node_id``
    of ``cluster_id`` (INVALID_REQUEST naming the file otherwise)."""
    try:
        cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    except (OSError, ValueError) as e:
        msg = f"{cert_file}: not a readable PEM certificate ({e})"
        raise KraftError(ErrorCode.INVALID_REQUEST, msg) from None
    try:
        ident = identity_from_cert(cert)
    except KraftError as e:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{cert_file}: {e.message}") from None
    if ident.cluster_id != cluster_id or ident.replica_id != node_id:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"{cert_file} names {ident.uri()}, but this node is replica {node_id} of cluster {cluster_id!r}",
        )
    return ident


def storage_uuid_of_cert(cert_file: str | Path, cluster_id: str, node_id: int) -> str | None:
    """The storage UUID a node certificate binds (``format --storage-uuid-from-cert``): on
    Kubernetes the operator chooses a new disk's UUID and issues the certificate naming it before
    the pod formats the volume, so the node starts with a credential for exactly its disk. None
    for a certificate not bound to a disk."""
    return node_identity(cert_file, cluster_id, node_id).storage_uuid


def check_plaintext_listen(listen: str, insecure: bool) -> None:
    """Without TLS a node may listen on loopback only, unless ``--insecure``."""
    host = listen.rpartition(":")[0]
    if not insecure and not is_loopback_host(host):
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"--listen {listen}: plaintext HTTP is served on loopback addresses only; give TLS options "
            "(--tls-dir, or --cert/--key/--ca) or --insecure",
        )


@dataclass(frozen=True)
class NodeTls:
    """The files of one node's TLS setup (checked to exist and to parse at :meth:`load`)."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    tokens_file: Path | None

    @classmethod
    def load(
        cls,
        *,
        tls_dir: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        ca: str | None = None,
        tokens: str | None = None,
        node_id: int | None = None,
    ) -> NodeTls | None:
        """From ``--tls-dir D`` (D/ca.crt, D/node-N.crt, D/node-N.key, D/tokens.json if present)
        or from explicit files; None when no TLS option is given. INVALID_REQUEST naming the
        option or file that is missing."""
        if tls_dir is None and cert is None and key is None and ca is None:
            if tokens is not None:
                raise KraftError(
                    ErrorCode.INVALID_REQUEST, "--tokens needs TLS (--tls-dir or --cert/--key/--ca)"
                )
            return None
        if tls_dir is not None:
            if cert or key or ca:
                raise KraftError(ErrorCode.INVALID_REQUEST, "give --tls-dir or --cert/--key/--ca, not both")
            d = Path(tls_dir)
            if node_id is None:
                raise KraftError(ErrorCode.INVALID_REQUEST, "--tls-dir needs the node id")
            tok = Path(tokens) if tokens else (d / TOKENS_FILE if (d / TOKENS_FILE).exists() else None)
            out = cls(d / CA_CERT, d / f"node-{node_id}.crt", d / f"node-{node_id}.key", tok)
        else:
            missing = [n for n, v in (("--cert", cert), ("--key", key), ("--ca", ca)) if not v]
            if missing:
                raise KraftError(ErrorCode.INVALID_REQUEST, f"TLS needs {', '.join(missing)} as well")
            out = cls(Path(str(ca)), Path(str(cert)), Path(str(key)), Path(tokens) if tokens else None)
        for f in (out.ca_file, out.cert_file, out.key_file, out.tokens_file):
            if f is not None and not f.is_file():
                raise KraftError(ErrorCode.INVALID_REQUEST, f"TLS file {f} does not exist")
        return out

    def check_identity(self, cluster_id: str, node_id: int, storage_uuid: str | None = None) -> None:
        """The node certificate must name (cluster_id, node_id) and, when it is bound to a disk,
        this one (``storage_uuid``, from meta.properties): a credential issued for a replaced
        disk would have the peers refuse every request the node sends."""
        ident = node_identity(self.cert_file, cluster_id, node_id)
        if storage_uuid is not None and ident.storage_uuid not in (None, storage_uuid):
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"{self.cert_file} is bound to storage {ident.storage_uuid}, but this node's disk is "
                f"{storage_uuid}: issue the node a certificate for its disk "
                f"(kraftkeeper tls issue-node --node-id {node_id} --storage-uuid {storage_uuid})",
            )

    def not_after(self) -> float:
        """When the node certificate expires (Unix seconds): exported as a metric, since a node
        serves the certificate it read at start until it restarts, whatever its Secret holds."""
        cert = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        return cert.not_valid_after_utc.timestamp()

    def server_context(self) -> ssl.SSLContext:
        return server_context(self.ca_file, self.cert_file, self.key_file)

    def peer_context(self) -> ssl.SSLContext:
        return peer_client_context(self.ca_file, self.cert_file, self.key_file)

    def token_store(self) -> TokenStore | None:
        return TokenStore.load(self.tokens_file) if self.tokens_file is not None else None

    def token_source(self) -> Callable[[], TokenStore | None]:
        """The token store the authorization middleware consults, re-read when the tokens file
        changes (rotation); the last good store is kept while a new file is half-written."""
        path = self.tokens_file
        state: dict[str, object] = {"mtime": None, "store": None}

        def tokens() -> TokenStore | None:
            if path is None:
                return None
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:
                return state["store"] if isinstance(state["store"], TokenStore) else None
            if mtime != state["mtime"]:
                try:
                    state["store"], state["mtime"] = TokenStore.load(path), mtime
                except KraftError:
                    pass  # keep the last good store; a half-written file is not a reason to lock out
            return state["store"] if isinstance(state["store"], TokenStore) else None

        return tokens

    @staticmethod
    def server_hostname(cluster_id: str) -> Callable[[int], str]:
        """Per destination replica, the TLS server name its certificate must carry."""
        return lambda replica_id: peer_hostname(cluster_id, replica_id)


def load_node_tls(data_dir: str, options: dict[str, str | None]) -> NodeTls | None:
    """``kraftkeeper start``'s TLS options (``tls_dir``, ``cert``, ``key``, ``ca``, ``tokens``,
    ``spare_cert``, ``spare_key``) for the node formatted in ``data_dir``, its certificate checked
    against its identity. A spare certificate (another of this replica's, naming a storage UUID
    no disk had yet: docs/operator.md "Certificates bound to the disk") is served instead of
    ``cert`` when it names this node's disk; otherwise it is ignored."""
    spare_cert, spare_key = options.get("spare_cert"), options.get("spare_key")
    if not any(v for k, v in options.items() if k not in ("spare_cert", "spare_key")):
        if spare_cert or spare_key:
            raise KraftError(ErrorCode.INVALID_REQUEST, "--spare-cert/--spare-key need --cert/--key/--ca")
        return None
    if bool(spare_cert) != bool(spare_key):
        raise KraftError(ErrorCode.INVALID_REQUEST, "give --spare-cert and --spare-key together")
    meta = load_meta(data_dir)
    cert, key = options.get("cert"), options.get("key")
    spare = node_identity(spare_cert, meta.cluster_id, meta.node_id) if spare_cert else None
    if spare is not None and spare.storage_uuid is not None and spare.storage_uuid == meta.storage_uuid:
        # The spare names this disk: the volume was formatted with it (a replaced disk's first
        # start on Kubernetes, before the operator made it the current certificate).
        cert, key = spare_cert, spare_key
    tls = NodeTls.load(
        tls_dir=options.get("tls_dir"),
        cert=cert,
        key=key,
        ca=options.get("ca"),
        tokens=options.get("tokens"),
        node_id=meta.node_id,
    )
    if tls is not None:
        tls.check_identity(meta.cluster_id, meta.node_id, meta.storage_uuid)
    return tls

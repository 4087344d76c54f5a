"""Authentication and authorization: pure functions, no I/O.

Who may do what (the model a platform team audits; ``docs/operator.md`` repeats it):

=====================  ===========================================================
route                  allowed
=====================  ===========================================================
``/healthz``,          anyone, no credential (Kubernetes probes, Prometheus); these
``/readyz``,           endpoints must not reveal anything that helps impersonation
``/metrics``
``/raft/v1/*``         peers only (a node certificate of *this* cluster), and only as
                       the replica id the certificate names: the sender id the request
                       claims (Fetch / FetchSnapshot ``replica_id``, Vote
                       ``candidate_id``, Begin/EndQuorumEpoch ``leader_id``) must be
                       the certificate's (Kafka's controller listener and etcd's peer
                       TLS make the same binding); a certificate bound to a disk
                       (``?storage=UUID``) speaks only as that (id, UUID): the storage
                       UUID the request claims (Fetch / FetchSnapshot ``replica_uuid``,
                       Vote ``candidate_uuid``, Begin/EndQuorumEpoch ``leader_uuid``)
                       must be the certificate's (:func:`check_peer_message`)
``GET /v1/kv/*``       roles read, readwrite, admin
``PUT|DELETE /v1/kv``  roles readwrite, admin
``/v1/quorum/*``       role admin (describe, AddVoter, RemoveVoter, reassign; KIP-856
                       asks for ALTER on the cluster as Kafka's AddRaftVoter does)
anything else          role admin (deny by default)
=====================  ===========================================================

A credential is a client or node certificate verified by the TLS handshake against the
cluster CA (its identity is the ``kraftkeeper://`` URI SAN, see :mod:`quorum.security.pki`),
or ``Authorization: Bearer TOKEN`` checked against the hashed token store. When a bearer token
is present it is the credential, whatever certificate the connection carries. Missing or
invalid credentials are ``UNAUTHENTICATED`` (401); valid ones without the permission are
``PERMISSION_DENIED`` (403).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from quorum.core import messages as m
from quorum.security.pki import Identity, identity_from_peercert
from quorum.security.tokens import MAX_TOKEN, TokenStore
from quorum.types import ErrorCode, KraftError, canonical_uuid

__all__ = [
    "OPEN_PATHS",
    "Principal",
    "authenticate",
    "authorize",
    "check_peer_message",
    "principal_of",
    "required_permission",
    "rpc_sender",
    "rpc_sender_uuid",
]

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
RAFT_PREFIX = "/raft/v1/"
PEER = "peer"
_RANK = {"read": 1, "readwrite": 2, "admin": 3}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a peer (``replica_id``) or a client (``name``, ``role``)."""

    kind: str  # "peer" | "client"
    cluster_id: str
    replica_id: int | None = None
    name: str | None = None
    role: str | None = None
    via: str = "certificate"  # or "token"
    storage_uuid: str | None = None  # a peer certificate bound to one disk (pki module docstring)

    def __str__(self) -> str:
        if self.kind == PEER:
            disk = f" on storage {self.storage_uuid}" if self.storage_uuid else ""
            return f"replica {self.replica_id}{disk} (certificate)"
        return f"client {self.name} with role {self.role} ({self.via})"


def unauthenticated(msg: str) -> KraftError:
    return KraftError(ErrorCode.UNAUTHENTICATED, msg)


def denied(msg: str) -> KraftError:
    return KraftError(ErrorCode.PERMISSION_DENIED, msg)


def authenticate(
    peercert: dict[str, Any] | None,
    authorization: str | None,
    *,
    cluster_id: str,
    tokens: TokenStore | None,
    now: dt.datetime | None = None,
) -> Principal:
    """The caller behind a request, from the verified peer certificate (``getpeercert()``'s
    dictionary, None without one) and the ``Authorization`` header. Raises
    ``KraftError(UNAUTHENTICATED)`` saying what is missing or wrong."""
    ident = identity_from_peercert(peercert, now) if peercert and authorization is None else None
    return principal_of(ident, authorization, cluster_id=cluster_id, tokens=tokens)


def principal_of(
    identity: Identity | None,
    authorization: str | None,
    *,
    cluster_id: str,
    tokens: TokenStore | None,
) -> Principal:
    """:func:`authenticate` for a certificate whose identity is already parsed (and its
    validity checked): the server's :class:`~quorum.security.tlsctx.PeerIdentities` cache.
    When a bearer token is present it is the credential and ``identity`` is not consulted."""
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthenticated("Authorization header must be 'Bearer TOKEN'")
        token = token.strip()
        if len(token) > MAX_TOKEN:
            raise unauthenticated("bearer token is too long")
        entry = tokens.lookup(token) if tokens is not None else None
        if entry is None:
            raise unauthenticated("bearer token is not valid for this cluster")
        return Principal("client", cluster_id, name=entry.name, role=entry.role, via="token")
    ident = identity
    if ident is None:
        raise unauthenticated("no credential: present a client certificate or a bearer token")
    if ident.cluster_id != cluster_id:
        raise unauthenticated(f"certificate is for cluster {ident.cluster_id!r}, this is {cluster_id!r}")
    if ident.replica_id is not None:
        return Principal(PEER, cluster_id, replica_id=ident.replica_id, storage_uuid=ident.storage_uuid)
    return Principal("client", cluster_id, name=ident.name, role=ident.role)


def required_permission(method: str, path: str) -> str | None:
    """None for the open endpoints, ``"peer"`` for node-to-node RPCs, else the least role."""
    if path in OPEN_PATHS and method in ("GET", "HEAD"):
        return None
    if path.startswith(RAFT_PREFIX):
        return PEER
    if path.startswith("/v1/kv/"):
        return "read" if method in ("GET", "HEAD") else "readwrite"
    return "admin"


def authorize(
    principal: Principal | None, method: str, path: str, claimed_replica_id: int | None = None
) -> None:
    """Raise UNAUTHENTICATED (no principal on a protected route) or PERMISSION_DENIED; return
    None when allowed. For ``/raft/v1/*`` pass the sender id the request claims
    (:func:`rpc_sender`); None there is refused, as is any id but the certificate's."""
    need = required_permission(method, path)
    if need is None:
        return
    if principal is None:
        raise unauthenticated(f"{method} {path} needs a credential")
    if need == PEER:
        if principal.kind != PEER:
            raise denied(f"{principal} may not call node-to-node RPCs")
        if claimed_replica_id is None or claimed_replica_id != principal.replica_id:
            raise denied(f"{principal} may not send a request as replica {claimed_replica_id}")
        return
    if principal.kind == PEER:
        raise denied(f"{principal} may call node-to-node RPCs only")
    if _RANK.get(principal.role or "", 0) < _RANK[need]:
        raise denied(f"{principal} may not {method} {path} (needs role {need})")


def rpc_sender(msg: Any) -> int:
    """The replica id a node-to-node request claims to come from."""
    if isinstance(msg, m.VoteRequest):
        return msg.candidate_id
    if isinstance(msg, m.BeginQuorumEpochRequest | m.EndQuorumEpochRequest):
        return msg.leader_id
    if isinstance(msg, m.FetchRequest | m.FetchSnapshotRequest):
        return msg.replica_id
    raise TypeError(f"not a node-to-node request: {type(msg).__name__}")


def rpc_sender_uuid(msg: Any) -> str | None:
    """The storage UUID a node-to-node request claims to come from (KIP-856 fields)."""
    if isinstance(msg, m.VoteRequest):
        return msg.candidate_uuid
    if isinstance(msg, m.BeginQuorumEpochRequest | m.EndQuorumEpochRequest):
        return msg.leader_uuid
    if isinstance(msg, m.FetchRequest | m.FetchSnapshotRequest):
        return msg.replica_uuid
    raise TypeError(f"not a node-to-node request: {type(msg).__name__}")


def check_peer_message(principal: Principal | None, msg: Any) -> None:
    """The one check every node-to-node transport makes on a decoded request before the node
    sees it: the caller is a peer of this cluster, and the sender the request claims is the
    certificate's replica id and, for a certificate bound to a disk, its storage UUID. Raises
    UNAUTHENTICATED / PERMISSION_DENIED naming what does not match.

    Binding the UUID is what retires a replaced disk's credential: after ``replace-disk`` the
    old certificate can only speak as (N, old UUID), which the quorum removed (RemoveVoter), and
    removed keys never fetch, vote or lead again (the core refuses them, KAFKA-19850); it can
    no longer claim the new disk's UUID to be counted in its place. A certificate issued before
    disks were bound (no ``storage``) keeps the replica-id check alone."""
    if principal is None:
        raise unauthenticated("node-to-node requests need a node certificate")
    if principal.kind != PEER:
        raise denied(f"{principal} may not call node-to-node RPCs")
    claimed_id = rpc_sender(msg)
    if claimed_id != principal.replica_id:
        raise denied(f"{principal} may not send a request as replica {claimed_id}")
    if principal.storage_uuid is None:
        return
    claimed_uuid = rpc_sender_uuid(msg)
    try:
        same = claimed_uuid is not None and canonical_uuid(claimed_uuid) == principal.storage_uuid
    except ValueError:
        same = False
    if not same:
        raise denied(
            f"{principal} may not send a request as replica {claimed_id} on storage {claimed_uuid!r:.60}"
        )

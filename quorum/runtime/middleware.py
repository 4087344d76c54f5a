"""The aiohttp middleware that enforces :mod:`quorum.security.auth` on a node's HTTP server.

Install it *first* in the application's middleware list (before any error or body handling) so
that no handler runs, and no request body is read, for a caller that is not allowed::

    app = web.Application(middlewares=[auth_middleware(cluster_id, tokens), errors_middleware])

For every request it: leaves ``/healthz``, ``/readyz`` and ``/metrics`` open; takes the
``Authorization`` header or else the verified peer certificate of the request's TLS
connection (only filled in when the handshake verified it against the cluster CA; its identity
is parsed once per certificate, :class:`~quorum.security.tlsctx.PeerIdentities`, and the
tokens file is consulted only for a request that carries a token); authenticates; for
``/raft/v1/*`` checks that the caller is a node and decodes the request (strictly,
:mod:`quorum.runtime.wire`) to compare the replica id, and for a disk-bound certificate the
storage UUID, it claims with the certificate's (:func:`~quorum.security.auth.check_peer_message`,
the check every node-to-node transport makes). The
decoded message is kept in ``request[RPC_MESSAGE_KEY]``, the principal in
``request[PRINCIPAL_KEY]``.

Refusals are JSON ``{"error_code": "UNAUTHENTICATED" | "PERMISSION_DENIED", "message": ...}``
with 401 (plus ``WWW-Authenticate: Bearer``) or 403; a malformed RPC body from an authenticated
peer is a 400 ``INVALID_REQUEST``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from quorum.runtime import wire
from quorum.security.auth import (
    PEER,
    RAFT_PREFIX,
    Principal,
    authorize,
    check_peer_message,
    principal_of,
    required_permission,
    rpc_sender,
)
from quorum.security.tlsctx import PeerIdentities
from quorum.security.tokens import TokenStore
from quorum.types import ErrorCode, KraftError

__all__ = ["PRINCIPAL_KEY", "RPC_MESSAGE_KEY", "auth_middleware"]

log = logging.getLogger(__name__)
PRINCIPAL_KEY = web.RequestKey("principal", Principal)
RPC_MESSAGE_KEY = web.RequestKey("rpc_message", object)
_STATUS = {ErrorCode.UNAUTHENTICATED: 401, ErrorCode.PERMISSION_DENIED: 403, ErrorCode.INVALID_REQUEST: 400}

TokenSource = TokenStore | Callable[[], TokenStore | None] | None


def _refusal(err: KraftError) -> web.Response:
    status = _STATUS.get(err.code, 400)
    headers = {"WWW-Authenticate": 'Bearer realm="kraftkeeper"'} if status == 401 else None
    return web.json_response(
        {"error_code": err.code.value, "message": err.message}, status=status, headers=headers
    )


def auth_middleware(cluster_id: str, tokens: TokenSource = None) -> Middleware:
    """The middleware for a node of ``cluster_id``; ``tokens`` is the hashed token store or a
    callable returning the current one (so a rotated tokens file can be picked up)."""

    def current_tokens() -> TokenStore | None:
        return tokens() if callable(tokens) else tokens

    identities = PeerIdentities()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        need = required_permission(request.method, request.path)
        if need is None:
            return await handler(request)
        try:
            authorization = request.headers.get("Authorization")
            principal = principal_of(
                identities.of_transport(request.transport) if authorization is None else None,
                authorization,
                cluster_id=cluster_id,
                tokens=current_tokens() if authorization is not None else None,
            )
            claimed: int | None = None
            if need == PEER and principal.kind == PEER:
                cls = wire.REQUEST_BY_PATH.get(request.path[len(RAFT_PREFIX) :])
                if cls is None:
                    raise KraftError(ErrorCode.INVALID_REQUEST, f"unknown RPC {request.path!r}")
                msg: Any = wire.decode(cls, await request.read())
                claimed = rpc_sender(msg)
                request[RPC_MESSAGE_KEY] = msg
            authorize(principal, request.method, request.path, claimed)
            if need == PEER:
                check_peer_message(principal, request[RPC_MESSAGE_KEY])
        except KraftError as e:
            if e.code not in _STATUS:
                raise
            log.debug("refused %s %s from %s: %s", request.method, request.path, request.remote, e)
            return _refusal(e)
        request[PRINCIPAL_KEY] = principal
        return await handler(request)

    return middleware

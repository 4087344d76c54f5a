"""The aiohttp middleware that enforces :mod:`quorum.security.auth` on a node's HTTP server.

Install it *first* in the application's middleware list (before any error or body handling) so
that no handler runs, and no request body is read, for a caller that is not allowed::

    app = web.Application(middlewares=[auth_middleware(cluster_id, tokens), errors_middleware])

For every request it: leaves ``/healthz``, ``/readyz`` and ``/metrics`` open; reads the
verified peer certificate from the request's TLS transport (``ssl_object.getpeercert()``, which
is only filled in when the handshake verified it against the cluster CA) and the
``Authorization`` header; authenticates; for ``/raft/v1/*`` checks that the caller is a node
and decodes the request header (strictly, :mod:`quorum.runtime.wire`) to compare the replica
id it claims with the certificate's. The decoded message is kept in ``request["rpc_message"]``
so the handler need not decode it again; the principal in ``request["principal"]``.

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
    authenticate,
    authorize,
    required_permission,
    rpc_sender,
)
from quorum.security.tokens import TokenStore
from quorum.types import ErrorCode, KraftError

__all__ = ["PRINCIPAL_KEY", "RPC_MESSAGE_KEY", "auth_middleware", "peercert_of"]

log = logging.getLogger(__name__)
PRINCIPAL_KEY = web.RequestKey("principal", Principal)
RPC_MESSAGE_KEY = web.RequestKey("rpc_message", object)
_STATUS = {ErrorCode.UNAUTHENTICATED: 401, ErrorCode.PERMISSION_DENIED: 403, ErrorCode.INVALID_REQUEST: 400}

TokenSource = TokenStore | Callable[[], TokenStore | None] | None


def peercert_of(request: web.Request) -> dict[str, Any] | None:
    """The verified peer certificate of the request's connection, None on plaintext or when the
    client presented none."""
    transport = request.transport
    if transport is None:
        return None
    obj = transport.get_extra_info("ssl_object")
    cert = obj.getpeercert() if obj is not None else transport.get_extra_info("peercert")
    return cert if isinstance(cert, dict) and cert else None


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

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        need = required_permission(request.method, request.path)
        if need is None:
            return await handler(request)
        try:
            principal = authenticate(
                peercert_of(request),
                request.headers.get("Authorization"),
                cluster_id=cluster_id,
                tokens=current_tokens(),
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
        except KraftError as e:
            if e.code not in _STATUS:
                raise
            log.debug("refused %s %s from %s: %s", request.method, request.path, request.remote, e)
            return _refusal(e)
        request[PRINCIPAL_KEY] = principal
        return await handler(request)

    return middleware

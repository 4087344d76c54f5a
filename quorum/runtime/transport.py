"""The node-to-node transport seam: how a raft request reaches a peer and its answer comes back.

The node never talks HTTP itself. It holds a :class:`Transport` (client side: send one request
to a peer endpoint, get the decoded response) and exposes an :class:`RpcHandler` (server side:
one encoded request body in, one encoded response body out). Two implementations:

* :class:`HttpTransport` — aiohttp, ``POST /raft/v1/{rpc}`` with the ``quorum.runtime.wire``
  encoding (docs/design.md "Node HTTP API"). One keep-alive connection pool for every peer.
* :class:`InProcessTransport` — the same encoding, delivered to handlers registered by
  endpoint in this process (tests run several nodes in one event loop, no sockets).

Where TLS plugs in: ``HttpTransport(ssl_context=..., server_hostname=...)``
switches to ``https`` with a client context that presents this node's certificate and checks
that the server's certificate names the destination replica (the per-replica TLS server name,
KIP-595 RPCs name their destination); ``peer_check(destination_id, peercert)``, when given, is
called with the server's certificate on every response. A connection costs one handshake: the
pool keeps it open across RPCs (``tests/security/test_middleware_tls.py``), TLS session tickets
are not used (``quorum.security.tlsctx``). On the server side the authorization middleware
(``quorum.runtime.middleware``) compares the replica id the decoded request claims with the
caller's certificate before any handler runs; ``handle_rpc``'s ``peer`` is None there (it is
the hook for a handler that wants to check again, e.g. in-process tests).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.types import ErrorCode, KraftError

__all__ = [
    "HttpTransport",
    "InProcessTransport",
    "PeerCheck",
    "RpcHandler",
    "Transport",
    "TransportError",
]

# (destination replica id, the peer's certificate as ``SSLSocket.getpeercert()`` returns it,
# or None without TLS) -> None, or raise TransportError to refuse the answer.
PeerCheck = Callable[[int, dict[str, Any] | None], None]


class TransportError(Exception):
    """A request got no usable answer: refused, timed out, an HTTP error, an undecodable body.
    The node steps it into the core as ``RpcFailed`` (the core retries or gives up)."""


class Transport(Protocol):
    """Client side: deliver one raft request to a peer and return its decoded response."""

    async def send(self, destination_id: int, endpoint: str, request: Any, timeout_s: float) -> Any:
        """The response message for ``request`` (a ``quorum.core.messages`` request), or
        :class:`TransportError`."""
        ...

    async def close(self) -> None: ...


class RpcHandler(Protocol):
    """Server side: the node's RPC entry (``POST /raft/v1/{path}``)."""

    async def handle_rpc(
        self, path: str, body: bytes, peer: object | None = None, decoded: object | None = None
    ) -> bytes | wire.Frame:
        """Decode ``body`` as the request named by ``path``, step it into the core, return the
        encoded response (a large one as a ``wire.Frame``, its two parts unjoined). ``peer``:
        what the server's authentication learned about the caller (None without TLS);
        ``decoded``: the request already decoded from ``body`` by the server's authorization
        middleware (TLS), used instead of decoding it again when it is of the type ``path``
        names. Raises ``KraftError`` (INVALID_REQUEST for bad input)."""
        ...


# The largest response body accepted: one Fetch's records (wire.MAX_BYTES, served whole up to a
# batch) behind a header.
MAX_RESPONSE_BYTES = 2 * wire.MAX_BYTES + wire.MAX_HEADER + 4


async def _read_body(r: aiohttp.ClientResponse) -> bytes | bytearray:
    """The response body, copied once into a buffer of its announced length:
    ``ClientResponse.read`` joins the received pieces twice, two copies of every megabyte a
    catch-up Fetch brings. Without a Content-Length, ``read`` as before."""
    n = r.content_length
    if n is None:
        return await r.read()
    if n > MAX_RESPONSE_BYTES:
        raise TransportError(f"response of {n} bytes is larger than {MAX_RESPONSE_BYTES}")
    buf = bytearray(n)
    view = memoryview(buf)
    pos = 0
    while pos < n:
        chunk, _end = await r.content.readchunk()
        if not chunk:
            if r.content.at_eof():
                break
            continue
        if pos + len(chunk) > n:
            raise TransportError(f"response body runs past its Content-Length {n}")
        view[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
    if pos != n:
        raise TransportError(f"response body ended after {pos} of {n} bytes")
    return buf  # the Fetch records become a view of it (quorum.runtime.wire)


def _decode_response(request: Any, body: bytes | bytearray) -> Any:
    try:
        return wire.decode(m.RESPONSE_FOR[type(request)], body)
    except KraftError as e:
        raise TransportError(f"undecodable {m.RPC_PATHS[type(request)]} response: {e.message}") from None


class HttpTransport:
    """aiohttp client for ``POST {scheme}://{endpoint}/raft/v1/{rpc}``.

    ``ssl_context``: None for plaintext (loopback), else the client context of this node
    (it presents the node certificate and verifies the cluster CA)."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext | None = None,
        peer_check: PeerCheck | None = None,
        limit_per_host: int = 64,
        server_hostname: Callable[[int], str] | None = None,
    ) -> None:
        self.ssl_context = ssl_context
        self.peer_check = peer_check
        # The TLS name the destination replica's certificate must carry
        # (quorum.security.pki.peer_hostname), so the handshake itself refuses any other replica
        self.server_hostname = server_hostname
        self.scheme = "https" if ssl_context is not None else "http"
        self._limit_per_host = limit_per_host
        self._session: aiohttp.ClientSession | None = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Created on first use so that it belongs to the running event loop.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0,
                    limit_per_host=self._limit_per_host,
                    keepalive_timeout=30,
                    ssl=self.ssl_context if self.ssl_context is not None else True,
                ),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    async def send(self, destination_id: int, endpoint: str, request: Any, timeout_s: float) -> Any:
        path = m.RPC_PATHS[type(request)]
        try:
            async with self._sess().post(
                f"{self.scheme}://{endpoint}/raft/v1/{path}",
                data=wire.encode(request),
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                server_hostname=self.server_hostname(destination_id) if self.server_hostname else None,
            ) as r:
                if self.peer_check is not None:
                    conn = r.connection
                    tr = conn.transport if conn is not None else None
                    self.peer_check(destination_id, tr.get_extra_info("peercert") if tr else None)
                body = await _read_body(r) if r.status == 200 else await r.read()
                if r.status != 200:
                    raise TransportError(f"HTTP {r.status}: {body[:200]!r}")
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise TransportError(f"{type(e).__name__}: {e}") from None
        return _decode_response(request, body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class InProcessTransport:
    """Delivers requests to :class:`RpcHandler` objects registered by endpoint, through the
    same wire encoding as HTTP (so a test still exercises encode and decode). An endpoint with
    no handler, or :meth:`cut` off, behaves like a refused connection."""

    def __init__(self) -> None:
        self.handlers: dict[str, RpcHandler] = {}
        self.down: set[str] = set()

    def register(self, endpoint: str, handler: RpcHandler) -> None:
        self.handlers[endpoint] = handler

    def cut(self, endpoint: str, down: bool = True) -> None:
        """Make ``endpoint`` unreachable (or reachable again)."""
        (self.down.add if down else self.down.discard)(endpoint)

    async def send(self, destination_id: int, endpoint: str, request: Any, timeout_s: float) -> Any:
        handler = self.handlers.get(endpoint)
        if handler is None or endpoint in self.down:
            raise TransportError(f"connection refused: nothing serves {endpoint}")
        try:
            out = await asyncio.wait_for(
                handler.handle_rpc(m.RPC_PATHS[type(request)], wire.encode(request)), timeout_s
            )
            body = bytes(out)
        except TimeoutError:
            raise TransportError(f"no answer from {endpoint} in {timeout_s:.1f}s") from None
        except KraftError as e:
            status = 503 if e.code is ErrorCode.REQUEST_TIMED_OUT else 400
            raise TransportError(f"HTTP {status}: {e.code.value}: {e.message}") from None
        return _decode_response(request, body)

    async def close(self) -> None:
        self.handlers.clear()

"""Peer streams: node-to-node RPCs over one persistent, mutually authenticated connection per
peer, with length-prefixed binary frames instead of an HTTP request per Fetch.

The anchors are etcd's peer streams (a long-lived stream per peer, messages framed on it) and
Kafka's controller listener (Raft RPCs on a persistent, authenticated connection). The stream
is a WebSocket upgraded from the node's existing HTTPS listener (``GET /raft/v1/stream``,
subprotocol :data:`SUBPROTOCOL`): the same port, certificate and NetworkPolicy as before, and
WebSocket framing gives the length prefix (RFC 6455 section 5.2). One frame is one binary
message:

* request ``b"Q" | u16 LE rpc | u32 LE id | body``: ``rpc`` indexes :data:`RPCS`, ``id`` is this
  stream's correlation of the answer (several requests are in flight at once: a Fetch
  long-poll beside a Vote), ``body`` the :mod:`quorum.runtime.wire` encoding of the request;
* answer ``b"A" | u16 LE status | u32 LE id | body``: status 0 and the wire encoding of the
  response, or an HTTP-like status (400, 403, 503) and ``error_code: message`` in UTF-8.

Checks, as on the HTTP path: the upgrade is accepted only from a certificate naming a replica
of this cluster (:func:`quorum.security.auth.principal_of`, the certificate's identity parsed
by :class:`quorum.security.tlsctx.PeerIdentities`); every request frame is decoded strictly
and :func:`quorum.security.auth.authorize` binds the replica id it claims
(:func:`~quorum.security.auth.rpc_sender`) to the certificate, before the core sees it. A
malformed frame (unknown kind or RPC, short, a text frame, a reused id, more than
:data:`MAX_IN_FLIGHT` at once, larger than the limits below) closes the stream with a
WebSocket policy or protocol error; a refused request is answered with its status.

Rolling upgrades: a node of an older version has no stream route and refuses the upgrade
(400, 404 or 405): :class:`StreamTransport` then sends to that peer over per-request HTTP (the
fallback transport) and tries the upgrade again after :data:`RETRY_UPGRADE_S`. Older nodes keep
calling ``POST /raft/v1/{rpc}``, which every version serves.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.runtime.transport import MAX_RESPONSE_BYTES, PeerCheck, Transport, TransportError
from quorum.types import ErrorCode, KraftError

__all__ = [
    "RPCS",
    "STREAM_PATH",
    "SUBPROTOCOL",
    "StreamAuth",
    "StreamTransport",
    "close_streams",
    "serve_stream",
    "tls_stream_auth",
]

log = logging.getLogger(__name__)

STREAM_PATH = "/raft/v1/stream"
SUBPROTOCOL = "kraftkeeper-raft.v1"
# The RPC paths in a fixed order: a frame names its RPC by index (append only: the index is
# part of the protocol version SUBPROTOCOL names).
RPCS: tuple[str, ...] = tuple(
    m.RPC_PATHS[c]
    for c in (
        m.VoteRequest,
        m.BeginQuorumEpochRequest,
        m.EndQuorumEpochRequest,
        m.FetchRequest,
        m.FetchSnapshotRequest,
    )
)
_INDEX = {p: i for i, p in enumerate(RPCS)}
_HEAD = struct.Struct("<cHI")
HEAD_BYTES = _HEAD.size
# A request carries no records: a header of at most wire.MAX_HEADER behind its length prefix.
MAX_REQUEST_FRAME = HEAD_BYTES + 4 + wire.MAX_HEADER
MAX_ANSWER_FRAME = HEAD_BYTES + MAX_RESPONSE_BYTES
MAX_IN_FLIGHT = 64  # as the HTTP transport's connections per peer
RETRY_UPGRADE_S = 30.0
HEARTBEAT_S = 10.0
# The statuses an older node answers the upgrade with: no such route / method, or (TLS) its
# authorization middleware refusing "stream" as an unknown RPC.
_OLD_VERSION_STATUS = frozenset({400, 404, 405})
_STATUS_FOR = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INCONSISTENT_CLUSTER_ID: 400,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.REQUEST_TIMED_OUT: 503,
}

# The server side of a node's RPCs (``Node.handle_rpc``): path, body, principal, decoded.
RpcEntry = Callable[[str, bytes, object | None, object | None], Awaitable[bytes | wire.Frame]]


class StreamAuth:
    """Who may open a stream and send what on it: the same functions the HTTP authorization
    middleware (:mod:`quorum.runtime.middleware`) applies to ``POST /raft/v1/*``."""

    def __init__(self, cluster_id: str) -> None:
        from quorum.security.tlsctx import PeerIdentities

        self.cluster_id = cluster_id
        self.identities = PeerIdentities()

    def connect(self, request: web.Request) -> Any:
        """The caller's principal (a peer of this cluster), or KraftError to refuse."""
        from quorum.security.auth import authorize, principal_of

        if request.headers.get("Authorization") is not None:
            raise KraftError(ErrorCode.PERMISSION_DENIED, "peer streams take node certificates, not tokens")
        principal = principal_of(
            self.identities.of_transport(request.transport), None, cluster_id=self.cluster_id, tokens=None
        )
        if principal.kind != "peer":
            authorize(principal, "POST", "/raft/v1/fetch", None)  # raises PERMISSION_DENIED
        return principal

    def check(self, principal: Any, path: str, msg: Any) -> None:
        """Refuse a request whose claimed sender is not the certificate's replica, or whose
        claimed storage UUID is not the disk the certificate is bound to (the same two checks
        the HTTP middleware makes, so a retired disk's certificate speaks on neither path)."""
        from quorum.security.auth import authorize, check_peer_message, rpc_sender

        authorize(principal, "POST", "/raft/v1/" + path, rpc_sender(msg))
        check_peer_message(principal, msg)


def tls_stream_auth(cluster_id: str) -> StreamAuth:
    return StreamAuth(cluster_id)


def _error_status(e: KraftError) -> int:
    return _STATUS_FOR.get(e.code, 400)


def parse_request(data: bytes) -> tuple[str, int, bytes]:
    """(rpc path, id, body) of a request frame; KraftError(INVALID_REQUEST) naming the fault."""
    if len(data) < HEAD_BYTES:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"stream frame of {len(data)} bytes is too short")
    kind, rpc, rid = _HEAD.unpack_from(data, 0)
    if kind != b"Q":
        raise KraftError(ErrorCode.INVALID_REQUEST, f"stream frame kind {kind!r} is not a request")
    if rpc >= len(RPCS):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"stream frame names unknown RPC number {rpc}")
    return RPCS[rpc], int(rid), data[HEAD_BYTES:]


async def serve_stream(
    request: web.Request, rpc: RpcEntry, auth: StreamAuth | None, open_streams: set[web.WebSocketResponse]
) -> web.StreamResponse:
    """Accept one peer's stream and answer its requests until it closes. ``auth`` None: a
    plaintext node (loopback, named insecure mode), no credential to check. The stream is in
    ``open_streams`` while it runs (:func:`close_streams` at shutdown)."""
    try:
        principal = auth.connect(request) if auth is not None else None
    except KraftError as e:
        log.info("refused a peer stream from %s: %s", request.remote, e.message)
        return web.json_response({"error_code": e.code.value, "message": e.message}, status=_error_status(e))
    ws = web.WebSocketResponse(
        protocols=(SUBPROTOCOL,), max_msg_size=MAX_REQUEST_FRAME, compress=False, autoping=True
    )
    if not ws.can_prepare(request).ok:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{STREAM_PATH} takes a WebSocket upgrade")
    await ws.prepare(request)
    open_streams.add(ws)
    log.info("peer stream from %s opened", principal or request.remote)
    if ws.ws_protocol != SUBPROTOCOL:
        await ws.close(code=aiohttp.WSCloseCode.PROTOCOL_ERROR, message=b"subprotocol required")
        return ws
    busy: dict[int, asyncio.Task[None]] = {}

    async def answer(path: str, rid: int, body: bytes) -> None:
        try:
            cls = wire.REQUEST_BY_PATH[path]
            msg: Any = wire.decode(cls, body)
            if auth is not None:
                auth.check(principal, path, msg)
            out = await rpc(path, body, principal, msg)
            head = _HEAD.pack(b"A", 0, rid)
            # one join of a catch-up answer's parts (the segment bytes are copied once here)
            frame = b"".join((head, out.head, out.raw)) if isinstance(out, wire.Frame) else head + out
        except KraftError as e:
            text = f"{e.code.value}: {e.message}".encode()[:4096]
            frame = _HEAD.pack(b"A", _error_status(e), rid) + text
        finally:
            busy.pop(rid, None)
        if not ws.closed:
            try:
                await ws.send_bytes(frame)
            except ConnectionError:
                pass

    try:
        async for msg in ws:
            if msg.type is aiohttp.WSMsgType.ERROR:  # e.g. larger than max_msg_size: closed (1009)
                log.info("closing the peer stream from %s: %s", principal or request.remote, msg.data)
                break
            if msg.type is not aiohttp.WSMsgType.BINARY:
                await ws.close(code=aiohttp.WSCloseCode.UNSUPPORTED_DATA, message=b"binary frames only")
                break
            try:
                path, rid, body = parse_request(msg.data)
                if rid in busy:
                    raise KraftError(ErrorCode.INVALID_REQUEST, f"stream id {rid} is already in flight")
                if len(busy) >= MAX_IN_FLIGHT:
                    raise KraftError(
                        ErrorCode.INVALID_REQUEST, f"more than {MAX_IN_FLIGHT} requests in flight"
                    )
            except KraftError as e:
                log.info("closing the peer stream from %s: %s", principal or request.remote, e.message)
                await ws.close(code=aiohttp.WSCloseCode.POLICY_VIOLATION, message=e.message.encode()[:120])
                break
            busy[rid] = asyncio.ensure_future(answer(path, rid, body))
    finally:
        open_streams.discard(ws)
        for t in list(busy.values()):
            t.cancel()
    return ws


async def close_streams(open_streams: set[web.WebSocketResponse]) -> None:
    """Close the served streams (the server's shutdown: they would otherwise keep it waiting
    for their handlers); the peers reconnect to another node or fall back."""
    for ws in list(open_streams):
        await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"node shutting down")


class _Stream:
    """One open stream to a peer: its requests in flight by id, and the reader of answers."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.next_id = 1
        self.reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        why = "stream closed"
        try:
            async for msg in self.ws:
                if msg.type is not aiohttp.WSMsgType.BINARY or len(msg.data) < HEAD_BYTES:
                    why = "malformed answer frame"
                    break
                kind, status, rid = _HEAD.unpack_from(msg.data, 0)
                fut = self.pending.pop(rid, None)
                if kind != b"A":
                    why = f"answer frame kind {kind!r}"
                    break
                if fut is not None and not fut.done():
                    fut.set_result((status, msg.data[HEAD_BYTES:]))
            if self.ws.close_code is not None:
                why = f"stream closed ({self.ws.close_code})"
        except (aiohttp.ClientError, OSError) as e:
            why = f"{type(e).__name__}: {e}"
        finally:
            await self.ws.close()
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(TransportError(why))
            self.pending.clear()


class StreamTransport:
    """The client side: a :class:`~quorum.runtime.transport.Transport` that sends each request
    on the destination's stream, opened on first use through ``fallback``'s connection pool
    (same TLS context, server name and peer check), and falls back to ``fallback`` for a peer
    of an older version."""

    def __init__(self, fallback: Any, retry_upgrade_s: float = RETRY_UPGRADE_S) -> None:
        self.fallback = fallback  # an HttpTransport
        self.retry_upgrade_s = retry_upgrade_s
        self._streams: dict[str, _Stream] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._old: dict[str, float] = {}  # endpoint -> when to try the upgrade again
        self.opened = 0  # streams opened (tests and metrics)

    def uses_stream(self, endpoint: str) -> bool:
        s = self._streams.get(endpoint)
        return s is not None and not s.ws.closed

    async def _open(self, destination_id: int, endpoint: str, timeout_s: float) -> _Stream | None:
        s = self._streams.get(endpoint)
        if s is not None and not s.ws.closed:
            return s
        if self._old.get(endpoint, 0.0) > time.monotonic():
            return None
        lock = self._opening.setdefault(endpoint, asyncio.Lock())
        async with lock:
            s = self._streams.get(endpoint)
            if s is not None and not s.ws.closed:
                return s
            fb = self.fallback
            try:
                ws = await fb._sess().ws_connect(
                    f"{'wss' if fb.ssl_context is not None else 'ws'}://{endpoint}{STREAM_PATH}",
                    protocols=(SUBPROTOCOL,),
                    timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                    max_msg_size=MAX_ANSWER_FRAME,
                    autoping=True,
                    # a peer that vanished without closing (no pong within half of it): the
                    # stream is closed and the next request opens a new one
                    heartbeat=HEARTBEAT_S,
                    compress=0,
                    server_hostname=fb.server_hostname(destination_id) if fb.server_hostname else None,
                )
            except aiohttp.WSServerHandshakeError as e:
                if e.status in _OLD_VERSION_STATUS:
                    log.info("%s has no peer stream (HTTP %s): per-request HTTP to it", endpoint, e.status)
                    self._old[endpoint] = time.monotonic() + self.retry_upgrade_s
                    return None
                raise TransportError(f"stream upgrade refused: HTTP {e.status} {e.message}") from None
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                raise TransportError(f"{type(e).__name__}: {e}") from None
            check: PeerCheck | None = fb.peer_check
            if check is not None:
                tr = ws.get_extra_info("peercert")
                try:
                    check(destination_id, tr)
                except TransportError:
                    await ws.close()
                    raise
            s = _Stream(ws)
            s.reader = asyncio.ensure_future(s.read())
            self._streams[endpoint] = s
            self.opened += 1
            return s

    async def send(self, destination_id: int, endpoint: str, request: Any, timeout_s: float) -> Any:
        path = m.RPC_PATHS[type(request)]
        s = self._streams.get(endpoint)
        if s is None or s.ws.closed:
            # Only opening a stream needs a task (wait_for of a coroutine); the hot path, an
            # open stream, goes straight to the send.
            s = await asyncio.wait_for(self._open(destination_id, endpoint, timeout_s), timeout_s)
        if s is None:
            return await self.fallback.send(destination_id, endpoint, request, timeout_s)
        rid = s.next_id
        s.next_id = rid + 1 if rid < 0xFFFFFFFF else 1
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        s.pending[rid] = fut
        try:
            await s.ws.send_bytes(_HEAD.pack(b"Q", _INDEX[path], rid) + wire.encode(request))
            # asyncio.timeout rather than wait_for: the answer wakes this task directly, one
            # loop turn sooner (wait_for relays a future's result through a waiter of its own).
            async with asyncio.timeout(timeout_s):
                status, body = await fut
        except TimeoutError:
            raise TransportError(f"no answer to {path} from {endpoint} in {timeout_s:.1f}s") from None
        except (aiohttp.ClientError, OSError, RuntimeError) as e:
            raise TransportError(f"{type(e).__name__}: {e}") from None
        finally:
            s.pending.pop(rid, None)
        if status != 0:
            raise TransportError(f"HTTP {status}: {bytes(body[:200]).decode(errors='replace')}")
        try:
            return wire.decode(m.RESPONSE_FOR[type(request)], body)
        except KraftError as e:
            raise TransportError(f"undecodable {path} response: {e.message}") from None

    async def close(self) -> None:
        for s in list(self._streams.values()):
            await s.ws.close()
            if s.reader is not None:
                await s.reader
        self._streams.clear()
        await self.fallback.close()


def _transport_type_check(t: StreamTransport) -> Transport:
    return t

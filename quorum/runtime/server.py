"""The node's aiohttp application: node-to-node RPCs, the client API, the admin API, metrics
and health endpoints (contract: ``docs/reference.md`` and ``docs/design.md``).

Handlers are thin: they parse and validate input, call the node through the
:class:`~quorum.runtime.api.NodeApi` protocol (never the ``Node`` class: no import cycle) and
turn :class:`~quorum.types.KraftError` into the JSON error body with the right status. Every
error body is ``{"error_code": ..., "message": ...}`` (plus the leader hint for 421).

Where TLS and authentication plug in: :func:`build_app` takes extra ``middlewares``
(run before the handlers, after the error mapping, so their KraftErrors get the same JSON
body); the authorization middleware (``quorum.runtime.middleware``) binds a raft RPC's claimed
sender to the caller's certificate before the RPC handler runs.
:func:`start_server` takes the server ``ssl.SSLContext``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import unquote_to_bytes

from aiohttp import web
from aiohttp.typedefs import Middleware

from quorum.runtime.api import NodeApi
from quorum.runtime.guard import GuardedProtocol
from quorum.runtime.limits import (
    LIMITS_KEY,
    Limits,
    body_middleware,
    connection_middleware,
)
from quorum.runtime.limits import metrics_text as limits_metrics
from quorum.runtime.loopwatch import LoopWatch
from quorum.runtime.middleware import PRINCIPAL_KEY, RPC_MESSAGE_KEY
from quorum.runtime.peerstream import STREAM_PATH, StreamAuth, close_streams, serve_stream
from quorum.strictjson import INT32, get_int, loads_strict
from quorum.types import ErrorCode, KraftError, canonical_uuid

STATUS_FOR: dict[ErrorCode, int] = {
    ErrorCode.NOT_LEADER: 421,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INCONSISTENT_CLUSTER_ID: 400,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.VOTER_ALREADY_ADDED: 409,
    ErrorCode.VOTER_ALREADY_REMOVED: 409,
    ErrorCode.VOTER_CHANGE_IN_PROGRESS: 409,
    ErrorCode.REASSIGNMENT_IN_PROGRESS: 409,
    ErrorCode.REPLICA_NOT_CAUGHT_UP: 409,
    ErrorCode.NOT_VOTER: 409,
    ErrorCode.REQUEST_TIMED_OUT: 503,
    ErrorCode.LEADERSHIP_LOST: 503,
    ErrorCode.LEADER_RECOVERING: 503,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(err: KraftError) -> web.Response:
    body: dict[str, Any] = {"error_code": err.code.value, "message": err.message}
    body.update(err.extra)
    return web.json_response(body, status=STATUS_FOR.get(err.code, 500))


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except KraftError as e:
        return error_response(e)
    except web.HTTPRequestEntityTooLarge as e:
        return error_response(KraftError(ErrorCode.PAYLOAD_TOO_LARGE, f"request body too large: {e.text}"))
    except web.HTTPMethodNotAllowed as e:
        return web.json_response(
            {
                "error_code": ErrorCode.INVALID_REQUEST.value,
                "message": f"method {request.method} not allowed",
            },
            status=e.status,
        )
    except web.HTTPNotFound:
        return web.json_response(
            {"error_code": ErrorCode.INVALID_REQUEST.value, "message": f"no such endpoint {request.path}"},
            status=404,
        )


async def _json_object(request: web.Request, allowed: set[str], what: str) -> dict[str, Any]:
    """An admin body through the shared strict decoder (deep nesting, duplicate keys,
    NaN are a 400 naming the problem, never a 500)."""
    obj = loads_strict(await request.read(), what)
    if not isinstance(obj, dict):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{what}: body must be a JSON object")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{what}: unknown field(s): {', '.join(unknown)}")
    return obj


def _id_field(obj: dict[str, Any], name: str, what: str) -> int:
    """A replica id: an integer in 0..2**31-1 (KIP-595 schemas: int32)."""
    return get_int(obj, name, what, (0, INT32[1]))


def _uuid_field(value: Any, name: str = "uuid") -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"field {name} must be a UUID string, got {_short(value)}"
        )
    try:
        return canonical_uuid(value)
    except ValueError:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"field {name}: {value!r} is not a UUID") from None


def _short(v: Any) -> str:
    s = repr(v) if not isinstance(v, int) or abs(v) < 10**30 else "<huge integer>"
    return s if len(s) <= 60 else s[:57] + "..."


_KV_PREFIX = "/v1/kv/"


def key_of(request: web.Request) -> str:
    """The key of ``/v1/kv/{key}``, percent-decoded exactly ONCE from the raw path (
    with a second decoding ``%2541`` and ``A`` were the same key), UTF-8 strictly."""
    raw = request.raw_path.split("?", 1)[0]
    if not raw.startswith(_KV_PREFIX) or len(raw) == len(_KV_PREFIX):
        raise KraftError(ErrorCode.INVALID_REQUEST, "missing key in /v1/kv/{key}")
    try:
        return unquote_to_bytes(raw[len(_KV_PREFIX) :]).decode("utf-8")
    except UnicodeDecodeError:
        raise KraftError(ErrorCode.INVALID_REQUEST, "key is not valid UTF-8 once percent-decoded") from None


def _parse_reassign(obj: dict[str, Any]) -> list[int] | None:
    what = "reassign"
    if obj.get("cancel") is True and "voters" not in obj:
        return None
    v = obj.get("voters")
    if not isinstance(v, list) or not v or len(v) > 64:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"{what}: field voters must be a non-empty list of at most 64 replica ids",
        )
    ids = [_id_field({"voters": i}, "voters", what) for i in v]
    if len(set(ids)) != len(ids):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{what}: voters {ids} has duplicates")
    return ids


def offset_response(offset: int) -> web.Response:
    """``{"offset": N}``, the answer to every committed write: formatted as bytes directly (the
    write path's answer; ``web.json_response`` serializes a dict and encodes text, about three
    times the cost), the same body and Content-Type."""
    return web.Response(body=b'{"offset": %d}' % offset, content_type="application/json", charset="utf-8")


def _kv_routes(app: web.Application, node: NodeApi) -> None:
    async def kv_put(request: web.Request) -> web.Response:
        key = key_of(request)
        value = await request.read()
        return offset_response(await node.put(key, value))

    async def kv_get(request: web.Request) -> web.Response:
        key = key_of(request)
        value = await node.get(key)
        if value is None:
            raise KraftError(ErrorCode.NOT_FOUND, f"key {key!r} does not exist")
        return web.Response(body=value, content_type="application/octet-stream")

    async def kv_delete(request: web.Request) -> web.Response:
        return offset_response(await node.delete(key_of(request)))

    app.router.add_put("/v1/kv/{key:.+}", kv_put)
    app.router.add_get("/v1/kv/{key:.+}", kv_get)
    app.router.add_delete("/v1/kv/{key:.+}", kv_delete)


def _admin_routes(app: web.Application, node: NodeApi) -> None:
    async def describe(request: web.Request) -> web.Response:
        return web.json_response(node.describe())

    async def add_voter(request: web.Request) -> web.Response:
        obj = await _json_object(request, {"id", "uuid"}, "add voter")
        result = await node.add_voter(_id_field(obj, "id", "add voter"), _uuid_field(obj.get("uuid")))
        return web.json_response(result)

    async def remove_voter(request: web.Request) -> web.Response:
        raw_id = request.match_info["id"]
        if not raw_id.isascii() or not raw_id.isdigit() or len(raw_id) > 10 or int(raw_id) > INT32[1]:
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"voter id {raw_id[:20]!r} is not an integer in 0..{INT32[1]}"
            )
        vid = int(raw_id)
        result = await node.remove_voter(vid, _uuid_field(request.match_info["uuid"]))
        return web.json_response(result)

    async def reassign(request: web.Request) -> web.Response:
        obj = await _json_object(request, {"voters", "cancel"}, "reassign")
        result = await node.reassign(_parse_reassign(obj))
        return web.json_response(result, status=202)

    app.router.add_get("/v1/quorum/describe", describe)
    app.router.add_post("/v1/quorum/voters", add_voter)
    app.router.add_delete("/v1/quorum/voters/{id}/{uuid}", remove_voter)
    app.router.add_post("/v1/quorum/reassign", reassign)


def _node_routes(app: web.Application, node: NodeApi) -> None:
    """Node-to-node RPCs and the per-node observability endpoints (any role answers)."""

    async def rpc(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        # With TLS the authorization middleware has already decoded the request (to bind the
        # replica id it claims to the certificate): the node takes that message instead of
        # decoding the body a second time (about 51 us per Fetch), and the caller's principal.
        out = await node.handle_rpc(
            request.match_info["rpc"],
            body,
            request.get(PRINCIPAL_KEY),
            decoded=request.get(RPC_MESSAGE_KEY),
        )
        if isinstance(out, bytes):
            return web.Response(body=out, content_type="application/octet-stream")
        # A catch-up response goes out as its header, then the segment bytes as read
        # (no joined copy of 32 MiB here, nor aiohttp's join of headers and body).
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = len(out)
        try:
            await resp.prepare(request)
            await resp.write(out.head)
            await resp.write(out.raw)
            await resp.write_eof()
        except ConnectionError:
            pass  # the caller went away mid-response (a replica killed): aiohttp closes it quietly
        return resp

    async def log_state(request: web.Request) -> web.Response:
        return web.json_response(node.log_state())

    async def metrics(request: web.Request) -> web.Response:
        text = node.metrics_text()
        lim = request.app.get(LIMITS_KEY)
        if lim is not None:
            text = text.rstrip("\n") + "\n" + limits_metrics(lim)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def healthz(request: web.Request) -> web.Response:
        ok, info = node.health()
        return web.json_response(info, status=200 if ok else 503)

    async def readyz(request: web.Request) -> web.Response:
        ok, info = node.readiness()
        return web.json_response(info, status=200 if ok else 503)

    app.router.add_post("/raft/v1/{rpc}", rpc)
    app.router.add_get("/v1/node/log-state", log_state)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def stream_middleware(
    node: NodeApi, auth: StreamAuth | None, open_streams: set[web.WebSocketResponse]
) -> Middleware:
    """Serves the peer stream (:mod:`quorum.runtime.peerstream`) ahead of the HTTP
    authorization middleware: the stream authenticates its caller once and authorizes each of
    its frames with the same functions (``StreamAuth``)."""

    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == STREAM_PATH and request.method == "GET":
            return await serve_stream(request, node.handle_rpc, auth, open_streams)
        return await handler(request)

    return mw


def build_app(
    node: NodeApi,
    *,
    max_body: int,
    middlewares: Sequence[Middleware] = (),
    limits: Limits | None = None,
    stream_auth: StreamAuth | None = None,
) -> web.Application:
    """The node's routes. ``middlewares`` run inside the error mapping (TLS peer
    identity, authentication, authorization); the connection limits wrap everything and the
    body budget runs after authentication (:mod:`quorum.runtime.limits`). The peer stream is
    served when ``stream_auth`` checks its callers, or on a node without authentication
    (no ``middlewares``); otherwise its path falls to the middlewares, which refuse it."""
    lim = limits if limits is not None else Limits()
    lim.max_body = max_body
    streams = lim.peer_streams  # one set: the server closes them, the metrics count them
    serve = stream_auth is not None or not middlewares
    stream = [stream_middleware(node, stream_auth, streams)] if serve else []
    app = web.Application(
        middlewares=[
            connection_middleware(lim),
            errors_middleware,
            *stream,
            *middlewares,
            body_middleware(lim),
        ],
        client_max_size=max_body,
    )
    app[LIMITS_KEY] = lim
    watch = LoopWatch(lim)

    async def watch_loop(app: web.Application) -> AsyncIterator[None]:
        watch.start()
        yield
        watch.stop()

    app.cleanup_ctx.append(watch_loop)

    async def shutdown(app: web.Application) -> None:
        await close_streams(streams)

    app.on_shutdown.append(shutdown)
    _kv_routes(app, node)
    _admin_routes(app, node)
    _node_routes(app, node)
    return app


class _GuardedSite(web.TCPSite):
    """A TCP site whose connections go through :class:`GuardedProtocol` (the connection cap,
    the head and idle deadlines, and TLS handshakes bounded in time and in number at once)."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, limits: Limits, **kw: Any) -> None:
        super().__init__(runner, host, port, **kw)
        self._limits = limits

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        lim = self._limits
        # TLS is started by GuardedProtocol itself, so that handshakes can wait for a slot
        self._server = await asyncio.get_running_loop().create_server(
            lambda: GuardedProtocol(server(), lim, self._ssl_context),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
        )


async def start_server(
    app: web.Application, listen: str, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner:
    """Serve ``app`` on ``listen`` (HOST:PORT); the caller cleans the runner up."""
    lim = app.get(LIMITS_KEY) or Limits()
    # lingering_time 0: aiohttp would otherwise read and throw away what a refused client still
    # sends (up to 10 s); a refused request is answered and its connection closed unread
    # (limits.GuardedProtocol.answer_then_close), so no body is drained at all.
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=lim.idle_timeout_s,
        lingering_time=0,
        # bodies are taken as sent: an encoded one is refused unread (limits._refuse_unread),
        # never inflated by the parser beyond what the body budget counted
        auto_decompress=False,
    )
    await runner.setup()
    host, _, port = listen.rpartition(":")
    site = _GuardedSite(
        runner, host or "0.0.0.0", int(port), lim, reuse_address=True, backlog=1024, ssl_context=ssl_context
    )
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner

"""The node's aiohttp application: node-to-node RPCs, the client API, the admin API, metrics
and health endpoints (contract: ``../shared/interfaces.md`` and ``docs/design.md``).

Handlers are thin: they parse and validate input, call the node through the
:class:`~quorum.runtime.api.NodeApi` protocol (never the ``Node`` class: no import cycle) and
turn :class:`~quorum.types.KraftError` into the JSON error body with the right status. Every
error body is ``{"error_code": ..., "message": ...}`` (plus the leader hint for 421).

Where TLS and authentication plug in (issue 8): :func:`build_app` takes extra ``middlewares``
(run before the handlers, after the error mapping, so their KraftErrors get the same JSON
body); a middleware that authenticates the caller may store the peer's identity in
``request["peer"]``, which the RPC handler passes to ``NodeApi.handle_rpc``.
:func:`start_server` takes the server ``ssl.SSLContext``.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import unquote_to_bytes

from aiohttp import web
from aiohttp.typedefs import Middleware

from quorum.runtime.api import NodeApi
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


async def _json_object(request: web.Request, allowed: set[str]) -> dict[str, Any]:
    raw = await request.read()
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"body is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise KraftError(ErrorCode.INVALID_REQUEST, "body must be a JSON object")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"unknown field(s): {', '.join(unknown)}")
    return obj


def _int_field(obj: dict[str, Any], name: str) -> int:
    v = obj.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"field {name} must be a non-negative integer, got {v!r}")
    return v


def _uuid_field(value: Any, name: str = "uuid") -> str:
    if not isinstance(value, str):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"field {name} must be a UUID string, got {value!r}")
    try:
        return canonical_uuid(value)
    except ValueError:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"field {name}: {value!r} is not a UUID") from None


_KV_PREFIX = "/v1/kv/"


def key_of(request: web.Request) -> str:
    """The key of ``/v1/kv/{key}``, percent-decoded exactly ONCE from the raw path (issue 8:
    with a second decoding ``%2541`` and ``A`` were the same key), UTF-8 strictly."""
    raw = request.raw_path.split("?", 1)[0]
    if not raw.startswith(_KV_PREFIX) or len(raw) == len(_KV_PREFIX):
        raise KraftError(ErrorCode.INVALID_REQUEST, "missing key in /v1/kv/{key}")
    try:
        return unquote_to_bytes(raw[len(_KV_PREFIX) :]).decode("utf-8")
    except UnicodeDecodeError:
        raise KraftError(ErrorCode.INVALID_REQUEST, "key is not valid UTF-8 once percent-decoded") from None


def _parse_reassign(obj: dict[str, Any]) -> list[int] | None:
    if obj.get("cancel") is True and "voters" not in obj:
        return None
    v = obj.get("voters")
    if (
        not isinstance(v, list)
        or not v
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v)
    ):
        raise KraftError(ErrorCode.INVALID_REQUEST, "field voters must be a non-empty list of replica ids")
    if len(set(v)) != len(v):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"voters {v} has duplicates")
    return list(v)


def _kv_routes(app: web.Application, node: NodeApi) -> None:
    async def kv_put(request: web.Request) -> web.Response:
        key = key_of(request)
        value = await request.read()
        offset = await node.put(key, value)
        return web.json_response({"offset": offset})

    async def kv_get(request: web.Request) -> web.Response:
        key = key_of(request)
        value = await node.get(key)
        if value is None:
            raise KraftError(ErrorCode.NOT_FOUND, f"key {key!r} does not exist")
        return web.Response(body=value, content_type="application/octet-stream")

    async def kv_delete(request: web.Request) -> web.Response:
        offset = await node.delete(key_of(request))
        return web.json_response({"offset": offset})

    app.router.add_put("/v1/kv/{key:.+}", kv_put)
    app.router.add_get("/v1/kv/{key:.+}", kv_get)
    app.router.add_delete("/v1/kv/{key:.+}", kv_delete)


def _admin_routes(app: web.Application, node: NodeApi) -> None:
    async def describe(request: web.Request) -> web.Response:
        return web.json_response(node.describe())

    async def add_voter(request: web.Request) -> web.Response:
        obj = await _json_object(request, {"id", "uuid"})
        result = await node.add_voter(_int_field(obj, "id"), _uuid_field(obj.get("uuid")))
        return web.json_response(result)

    async def remove_voter(request: web.Request) -> web.Response:
        try:
            vid = int(request.match_info["id"])
        except ValueError:
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"voter id {request.match_info['id']!r} is not an integer"
            ) from None
        result = await node.remove_voter(vid, _uuid_field(request.match_info["uuid"]))
        return web.json_response(result)

    async def reassign(request: web.Request) -> web.Response:
        obj = await _json_object(request, {"voters", "cancel"})
        result = await node.reassign(_parse_reassign(obj))
        return web.json_response(result, status=202)

    app.router.add_get("/v1/quorum/describe", describe)
    app.router.add_post("/v1/quorum/voters", add_voter)
    app.router.add_delete("/v1/quorum/voters/{id}/{uuid}", remove_voter)
    app.router.add_post("/v1/quorum/reassign", reassign)


def _node_routes(app: web.Application, node: NodeApi) -> None:
    """Node-to-node RPCs and the per-node observability endpoints (any role answers)."""

    async def rpc(request: web.Request) -> web.Response:
        body = await request.read()
        out = await node.handle_rpc(request.match_info["rpc"], body, request.get("peer"))
        return web.Response(body=out, content_type="application/octet-stream")

    async def log_state(request: web.Request) -> web.Response:
        return web.json_response(node.log_state())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=node.metrics_text(), content_type="text/plain", charset="utf-8")

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


def build_app(node: NodeApi, *, max_body: int, middlewares: Sequence[Middleware] = ()) -> web.Application:
    """The node's routes. ``middlewares`` run inside the error mapping (issue 8: TLS peer
    identity, authentication, authorization)."""
    app = web.Application(middlewares=[errors_middleware, *middlewares], client_max_size=max_body)
    _kv_routes(app, node)
    _admin_routes(app, node)
    _node_routes(app, node)
    return app


async def start_server(
    app: web.Application, listen: str, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner:
    """Serve ``app`` on ``listen`` (HOST:PORT); the caller cleans the runner up."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    host, _, port = listen.rpartition(":")
    site = web.TCPSite(
        runner, host or "0.0.0.0", int(port), reuse_address=True, backlog=1024, ssl_context=ssl_context
    )
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner

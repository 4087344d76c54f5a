"""The authorization middleware on a real aiohttp server over real TLS on loopback (a tiny app,
not the node): right status and error_code for every credential, and no handler runs for a
refused request."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.runtime.middleware import PRINCIPAL_KEY, RPC_MESSAGE_KEY, auth_middleware
from quorum.runtime.transport import HttpTransport
from quorum.security.pki import peer_hostname, peercert_dict
from quorum.security.tlsctx import check_peer, client_context, peer_client_context, server_context
from quorum.types import ErrorCode, KraftError
from tests.security.conftest import CLUSTER, Pki


@dataclass
class Server:
    base: str
    calls: list[str] = field(default_factory=list)
    principals: list[Any] = field(default_factory=list)
    transports: list[Any] = field(default_factory=list)  # the connection of each call


@pytest.fixture
async def server(pki: Pki) -> AsyncIterator[Server]:
    srv = Server("")

    async def handler(request: web.Request) -> web.Response:
        srv.calls.append(f"{request.method} {request.path}")
        srv.transports.append(request.transport)
        srv.principals.append(request.get(PRINCIPAL_KEY))
        if RPC_MESSAGE_KEY in request:
            return web.Response(
                body=wire.encode(
                    m.FetchResponse(request[RPC_MESSAGE_KEY].correlation_id, ErrorCode.NONE, 1, 1)
                )
            )
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[auth_middleware(CLUSTER, pki.tokens)])
    app.router.add_get("/healthz", handler)
    app.router.add_get("/metrics", handler)
    app.router.add_post("/raft/v1/{rpc}", handler)
    app.router.add_route("*", "/v1/kv/{key}", handler)
    app.router.add_get("/v1/quorum/describe", handler)
    app.router.add_post("/v1/quorum/voters", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    cert, key = pki.node(1)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(pki.dir / "ca.crt", cert, key))
    await site.start()
    port = runner.addresses[0][1]
    srv.base = f"https://127.0.0.1:{port}"
    try:
        yield srv
    finally:
        await runner.cleanup()


def _ctx(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    return client_context(pki.dir / "ca.crt", cert, key)


def _fetch(replica: int) -> bytes:
    return wire.encode(m.FetchRequest(9, CLUSTER, replica, None, 1, 0, 0, 0, 1024))


async def _call(
    srv: Server, ctx: ssl.SSLContext, method: str, path: str, body: bytes = b"", token: str | None = None
) -> tuple[int, dict[str, Any] | bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, srv.base + path, data=body, headers=headers, ssl=ctx) as r,
    ):
        raw = await r.read()
        if r.content_type == "application/json":
            return r.status, await r.json()
        return r.status, raw


async def test_open_endpoints_need_no_credential(pki: Pki, server: Server) -> None:
    for path in ("/healthz", "/metrics"):
        status, _ = await _call(server, _ctx(pki), "GET", path)
        assert status == 200
    assert server.calls == ["GET /healthz", "GET /metrics"]


@pytest.mark.parametrize(
    ("cred", "method", "path", "body", "status", "code"),
    [
        ("none", "GET", "/v1/kv/a", b"", 401, "UNAUTHENTICATED"),
        ("none", "POST", "/raft/v1/fetch", "fetch2", 401, "UNAUTHENTICATED"),
        ("foreign-node-2", "POST", "/raft/v1/fetch", "fetch2", 401, "UNAUTHENTICATED"),
        ("bad-token", "GET", "/v1/kv/a", b"", 401, "UNAUTHENTICATED"),
        ("node-3", "POST", "/raft/v1/fetch", "fetch2", 403, "PERMISSION_DENIED"),
        ("node-2", "GET", "/v1/kv/a", b"", 403, "PERMISSION_DENIED"),
        ("read", "PUT", "/v1/kv/a", b"v", 403, "PERMISSION_DENIED"),
        ("readwrite", "POST", "/v1/quorum/voters", b"{}", 403, "PERMISSION_DENIED"),
        ("token-read", "DELETE", "/v1/kv/a", b"", 403, "PERMISSION_DENIED"),
        ("admin", "POST", "/raft/v1/fetch", "fetch2", 403, "PERMISSION_DENIED"),
        ("node-2", "POST", "/raft/v1/fetch", b"\x00\x00", 400, "INVALID_REQUEST"),
    ],
)
async def test_refusals_run_no_handler(
    pki: Pki, server: Server, cred: str, method: str, path: str, body: bytes | str, status: int, code: str
) -> None:
    token = None
    if cred in ("none", "bad-token", "token-read"):
        ctx = _ctx(pki)
        token = {"none": None, "bad-token": pki.token["read"] + "x", "token-read": pki.token["read"]}[cred]
    elif cred.startswith("foreign-"):
        d = pki.dir / "foreign"
        ctx = _ctx(pki, d / "node-2.crt", d / "node-2.key")
    elif cred.startswith("node-"):
        ctx = _ctx(pki, *pki.node(int(cred[5:])))
    else:
        ctx = _ctx(pki, *pki.client(cred))
    got_status, got = await _call(server, ctx, method, path, _fetch(2) if body == "fetch2" else body, token)
    assert got_status == status
    assert isinstance(got, dict) and got["error_code"] == code and got["message"]
    assert server.calls == []


@pytest.mark.parametrize(
    ("cred", "method", "path"),
    [
        ("node-2", "POST", "/raft/v1/fetch"),
        ("read", "GET", "/v1/kv/a"),
        ("readwrite", "PUT", "/v1/kv/a"),
        ("admin", "GET", "/v1/quorum/describe"),
        ("token-admin", "POST", "/v1/quorum/voters"),
    ],
)
async def test_allowed_calls_reach_the_handler(
    pki: Pki, server: Server, cred: str, method: str, path: str
) -> None:
    token = pki.token["admin"] if cred == "token-admin" else None
    if token:
        ctx = _ctx(pki)
    elif cred.startswith("node-"):
        ctx = _ctx(pki, *pki.node(2))
    else:
        ctx = _ctx(pki, *pki.client(cred))
    status, got = await _call(
        server, ctx, method, path, _fetch(2) if path.startswith("/raft") else b"{}", token
    )
    assert status == 200
    assert server.calls == [f"{method} {path}"]
    if path.startswith("/raft"):
        assert isinstance(got, bytes) and wire.decode(m.FetchResponse, got).correlation_id == 9
        assert server.principals[0].replica_id == 2


async def test_handshake_refuses_expired_and_foreign_ca_certificates(pki: Pki, server: Server) -> None:
    for d in (pki.dir / "expired", pki.dir / "other-ca"):
        ctx = _ctx(pki, d / "node-2.crt", d / "node-2.key")
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            await _call(server, ctx, "POST", "/raft/v1/fetch", _fetch(2))
    assert server.calls == []


async def test_peer_client_accepts_only_the_replica_it_calls(pki: Pki, server: Server) -> None:
    ctx = peer_client_context(pki.dir / "ca.crt", *pki.node(2))
    async with aiohttp.ClientSession() as s:
        # the server is node 1: calling it as replica 1 works, as replica 3 the handshake fails
        async with s.post(
            server.base + "/raft/v1/fetch", data=_fetch(2), ssl=ctx, server_hostname=peer_hostname(CLUSTER, 1)
        ) as r:
            assert r.status == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with s.post(
                server.base + "/raft/v1/fetch",
                data=_fetch(2),
                ssl=ctx,
                server_hostname=peer_hostname(CLUSTER, 3),
            ):
                pass
    assert server.calls == ["POST /raft/v1/fetch"]


def test_check_peer_on_a_certificate(pki: Pki) -> None:
    cert = peercert_dict(x509.load_pem_x509_certificate(pki.node(1)[0].read_bytes()))
    check_peer(cert, CLUSTER, 1)
    for cluster, replica in ((CLUSTER, 3), ("other", 1)):
        with pytest.raises(KraftError) as e:
            check_peer(cert, cluster, replica)
        assert e.value.code is ErrorCode.UNAUTHENTICATED and "replica/1" in e.value.message
    with pytest.raises(KraftError, match="no certificate"):
        check_peer(None, CLUSTER, 1)


async def test_peer_transport_reuses_one_connection_per_peer(pki: Pki, server: Server) -> None:
    """Node-to-node mutual TLS costs one handshake per peer, not one per RPC: the transport's
    pool keeps the connection to a peer open across RPCs (the node's server answers with
    keep-alive), and concurrent long-polls open at most one connection each."""
    seen: list[object] = []
    app_handler_calls = len(server.calls)
    transport = HttpTransport(
        ssl_context=peer_client_context(pki.dir / "ca.crt", *pki.node(2)),
        server_hostname=lambda replica: peer_hostname(CLUSTER, replica),
    )
    endpoint = server.base.removeprefix("https://")
    try:
        for i in range(20):
            req = m.FetchRequest(i, CLUSTER, 2, None, 1, 0, 0, 0, 1024)
            resp = await transport.send(1, endpoint, req, 10)
            assert isinstance(resp, m.FetchResponse) and resp.correlation_id == i
        seen = list(server.transports)
        assert len(server.calls) - app_handler_calls == 20
        assert len(set(map(id, seen))) == 1, f"{len(set(map(id, seen)))} connections for 20 sequential RPCs"
        reqs = [m.FetchRequest(100 + i, CLUSTER, 2, None, 1, 0, 0, 0, 1024) for i in range(4)]
        await asyncio.gather(*(transport.send(1, endpoint, r, 10) for r in reqs))
        assert len(set(map(id, server.transports))) <= 1 + len(reqs)
    finally:
        await transport.close()

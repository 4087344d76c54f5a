"""The node's real server (``build_app`` + ``start_server`` with the authorization middleware)
over real TLS: a node-to-node request is decoded once, by the middleware, and the node gets
that message and the caller's principal (before, ``handle_rpc`` decoded the body again and its
``peer`` was always None)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from quorum.core import messages as m
from quorum.runtime import middleware as mw
from quorum.runtime import wire
from quorum.runtime.server import build_app, start_server
from quorum.security.auth import PEER, Principal
from quorum.security.tlsctx import client_context, server_context
from quorum.types import ErrorCode
from tests.security.conftest import CLUSTER, Pki


class RpcStub:
    """Just the RPC entry of ``NodeApi``: records what the server hands it."""

    node_id = 1

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, Any, Any]] = []

    async def handle_rpc(
        self, path: str, body: bytes, peer: object | None = None, decoded: object | None = None
    ) -> bytes:
        self.calls.append((path, body, peer, decoded))
        cid = decoded.correlation_id if isinstance(decoded, m.FetchRequest) else 0
        return wire.encode(m.FetchResponse(cid, ErrorCode.NONE, 1, 1))


@pytest.fixture
async def served(pki: Pki) -> AsyncIterator[tuple[RpcStub, str]]:
    stub = RpcStub()
    app = build_app(stub, max_body=1024 * 1024, middlewares=[mw.auth_middleware(CLUSTER, pki.tokens)])  # type: ignore[arg-type]
    cert, key = pki.node(1)
    runner = await start_server(app, "127.0.0.1:0", server_context(pki.dir / "ca.crt", cert, key))
    try:
        yield stub, f"https://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_tls_rpc_is_decoded_once_and_the_node_gets_the_principal(
    pki: Pki, served: tuple[RpcStub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stub, base = served
    decoded: list[Any] = []
    real_decode = wire.decode

    def counting_decode(cls: Any, body: bytes) -> Any:
        msg = real_decode(cls, body)
        decoded.append(msg)
        return msg

    monkeypatch.setattr(mw.wire, "decode", counting_decode)
    body = wire.encode(m.FetchRequest(7, CLUSTER, 2, None, 1, 0, 0, 0, 1024))
    ctx = client_context(pki.dir / "ca.crt", *pki.node(2))
    async with aiohttp.ClientSession() as s, s.post(f"{base}/raft/v1/fetch", data=body, ssl=ctx) as r:
        assert r.status == 200, await r.text()
        resp = real_decode(m.FetchResponse, await r.read())
    assert resp.correlation_id == 7
    assert len(decoded) == 1, "the middleware decodes the request exactly once"
    [(path, got_body, peer, msg)] = stub.calls
    assert (path, got_body) == ("fetch", body)
    assert msg is decoded[0], "the node gets the middleware's message, not a second decoding"
    assert isinstance(peer, Principal) and peer.kind == PEER and peer.replica_id == 2


async def test_a_plaintext_rpc_leaves_decoding_to_the_node() -> None:
    """Without TLS there is no middleware: the node gets the body and decodes it itself."""
    stub = RpcStub()
    app = build_app(stub, max_body=1024 * 1024)  # type: ignore[arg-type]
    runner = await start_server(app, "127.0.0.1:0")
    try:
        body = wire.encode(m.FetchRequest(3, CLUSTER, 2, None, 1, 0, 0, 0, 1024))
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/raft/v1/fetch"
        async with aiohttp.ClientSession() as s, s.post(url, data=body) as r:
            assert r.status == 200
    finally:
        await runner.cleanup()
    assert stub.calls == [("fetch", body, None, None)]

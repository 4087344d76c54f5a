"""A large RPC response leaves the server in two parts: the length-prefixed JSON
header, then the segment bytes as read (``wire.Frame``), with no joined copy of the body on
the leader's event loop. The client still receives the one body the wire format defines, byte
for byte; small responses are sent joined, as before."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest
from aiohttp import web

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.runtime.server import build_app, start_server
from quorum.runtime.transport import HttpTransport, InProcessTransport
from quorum.types import ErrorCode
from testkit.polling import async_wait_until


def _response(cid: int, size: int) -> m.FetchResponse:
    return m.FetchResponse(cid, ErrorCode.NONE, 1, 3, high_watermark=99, records=os.urandom(size))


class FrameStub:
    """The RPC entry of ``NodeApi`` only: answers every Fetch with ``records`` of ``size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sent: list[bytes | wire.Frame] = []

    async def handle_rpc(
        self, path: str, body: bytes, peer: object | None = None, decoded: object | None = None
    ) -> bytes | wire.Frame:
        req = wire.decode(m.FetchRequest, body)
        out = wire.encode_body(_response(req.correlation_id, self.size))
        self.sent.append(out)
        return out


def test_encode_body_keeps_large_records_apart() -> None:
    big, small = _response(1, wire.FRAME_MIN_RAW), _response(2, wire.FRAME_MIN_RAW - 1)
    frame = wire.encode_body(big)
    assert isinstance(frame, wire.Frame) and frame.raw is big.records  # not copied
    assert bytes(frame) == wire.encode(big) and len(frame) == len(wire.encode(big))
    assert wire.decode(m.FetchResponse, bytes(frame)) == big
    assert wire.encode_body(small) == wire.encode(small)  # joined: one small write


async def _over_http(size: int) -> tuple[FrameStub, list[Any]]:
    stub = FrameStub(size)
    app = build_app(stub, max_body=1024 * 1024)  # type: ignore[arg-type]
    runner = await start_server(app, "127.0.0.1:0")
    transport = HttpTransport()
    try:
        endpoint = f"127.0.0.1:{runner.addresses[0][1]}"
        got = []
        for cid in (5, 6):  # two on one keep-alive connection: the first ended where it should
            req = m.FetchRequest(cid, "c", 2, None, 3, 0, 0, 0, 64 * 1024 * 1024)
            got.append(await transport.send(1, endpoint, req, 30))
        return stub, got
    finally:
        await transport.close()
        await runner.cleanup()


def test_a_framed_response_arrives_whole_over_http() -> None:
    for size in (8 * 1024 * 1024 + 3, 100):
        stub, got = asyncio.run(_over_http(size))
        assert [type(s) is wire.Frame for s in stub.sent] == [size >= wire.FRAME_MIN_RAW] * 2
        for sent, resp in zip(stub.sent, got, strict=True):
            assert isinstance(resp, m.FetchResponse)
            assert wire.encode(resp) == bytes(sent)
            assert len(resp.records) == size and resp.high_watermark == 99


def test_the_in_process_transport_joins_a_frame() -> None:
    async def run() -> Any:
        t = InProcessTransport()
        t.register("n1:1", FrameStub(wire.FRAME_MIN_RAW))  # type: ignore[arg-type]
        return await t.send(1, "n1:1", m.FetchRequest(9, "c", 2, None, 3, 0, 0, 0, 1 << 20), 5)

    resp = asyncio.run(run())
    assert isinstance(resp, m.FetchResponse) and resp.correlation_id == 9
    assert len(resp.records) == wire.FRAME_MIN_RAW


async def _disconnect_mid_response() -> m.FetchResponse:
    stub = FrameStub(48 * 1024 * 1024)
    app = build_app(stub, max_body=1024 * 1024)  # type: ignore[arg-type]
    returned: list[str] = []  # paths whose handler has returned (or raised)

    @web.middleware
    async def note_return(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)  # type: ignore[no-any-return]
        finally:
            returned.append(request.path)

    app.middlewares.append(note_return)
    runner = await start_server(app, "127.0.0.1:0")
    transport = HttpTransport()
    try:
        endpoint = f"127.0.0.1:{runner.addresses[0][1]}"
        body = wire.encode(m.FetchRequest(5, "c", 2, None, 3, 0, 0, 0, 64 * 1024 * 1024))
        reader, writer = await asyncio.open_connection(*endpoint.split(":"))
        head = b"POST /raft/v1/fetch HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
        writer.write(head + body)
        await writer.drain()
        await reader.readexactly(64 * 1024)  # part of the response, then the caller is gone
        writer.transport.abort()

        async def aborted_handler_returned() -> bool:
            return bool(returned)

        await async_wait_until("the aborted response's handler to return", aborted_handler_returned, 30)
        # and the server goes on serving
        req = m.FetchRequest(6, "c", 2, None, 3, 0, 0, 0, 64 * 1024 * 1024)
        resp: m.FetchResponse = await transport.send(1, endpoint, req, 30)
        return resp
    finally:
        await transport.close()
        await runner.cleanup()


def test_a_caller_leaving_mid_response_is_no_server_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        resp = asyncio.run(_disconnect_mid_response())
    assert resp.correlation_id == 6 and len(resp.records) == 48 * 1024 * 1024
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[:2000]

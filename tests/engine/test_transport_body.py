"""The HTTP transport reads a response body with one copy: a multi-megabyte Fetch
response over a real loopback socket arrives whole, its records a view of the received buffer;
a body shorter than its Content-Length, or one announced larger than any Fetch can be, is a
TransportError naming what is wrong (the core then retries), never a short or huge read."""

from __future__ import annotations

import asyncio

import pytest

from quorum.core import messages as m
from quorum.records import encode_batch
from quorum.runtime import wire
from quorum.runtime.transport import MAX_RESPONSE_BYTES, HttpTransport, TransportError
from quorum.types import ErrorCode

PORT = 28411
UUID = "2b1c7f4e-0c59-4a53-9d2a-3c1e8f0a6b11"


def _fetch() -> m.FetchRequest:
    return m.FetchRequest(5, "body-test", 2, UUID, 1, 0, 0, 0, 1 << 20)


def _records() -> bytes:
    out = bytearray()
    for i in range(40):  # 40 batches of 200 KiB: 8 MB
        out += encode_batch(i, 1, [bytes([i]) * (200 * 1024)], 0)
    return bytes(out)


async def _serve(reply: bytes, port: int) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the request headers; the body is not needed
        writer.write(reply)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port)


def _http(body: bytes, length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % n
    return head + body


async def _ask(reply: bytes, port: int) -> m.FetchResponse:
    server = await _serve(reply, port)
    t = HttpTransport()
    try:
        resp: m.FetchResponse = await t.send(1, f"127.0.0.1:{port}", _fetch(), 10)
        return resp
    finally:
        await t.close()
        server.close()
        await server.wait_closed()


def test_a_large_fetch_response_arrives_whole_as_a_view_of_one_buffer() -> None:
    records = _records()
    body = wire.encode(m.FetchResponse(5, ErrorCode.NONE, 1, 1, high_watermark=40, records=records))
    resp = asyncio.run(_ask(_http(body), PORT))
    assert resp.high_watermark == 40 and resp.records == records
    assert isinstance(resp.records, memoryview) and isinstance(resp.records.obj, bytearray)


def test_a_body_shorter_than_its_content_length_is_refused() -> None:
    body = wire.encode(m.FetchResponse(5, ErrorCode.NONE, 1, 1, records=_records()))
    with pytest.raises(TransportError, match=r"ended after|payload is not completed"):
        asyncio.run(_ask(_http(body[:100_000], length=len(body)), PORT + 1))


def test_a_body_announced_larger_than_any_fetch_is_refused_before_reading() -> None:
    with pytest.raises(TransportError, match=f"larger than {MAX_RESPONSE_BYTES}"):
        asyncio.run(_ask(_http(b"x", length=MAX_RESPONSE_BYTES + 1), PORT + 2))

"""The HTTP server over a real single-voter node (real storage, real aiohttp on loopback):
keys are percent-decoded exactly once (``%2541`` and ``A`` were the same key),
invalid UTF-8 is refused with a clear 400, and ``/`` inside a key round-trips as ``%2F``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from yarl import URL

from quorum.runtime import kv as kvmod
from quorum.runtime.config import NodeConfig
from quorum.runtime.node import Node
from quorum.runtime.server import build_app, start_server
from quorum.runtime.transport import InProcessTransport
from quorum.storage.meta import format_dir
from testkit.polling import async_wait_until
from tests.engine.cluster import free_ports


async def _scenario(tmp_path: Path) -> None:
    ep = f"127.0.0.1:{free_ports(1)[0]}"
    format_dir(tmp_path / "n1", "keys", 1)
    node = Node(str(tmp_path / "n1"), ep, {1: ep}, NodeConfig(), InProcessTransport())
    stop = asyncio.Event()
    runner = await start_server(build_app(node, max_body=kvmod.MAX_VALUE_BYTES + 1024), ep)
    task = asyncio.create_task(node.run(stop))
    try:
        async with aiohttp.ClientSession() as s:

            async def call(method: str, raw_path: str, body: bytes | None = None) -> tuple[int, bytes]:
                async with s.request(method, URL(f"http://{ep}{raw_path}", encoded=True), data=body) as r:
                    return r.status, await r.read()

            async def ready() -> bool:
                return (await call("GET", "/readyz"))[0] == 200

            await async_wait_until("the single voter to elect itself", ready, 10, 0.02)

            async def put_acknowledged() -> bool:
                # 503 (the commit wait timed out on a loaded machine) is indeterminate: put again.
                status, body = await call("PUT", "/v1/kv/%2541", b"percent")
                assert status in (200, 503), (status, body)
                return status == 200

            await async_wait_until("the first put acknowledged", put_acknowledged, 60, 0.05)
            assert (await call("GET", "/v1/kv/A"))[0] == 404
            assert await call("GET", "/v1/kv/%2541") == (200, b"percent")
            assert node.applier.kv.get("%41") == b"percent"
            assert (await call("PUT", "/v1/kv/a%2Fb", b"slash"))[0] == 200
            assert await call("GET", "/v1/kv/a%2Fb") == (200, b"slash")
            assert node.applier.kv.get("a/b") == b"slash"
            status, body = await call("PUT", "/v1/kv/%FF", b"x")
            assert status == 400 and b"INVALID_REQUEST" in body and b"UTF-8" in body
    finally:
        stop.set()
        await task
        await runner.cleanup()
        node.close()


def test_keys_are_decoded_once(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))

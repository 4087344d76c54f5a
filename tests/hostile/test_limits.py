"""The server limits of quorum/runtime/limits.py with small bounds, in-process on loopback (a
real aiohttp server, real sockets): the connection cap evicts the oldest half-sent connection,
the head deadline closes stalled connections, the body budget refuses what does not fit with
503 while small bodies still pass, large bodies share the event loop's turns, and /healthz
fails when the driver loop stops turning."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import uvloop

from quorum.runtime import observe
from quorum.runtime.limits import Limits
from quorum.runtime.server import build_app, start_server
from quorum.security.tlsctx import client_context, server_context
from testkit.polling import async_wait_until, now
from tests.engine.cluster import free_ports
from tests.tlsfixtures import make_tls_dir


class StubNode:
    """Just enough of NodeApi for the KV routes and the probes."""

    node_id = 1

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def put(self, key: str, value: bytes) -> int:
        self.data[key] = value
        return len(self.data)

    async def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def health(self) -> tuple[bool, dict[str, Any]]:
        return True, {"status": "ok"}

    def metrics_text(self) -> str:
        return "# TYPE kraftkeeper_stub gauge\nkraftkeeper_stub 1\n"


async def _closed(reader: asyncio.StreamReader, within: float) -> bool:
    """True once the server closed the connection (EOF or reset) within ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            return await reader.read(1024) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def _serve(limits: Limits) -> tuple[Any, str]:
    app = build_app(StubNode(), max_body=1024 * 1024, limits=limits)  # type: ignore[arg-type]
    ep = f"127.0.0.1:{free_ports(1)[0]}"
    return await start_server(app, ep), ep


def test_cap_evicts_the_oldest_half_sent_connection_and_head_deadline_closes() -> None:
    async def go() -> None:
        limits = Limits(max_connections=4, head_timeout_s=1.0)
        runner, ep = await _serve(limits)
        host, _, port = ep.rpartition(":")
        try:
            conns = []
            for _ in range(4):
                r, w = await asyncio.open_connection(host, int(port))
                w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
                conns.append((r, w))
            # wait until all four are admitted before the fifth comes
            admitted = now(lambda: len(limits.guards) >= 4)
            await async_wait_until("all four connections admitted", admitted, 10, 0.01)
            async with aiohttp.ClientSession() as s, s.get(f"http://{ep}/healthz") as resp:
                assert resp.status == 200  # served: the oldest idle connection made room
            assert await _closed(conns[0][0], 5)
            assert limits.refused_connections >= 1
            # the others are closed by the head deadline
            for r, _ in conns[1:]:
                assert await _closed(r, 10)
            for _, w in conns:
                w.close()
        finally:
            await runner.cleanup()

    asyncio.run(go())


def test_body_budget_refuses_large_bodies_but_not_small_ones() -> None:
    async def go() -> None:
        limits = Limits(body_budget=1024 * 1024, small_reserve=256 * 1024, small_body=1024)
        runner, ep = await _serve(limits)
        host, _, port = ep.rpartition(":")
        try:
            # one connection holds a 700 KiB body, minus its last byte
            _, w = await asyncio.open_connection(host, int(port))
            size = 700 * 1024
            w.write(f"PUT /v1/kv/big HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
            w.write(b"x" * (size - 1))
            await w.drain()
            held = now(lambda: limits.buffered > 0)
            await async_wait_until("the held body buffered", held, 10, 0.01)
            async with aiohttp.ClientSession() as s:
                async with s.put(f"http://{ep}/v1/kv/big2", data=b"y" * (200 * 1024)) as resp:
                    body = await resp.json()
                    assert resp.status == 503 and body["error_code"] == "UNAVAILABLE"
                    assert "budget" in body["message"]
                async with s.put(f"http://{ep}/v1/kv/small", data=b"ok") as resp:
                    assert resp.status == 200
            assert limits.refused_bodies == 1
            async with aiohttp.ClientSession() as s, s.get(f"http://{ep}/metrics") as resp:
                text = await resp.text()
            assert "kraftkeeper_http_refused_bodies_total 1\n" in text and "kraftkeeper_stub 1" in text
            w.close()
            released = now(lambda: limits.buffered == 0)
            await async_wait_until("the held body's reservation released", released, 10, 0.01)
        finally:
            await runner.cleanup()

    asyncio.run(go())


def test_body_deadline_answers_408() -> None:
    async def go() -> None:
        limits = Limits(body_timeout_s=0.5)
        runner, ep = await _serve(limits)
        host, _, port = ep.rpartition(":")
        try:
            r, w = await asyncio.open_connection(host, int(port))
            w.write(b"PUT /v1/kv/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            async with asyncio.timeout(10):
                status = await r.readline()
            assert b" 408 " in status, status
            w.close()
        finally:
            await runner.cleanup()

    asyncio.run(go())


def test_refused_bodies_are_answered_then_closed_unread() -> None:
    """Plain TCP: a body over the limit by its Content-Length (413) and one over the budget
    (503) are answered with Connection: close and not read: after the answer the client can
    push no more than the socket buffers before the connection is reset (aiohttp's lingering
    would read all of it), and the server's read counter does not grow by the body."""

    async def refused(ep: str, size: int) -> tuple[bytes, int]:
        host, _, port = ep.rpartition(":")
        r, w = await asyncio.open_connection(host, int(port))
        w.write(f"PUT /v1/kv/big HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
        w.write(b"x" * 4096)
        async with asyncio.timeout(10):  # bounds a server that never answers
            head = await r.readuntil(b"\r\n\r\n")
        pushed = 0
        try:
            async with asyncio.timeout(30):  # bounds a server that neither reads nor closes
                while pushed < size:
                    w.write(b"x" * 65536)
                    await w.drain()
                    pushed += 65536
        except ConnectionError:
            pass
        w.close()
        return head.lower(), pushed

    async def go() -> None:
        limits = Limits(body_budget=1024 * 1024, small_reserve=256 * 1024, small_body=1024)
        runner, ep = await _serve(limits)  # max_body 1 MiB
        try:
            head, pushed = await refused(ep, 256 * 1024 * 1024)
            assert b" 413 " in head and b"connection: close" in head, head
            assert pushed < 16 * 1024 * 1024, f"{pushed} bytes accepted after the answer: drained"
            read_before = limits.read_bytes
            limits.buffered = limits.body_budget  # no room left: the next large body is refused
            head, pushed = await refused(ep, 512 * 1024)
            limits.buffered = 0
            assert b" 503 " in head and b"connection: close" in head, head
            assert limits.read_bytes - read_before < 512 * 1024, "the refused body was read"
            async with aiohttp.ClientSession() as s, s.get(f"http://{ep}/healthz") as resp:
                assert resp.status == 200
        finally:
            await runner.cleanup()

    asyncio.run(go())


def test_healthz_fails_when_the_driver_loop_stops_turning(monkeypatch: Any) -> None:
    runner = SimpleNamespace(turned_at=time.monotonic())
    driver = SimpleNamespace(in_flight=None)
    obs = observe.Observer(1, None, driver, runner, None, None)  # type: ignore[arg-type]
    assert obs.health()[0]
    runner.turned_at = time.monotonic() - observe.LOOP_S - 1
    ok, info = obs.health()
    assert not ok and info["status"] == "wedged" and "has not turned" in info["message"]
    # a persist in flight is the storage rule's business, not this one's
    driver.in_flight = object()
    assert obs.health()[0]


def test_large_bodies_share_loop_turns_and_all_complete() -> None:
    """With a small per-turn quota, eight 1 MiB bodies sent at once are held and resumed turn
    after turn (``ReadTurns``) and every one of them still arrives whole; a small request
    sent meanwhile is answered."""

    async def go() -> None:
        limits = Limits(turn_quota=64 * 1024, body_budget=32 * 1024 * 1024)
        stub = StubNode()
        app = build_app(stub, max_body=2 * 1024 * 1024, limits=limits)  # type: ignore[arg-type]
        ep = f"127.0.0.1:{free_ports(1)[0]}"
        runner = await start_server(app, ep)
        try:
            async with aiohttp.ClientSession() as s:

                async def put(i: int) -> int:
                    body = bytes([i]) * (1024 * 1024)
                    async with s.put(f"http://{ep}/v1/kv/big-{i}", data=body) as resp:
                        return resp.status

                puts = [asyncio.create_task(put(i)) for i in range(8)]
                async with s.get(f"http://{ep}/healthz") as resp:
                    assert resp.status == 200
                assert await asyncio.gather(*puts) == [200] * 8
            assert limits.turns.held > 0, "no connection was ever held: the quota did not apply"
            assert not limits.turns.waiting
            for i in range(8):
                assert stub.data[f"big-{i}"] == bytes([i]) * (1024 * 1024)
        finally:
            await runner.cleanup()

    asyncio.run(go())


def test_tls_handshakes_wait_for_a_turn_and_all_complete(tmp_path: Path) -> None:
    """With two handshakes started per loop turn, 24 TLS connections accepted at once start
    their handshakes a few per turn and every one is answered; under uvloop too, which reads a
    new connection's first bytes (the ClientHello) before the server starts TLS on it."""
    tls = make_tls_dir(tmp_path, nodes=(1,))

    async def go() -> None:
        limits = Limits(handshakes_per_turn=2)
        app = build_app(StubNode(), max_body=1024 * 1024, limits=limits)  # type: ignore[arg-type]
        ep = f"127.0.0.1:{free_ports(1)[0]}"
        runner = await start_server(
            app, ep, server_context(tls / "ca.crt", tls / "node-1.crt", tls / "node-1.key")
        )
        host, _, port = ep.rpartition(":")
        ctx = client_context(tls / "ca.crt")
        try:

            async def probe(sock: socket.socket) -> bytes:
                r, w = await asyncio.open_connection(sock=sock, ssl=ctx, server_hostname=host)
                w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                status = await r.readline()
                w.close()
                return status

            # connected while this loop (the server's too) is busy here: the server accepts all
            # 24 in one turn, a burst
            socks = [socket.create_connection((host, int(port))) for _ in range(24)]
            statuses = await asyncio.gather(*(probe(sock) for sock in socks))
            assert all(b" 200 " in st for st in statuses), statuses
            queued.append(limits.handshake_turns.queued)
            assert not limits.handshaking
        finally:
            await runner.cleanup()

    queued: list[int] = []  # handshakes that waited, per run
    asyncio.run(go())
    uvloop.run(go())
    assert max(queued) > 0, f"no handshake waited for a later turn: {queued}"


def test_silent_tls_clients_do_not_hold_up_other_handshakes(tmp_path: Path) -> None:
    """Twenty connections that open TCP and send half a ClientHello or nothing hold nothing a new
    client needs: its handshake starts in a later turn and it is answered long before the
    silent ones reach their 30 s handshake deadline."""
    tls = make_tls_dir(tmp_path, nodes=(1,))

    async def go() -> None:
        limits = Limits(handshakes_per_turn=1, handshake_timeout_s=30)
        app = build_app(StubNode(), max_body=1024 * 1024, limits=limits)  # type: ignore[arg-type]
        ep = f"127.0.0.1:{free_ports(1)[0]}"
        runner = await start_server(
            app, ep, server_context(tls / "ca.crt", tls / "node-1.crt", tls / "node-1.key")
        )
        host, _, port = ep.rpartition(":")
        silent = []
        try:
            for i in range(20):
                s = socket.create_connection((host, int(port)))
                if i % 2:
                    s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start
                silent.append(s)
            ctx = client_context(tls / "ca.crt")
            async with asyncio.timeout(20):  # generous, and well inside the silent ones' 30 s
                r, w = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=host)
                w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert b" 200 " in await r.readline()
                w.close()
            assert len(limits.handshaking) >= 10, "the silent connections were not all waiting"
        finally:
            for s in silent:
                s.close()
            await runner.cleanup()

    asyncio.run(go())
    uvloop.run(go())

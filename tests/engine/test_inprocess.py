"""The node behind its seams, without HTTP: three real ``Node`` objects (real storage, real
fsync, the one driver) in one event loop, talking through ``InProcessTransport`` (the same
wire encoding as HTTP), called through the ``NodeApi`` protocol the server uses. Shows that
the node needs nothing of aiohttp's server, and that the transport seam carries failover."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from quorum.core.ready import Ready
from quorum.driver import Pending
from quorum.runtime import observe
from quorum.runtime.api import NodeApi
from quorum.runtime.config import NodeConfig
from quorum.runtime.node import Node
from quorum.runtime.transport import InProcessTransport
from quorum.storage.meta import format_dir
from quorum.types import ErrorCode, KraftError

ENDPOINTS = {i: f"node-{i}.test:{9000 + i}" for i in (1, 2, 3)}


async def _until(cond: Callable[[], Awaitable[Any]], what: str, limit_s: float = 30) -> Any:
    async def loop() -> Any:
        while True:
            try:
                v = await cond()
                if v:
                    return v
            except KraftError:
                pass
            await asyncio.sleep(0.02)

    try:
        return await asyncio.wait_for(loop(), limit_s)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def _leader(nodes: dict[int, Node]) -> int | None:
    leaders = [i for i, n in nodes.items() if n.readiness()[1]["role"] == "leader"]
    return leaders[0] if len(leaders) == 1 else None


async def _cluster(tmp_path: Path) -> None:
    transport = InProcessTransport()
    cfg = NodeConfig(raft={"election_timeout_ms": 300, "fetch_timeout_ms": 800}, fsync=True)
    nodes: dict[int, Node] = {}
    stops: dict[int, asyncio.Event] = {}
    tasks: dict[int, asyncio.Task[None]] = {}
    for i, ep in ENDPOINTS.items():
        format_dir(tmp_path / f"n{i}", "inproc", i)
        nodes[i] = Node(str(tmp_path / f"n{i}"), ep, ENDPOINTS, cfg, transport)
        transport.register(ep, nodes[i])
        stops[i] = asyncio.Event()
        tasks[i] = asyncio.create_task(nodes[i].run(stops[i]))
    try:
        api: dict[int, NodeApi] = dict(nodes)  # what the HTTP server sees
        first = await _until(lambda: asyncio.sleep(0, _leader(nodes)), "a leader")
        await _until(lambda: api[first].put("k", b"v1"), "a first committed write")
        assert await api[first].get("k") == b"v1"
        follower = next(i for i in nodes if i != first)
        try:
            await api[follower].put("k", b"no")
            raise AssertionError("a follower accepted a write")
        except KraftError as e:
            assert e.code is ErrorCode.NOT_LEADER
            assert e.extra["leader_id"] == first and e.extra["leader_endpoint"] == ENDPOINTS[first]
        # Cut the leader off the transport: the other two elect a new one and keep the data.
        transport.cut(ENDPOINTS[first])
        second = await _until(
            lambda: asyncio.sleep(0, _leader({i: n for i, n in nodes.items() if i != first})),
            "a new leader among the other two",
        )
        assert second != first
        await _until(lambda: api[second].put("k2", b"v2"), "a write under the new leader")
        assert await api[second].get("k") == b"v1"
        state = api[second].log_state()
        assert state["leader_id"] == second and state["last_epoch"] == state["epoch"] > 1
    finally:
        for i in nodes:
            stops[i].set()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        for n in nodes.values():
            n.close()
        await transport.close()
    for t in tasks.values():
        assert t.exception() is None


def test_three_nodes_in_process_fail_over(tmp_path: Path) -> None:
    asyncio.run(_cluster(tmp_path))


def test_health_fails_when_a_storage_write_stalls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/healthz (issue 8): a Ready whose persist never finishes (a wedged disk) fails the
    liveness probe; the answer never carries the storage UUID."""

    async def go() -> None:
        format_dir(tmp_path / "n1", "inproc", 1)
        node = Node(str(tmp_path / "n1"), ENDPOINTS[1], {1: ENDPOINTS[1]}, NodeConfig(), InProcessTransport())
        try:
            ok, info = node.health()
            assert ok and info == {"status": "ok", "node_id": 1}
            monkeypatch.setattr(observe, "STALL_S", 0.0)
            node.driver.in_flight = Pending(Ready(), None, True)  # persist started, never ends
            node.health()  # first seen now
            await _until(lambda: asyncio.sleep(0, not node.health()[0]), "health to fail")
            ok, info = node.health()
            assert info["status"] == "stalled" and node.local.uuid not in str(info)
            node.driver.in_flight = None
            assert node.health()[0]
        finally:
            node.close()

    asyncio.run(go())

"""The node behind its seams, without HTTP: three real ``Node`` objects (real storage, real
fsync, the one driver) in one event loop, talking through ``InProcessTransport`` (the same
wire encoding as HTTP), called through the ``NodeApi`` protocol the server uses. Shows that
the node needs nothing of aiohttp's server, and that the transport seam carries failover."""

from __future__ import annotations

import asyncio
from pathlib import Path

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
from testkit.polling import now
from tests.engine.inprocess import InProcessCluster, leader_among, until

ENDPOINTS = {i: f"node-{i}.test:{9000 + i}" for i in (1, 2, 3)}


async def _cluster(tmp_path: Path) -> None:
    cfg = NodeConfig(raft={"election_timeout_ms": 300, "fetch_timeout_ms": 800}, fsync=True)
    cluster = InProcessCluster(tmp_path, ENDPOINTS, cfg, "inproc")
    cluster.start_voters()
    nodes, transport = cluster.nodes, cluster.transport
    try:
        api: dict[int, NodeApi] = dict(nodes)  # what the HTTP server sees
        first = await cluster.leader()
        await until(lambda: api[first].put("k", b"v1"), "a first committed write")
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
        second = await until(
            now(lambda: leader_among({i: n for i, n in nodes.items() if i != first})),
            "a new leader among the other two",
        )
        assert second != first
        await until(lambda: api[second].put("k2", b"v2"), "a write under the new leader")
        assert await api[second].get("k") == b"v1"
        state = api[second].log_state()
        assert state["leader_id"] == second and state["last_epoch"] == state["epoch"] > 1
    finally:
        await cluster.close()
    cluster.check_tasks()


def test_three_nodes_in_process_fail_over(tmp_path: Path) -> None:
    asyncio.run(_cluster(tmp_path))


def test_health_fails_when_a_storage_write_stalls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/healthz: a Ready whose persist never finishes (a wedged disk) fails the
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
            await until(now(lambda: not node.health()[0]), "health to fail")
            ok, info = node.health()
            assert info["status"] == "stalled" and node.local.uuid not in str(info)
            node.driver.in_flight = None
            assert node.health()[0]
        finally:
            node.close()

    asyncio.run(go())

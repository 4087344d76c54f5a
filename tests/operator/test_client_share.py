"""quorum/client.py gives each address a share of the timeout to connect (one
unreachable pod address could take the operator's whole 3 s describe timeout, so status went stale
while a pod restarted). A real blackhole on loopback: a listening socket whose accept queue is
full, so the kernel drops further SYNs and a connect hangs, next to a live node."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorum.client import QuorumClient
from testkit.polling import ANY_ERROR, wait_until
from tests.operator.operator_nodes import LocalCluster, engine_missing


@pytest.fixture
def blackhole() -> Iterator[str]:
    """HOST:PORT of a listener that never accepts, its queue filled: connects there hang."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(0)
    port = lst.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(16):  # the queue holds backlog + 1; fill until a connect hangs
            s = socket.socket()
            s.settimeout(0.5)
            fillers.append(s)
            try:
                s.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        else:
            pytest.skip("this kernel never drops a SYN on a full accept queue (no blackhole to test with)")
        yield f"127.0.0.1:{port}"
    finally:
        for s in fillers:
            s.close()
        lst.close()


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_describe_answers_from_the_live_node_next_to_a_blackhole(tmp_path: Path, blackhole: str) -> None:
    c = LocalCluster(tmp_path / "nodes", 1, insecure=True)
    try:
        live = c.endpoint(1)
        wait_until(
            "the node leads",
            lambda: (x := c.describe()) is not None and x["leader_id"] == 1,
            90,
            errors=ANY_ERROR,
        )

        async def run() -> tuple[dict[str, object], dict[str, object]]:
            # The blackhole first: without a per-address share its connect takes the whole 3 s
            # and the describe fails with no time left for the live node.
            async with QuorumClient([blackhole, live], timeout=3.0) as client:
                first = await client.describe()
                client._leader = None  # forget the leader: the bootstrap order decides again
                assert client._candidates() == [live, blackhole]  # the slow address goes last
                second = await client.describe()
                return first, second

        first, second = asyncio.run(run())
        assert first["leader_id"] == 1 and second["leader_id"] == 1
    finally:
        c.stop()

"""Shared setup for in-process cluster tests: real ``Node`` objects (real storage, real fsync,
the one driver) in one event loop, talking through ``InProcessTransport`` (the same wire
encoding as HTTP). Used by test_inprocess.py, test_catchup_offloop.py and test_catchup_fetch.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from quorum.runtime.config import NodeConfig
from quorum.runtime.node import Node
from quorum.runtime.transport import InProcessTransport
from quorum.storage.meta import format_dir
from quorum.types import KraftError
from testkit.polling import async_wait_until, now


async def until(cond: Callable[[], Awaitable[Any]], what: str, limit_s: float = 60) -> Any:
    """Poll ``cond`` (a KraftError counts as "not yet") until it returns something truthy."""
    return await async_wait_until(what, cond, limit_s, 0.02, errors=(KraftError,))


def leader_among(nodes: Mapping[int, Node]) -> int | None:
    """The one node of ``nodes`` that says it leads, or None (none, or more than one)."""
    leaders = [i for i, n in nodes.items() if n.readiness()[1]["role"] == "leader"]
    return leaders[0] if len(leaders) == 1 else None


class InProcessCluster:
    """Nodes started in this event loop with :meth:`start`; :meth:`close` stops them all."""

    def __init__(self, tmp_path: Path, voters: dict[int, str], cfg: NodeConfig, cluster_id: str) -> None:
        self.tmp_path = tmp_path
        self.voters = voters
        self.cfg = cfg
        self.cluster_id = cluster_id
        self.transport = InProcessTransport()
        self.nodes: dict[int, Node] = {}
        self.stops: dict[int, asyncio.Event] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def start(self, i: int, endpoint: str | None = None) -> Node:
        """Format ``n{i}`` and run a node there (a voter's endpoint unless one is given)."""
        ep = endpoint if endpoint is not None else self.voters[i]
        format_dir(self.tmp_path / f"n{i}", self.cluster_id, i)
        node = self.nodes[i] = Node(str(self.tmp_path / f"n{i}"), ep, self.voters, self.cfg, self.transport)
        self.transport.register(ep, node)
        self.stops[i] = asyncio.Event()
        self.tasks[i] = asyncio.create_task(node.run(self.stops[i]))
        return node

    def start_voters(self) -> None:
        for i in self.voters:
            self.start(i)

    async def leader(self, among: Mapping[int, Node] | None = None) -> int:
        return int(await until(now(lambda: leader_among(among or self.nodes)), "a leader"))

    async def close(self) -> None:
        for s in self.stops.values():
            s.set()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        for n in self.nodes.values():
            n.close()
        await self.transport.close()

    def check_tasks(self) -> None:
        """Every node's run task ended without an exception."""
        for t in self.tasks.values():
            assert t.exception() is None

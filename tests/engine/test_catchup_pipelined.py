"""Pipelined log catch-up end to end: three real nodes (real storage, real fsync) in
one event loop commit a backlog of distinct keys; a fourth node with an empty disk catches up
through many small Fetches. Some of its Fetches leave before the batch they follow is fsynced
(they claim committed records only: the rule of ``quorum.core.replication``), none claims
beyond both its fsynced end and its high watermark, its fsyncs are batched (one per 128 KiB
of fetched batches while below the leader's high watermark), and at the end its map and its log
bytes equal the leader's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quorum.core.messages import FetchRequest
from quorum.core.ready import Outbound
from quorum.driver.ports import Transport
from quorum.runtime.config import NodeConfig
from quorum.runtime.node import Node
from testkit.polling import now
from tests.engine.inprocess import InProcessCluster, until

VOTERS = {i: f"node-{i}.test:{28200 + i}" for i in (1, 2, 3)}
OBSERVER = "node-4.test:28204"
VALUE = bytes(range(256)) * 16  # 4 KiB


class ClaimRecorder:
    """Wraps a node's driver transport: (fetch offset, fsynced end, high watermark) of every
    Fetch as it leaves."""

    def __init__(self, node: Node, inner: Transport) -> None:
        self.node, self.inner = node, inner
        self.claims: list[tuple[int, int, int]] = []

    def send(self, out: Outbound) -> None:
        if isinstance(out.message, FetchRequest):
            node = self.node
            self.claims.append((out.message.fetch_offset, node.log.flushed_end_offset, node.core.hw))
        self.inner.send(out)


async def _scenario(tmp_path: Path) -> None:
    cfg = NodeConfig(
        # small fetches (also while far behind): the backlog takes dozens of them; an fsync per
        # 128 KiB of them (batched catch-up fsyncs, quorum.core.catchup)
        raft={"election_timeout_ms": 300, "fetch_timeout_ms": 800, "fetch_max_bytes": 32 * 1024,
              "catchup_fetch_max_bytes": 32 * 1024, "catchup_flush_bytes": 128 * 1024},
        fsync=True,
        snapshot_bytes=1 << 30,  # no snapshot: the log itself is fetched
    )
    cluster = InProcessCluster(tmp_path, VOTERS, cfg, "pipelined")
    cluster.start_voters()
    try:
        lead = cluster.nodes[await cluster.leader()]
        for k in range(300):  # 1.2 MB of distinct keys
            await until(lambda k=k: lead.put(f"key-{k:04d}", VALUE + k.to_bytes(2, "big")), f"write {k}")
        obs = cluster.start(4, OBSERVER)
        rec = ClaimRecorder(obs, obs.driver.ports.transport)
        obs.driver.ports.transport = rec
        await until(now(lambda: obs.driver.applied_end >= lead.driver.applied_end), "the catch-up")
        await until(now(lambda: obs.log.flushed_end_offset == lead.log.flushed_end_offset), "its fsync")

        expect = {f"key-{k:04d}".encode(): VALUE + k.to_bytes(2, "big") for k in range(300)}
        assert {k: v for k, v in obs.applier.kv.data.items() if k.startswith(b"key-")} == expect
        assert obs.applier.kv.data == lead.applier.kv.data
        end = lead.log.end_offset
        assert obs.log.end_offset == end
        assert obs.log.read(0, 1 << 30, end) == lead.log.read(0, 1 << 30, end)  # byte for byte

        pipelined = [c for c in rec.claims if c[0] > c[1]]
        assert len(rec.claims) > 20, rec.claims
        assert pipelined, "no Fetch left before the batch it follows was fsynced"
        # Batched fsyncs: some claim runs more than one Fetch (at most 8 records of 4 KiB)
        # beyond the fsynced end.
        assert max(off - flushed for off, flushed, _hw in rec.claims) > 8, rec.claims
        assert all(off <= max(flushed, hw) for off, flushed, hw in rec.claims), rec.claims
    finally:
        await cluster.close()
    cluster.check_tasks()


def test_pipelined_catch_up_copies_the_log_byte_for_byte(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))

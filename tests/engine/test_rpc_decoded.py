"""A node-to-node request decoded once (the TLS double decode): the server's
authorization middleware decodes a raft RPC to check the replica id it claims, and hands the
decoded message on; the node takes it instead of decoding the body again, but only when it is a
message of the type the path names (anything else: the body is decoded, strictly, as before)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.runtime.config import NodeConfig
from quorum.types import ErrorCode, KraftError
from tests.engine.inprocess import InProcessCluster

VOTERS = {1: "node-1.test:28301"}


def _fetch(cluster_id: str) -> m.FetchRequest:
    return m.FetchRequest(7, cluster_id, 2, "2b1c7f4e-0c59-4a53-9d2a-3c1e8f0a6b11", 0, 0, 0, 0, 1024)


async def _scenario(tmp_path: Path) -> None:
    cluster = InProcessCluster(tmp_path, VOTERS, NodeConfig(fsync=False), "decoded")
    node = cluster.start(1)
    try:
        # The decoded message is used: the body is not even valid.
        out = await node.handle_rpc("fetch", b"not a body", None, decoded=_fetch("other"))
        resp = wire.decode(m.FetchResponse, out)
        assert resp.correlation_id == 7 and resp.error_code is ErrorCode.INCONSISTENT_CLUSTER_ID
        # A decoded message of another type than the path names: the body is decoded (and refused).
        with pytest.raises(KraftError) as e:
            await node.handle_rpc("vote", b"not a body", None, decoded=_fetch("other"))
        assert e.value.code is ErrorCode.INVALID_REQUEST and "VoteRequest" in e.value.message
        # No decoded message: the body is decoded as before.
        out = await node.handle_rpc("fetch", wire.encode(_fetch("other")), None)
        assert wire.decode(m.FetchResponse, out).error_code is ErrorCode.INCONSISTENT_CLUSTER_ID
    finally:
        await cluster.close()
    cluster.check_tasks()


def test_a_decoded_request_is_not_decoded_again(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))

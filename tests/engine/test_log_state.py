"""``GET /v1/node/log-state``: every node (leader or not) reports what Raft's election
compares, (last epoch, end offset), for the operator's unclean-recovery survivor choice."""

from __future__ import annotations

import pytest

from testkit.polling import ANY_ERROR, wait_until
from tests.engine.cluster import LocalCluster
from tests.engine.http import call

pytestmark = pytest.mark.slow

FIELDS = {"node_id", "last_epoch", "end_offset", "high_watermark", "role", "leader_id", "epoch"}


def test_log_state_served_by_every_node(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    offset = cluster.call(lambda c: c.put("ls", b"1"))

    def states() -> dict[int, dict[str, object]] | None:
        out = {i: call(cluster.endpoint(i), "GET", "/v1/node/log-state") for i in cluster.ports}
        if any(s != 200 for s, _ in out.values()):
            return None
        bodies = {i: b for i, (_s, b) in out.items()}
        # followers learn the high watermark with their next fetch
        return bodies if all(b["high_watermark"] > offset for b in bodies.values()) else None

    got = wait_until("every node's log-state past the write", states, 30, 0.05, errors=ANY_ERROR)
    leader_state = got[leader]
    for i, body in got.items():
        assert set(body) == FIELDS, body
        assert body["node_id"] == i
        assert body["leader_id"] == leader
        assert body["role"] == ("leader" if i == leader else "follower")
        assert body["last_epoch"] == leader_state["epoch"] == body["epoch"]
        assert body["end_offset"] >= body["high_watermark"] > offset
        assert "uuid" not in str(body).lower()

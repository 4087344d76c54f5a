"""Readiness after a restart: a node restarted on its own directory publishes the
role it restored and then its current leader: ``/readyz`` 200, the right leader in its view,
and the leader hint (``leader_id``, ``leader_endpoint``) in its 421 answers, within a fetch
timeout. Before the fix a restarted follower replicated every write yet reported
``unattached`` / leader -1 for good (so Kubernetes kept its pod NotReady).

Each node kind is restarted in turn on one cluster: a follower and the leader, each with
SIGKILL and with SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from testkit.polling import ANY_ERROR, wait_until
from tests.engine.cluster import LocalCluster
from tests.engine.http import call

pytestmark = pytest.mark.slow

FETCH_TIMEOUT_MS = 3000


def _leader_now(c: LocalCluster) -> int | None:
    d = c.describe()
    return d["leader_id"] if d.get("leader_id", -1) >= 0 else None


def _view_ok(c: LocalCluster, i: int) -> dict[str, Any] | None:
    """Node i's published view agrees with the leader describe reports, and its 421 carries
    the hint; None (keep polling) otherwise."""
    leader = _leader_now(c)
    if leader is None:
        return None
    status, ready = call(c.endpoint(i), "GET", "/readyz", timeout=2)
    if status != 200 or ready.get("leader_id") != leader:
        return None
    if i == leader:
        return ready if ready["role"] == "leader" else None
    if ready["role"] != "follower":
        return None
    st, err = call(c.endpoint(i), "PUT", "/v1/kv/readiness-probe", b"x", timeout=2)
    if st != 421 or err.get("leader_id") != leader or err.get("leader_endpoint") != c.endpoint(leader):
        return None
    return {**ready, "hint": err}


def _restart(c: LocalCluster, i: int, sig: int) -> None:
    c.kill(i, sig)
    c.start(i)
    # The bound starts once the node answers at all (start-up is Python imports and storage
    # recovery, not what this test is about) and the quorum has a leader.
    wait_until(
        f"node {i} serving",
        lambda: call(c.endpoint(i), "GET", "/healthz", timeout=2)[0] == 200,
        60,
        0.05,
        errors=ANY_ERROR,
    )
    wait_until("a leader", lambda: _leader_now(c), 60, 0.05, errors=ANY_ERROR)


@pytest.mark.parametrize("kind", ["follower", "leader"])
def test_restarted_node_is_ready_with_the_right_leader(tmp_path: Path, kind: str) -> None:
    with LocalCluster(tmp_path, 3, config={"raft": {"fetch_timeout_ms": FETCH_TIMEOUT_MS}}).up() as c:
        c.leader()
        for sig in (signal.SIGKILL, signal.SIGTERM):
            leader = wait_until("a leader", lambda: _leader_now(c), 60, 0.05, errors=ANY_ERROR)
            i = leader if kind == "leader" else next(n for n in c.ports if n != leader)
            key = f"k-{kind}-{int(sig)}"
            assert c.call(lambda cl, key=key: cl.put(key, b"1")) >= 0
            _restart(c, i, sig)
            view = wait_until(
                f"restarted node {i} ({kind}, signal {int(sig)}) ready with the leader in its view",
                lambda i=i: _view_ok(c, i),
                FETCH_TIMEOUT_MS / 1000,
                0.05,
                errors=ANY_ERROR,
            )
            assert view["ready"] is True
            # And it replicates: a write after the restart reads back from the quorum.
            assert c.call(lambda cl, key=key: cl.put(key + "-after", b"2")) >= 0
            assert c.call(lambda cl, key=key: cl.get(key)) == b"1"

"""Mixed versions during a rolling upgrade, with real processes: two nodes of this tree (peer
streams) and one node running a revision from before peer streams (per-request HTTP only), in
one mutual-TLS cluster. The new nodes talk to each other over a stream and to the old one over
HTTP (its refused upgrade is the signal), the old node's requests are served over HTTP, and
every pair of one old and one new node elects a leader and commits writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorum.types import ErrorCode, KraftError
from testkit.polling import ANY_ERROR, wait_until
from testkit.revision import BaselineTree, export_tree
from tests.engine.cluster import KK
from tests.tlsfixtures import TlsCluster, make_tls_dir

pytestmark = pytest.mark.slow

# The last revision whose nodes speak only per-request HTTP to their peers.
OLD_PROTOCOL_REV = "2c07878"
OLD = 3


class MixedCluster(TlsCluster):
    def __init__(self, root: Path, tls: Path, old: BaselineTree) -> None:
        super().__init__(root, tls)
        self.old = old

    def command(self, i: int) -> tuple[list[str], dict[str, str] | None]:
        if i != OLD:
            return KK, None
        # -P: the working directory (this tree) must not precede the old tree on sys.path
        return [sys.executable, "-P", "-m", "quorum.cli"], {**os.environ, **self.old.env()}


@pytest.fixture
def old_tree(tmp_path: Path) -> BaselineTree:
    try:
        return export_tree(OLD_PROTOCOL_REV, tmp_path / "old")
    except (ValueError, subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"needs the git history with revision {OLD_PROTOCOL_REV} (the old protocol): {e}")


@pytest.fixture
def cluster(tmp_path: Path, old_tree: BaselineTree) -> Iterator[MixedCluster]:
    (tmp_path / "nodes").mkdir()
    (tmp_path / "tls").mkdir()
    c = MixedCluster(tmp_path / "nodes", make_tls_dir(tmp_path / "tls"), old_tree)
    try:
        yield c
    finally:
        c.stop()


def _write(c: MixedCluster, key: str) -> None:
    """Puts ``key`` until one put is acknowledged. A leadership change while the put waits for its
    commit (a node just restarted, a loaded machine) answers LEADERSHIP_LOST or
    REQUEST_TIMED_OUT: the put may or may not have taken effect, and putting the same value
    again is harmless to what this test checks (every key readable with its value)."""

    def put() -> bool:
        try:
            c.call_as("rw.json", lambda q: q.put(key, key.encode()))
        except KraftError as e:
            if e.code not in (ErrorCode.LEADERSHIP_LOST, ErrorCode.REQUEST_TIMED_OUT):
                raise
            return False
        return True

    wait_until(f"an acknowledged put of {key}", put, 90, 0.05, errors=ANY_ERROR)


def test_old_and_new_nodes_in_one_cluster(cluster: MixedCluster) -> None:
    c = cluster
    for i in c.ports:
        c.format(i)
    # the two new nodes first: they elect a leader over a stream
    c.start(1)
    c.start(2)
    leader = c.state(90)["leader_id"]
    assert leader in (1, 2)
    wait_until(
        "a stream between the new nodes",
        lambda: "peer stream from replica" in c.log_text(3 - leader),
        30,
        0.05,
        errors=ANY_ERROR,
    )
    # the old node joins: the new leader reaches it over HTTP, it fetches over HTTP
    c.start(OLD)
    _write(c, "mixed-all")
    wait_until(
        f"node {leader} falling back to HTTP",
        lambda: "has no peer stream" in c.log_text(leader),
        30,
        0.05,
        errors=ANY_ERROR,
    )
    wait_until(
        "the old node caught up",
        lambda: min(v["log_end_offset"] for v in c.state(30)["voters"]) > 0,
        60,
        0.05,
        errors=ANY_ERROR,
    )
    assert "peer stream" not in c.log_text(OLD)
    # each new node with the old one alone: a leader, commits, every key readable
    for down, up in ((1, None), (2, 1)):
        c.kill(down, signal.SIGTERM)
        if up is not None:
            c.start(up)
        d = c.state(90)
        assert d["leader_id"] in (OLD, up or 2), d
        _write(c, f"mixed-without-{down}")
    for key in ("mixed-all", "mixed-without-1", "mixed-without-2"):
        assert c.call_as("read.json", lambda q, key=key: q.get(key)) == key.encode()

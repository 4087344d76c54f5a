"""Regression: a node restarted after a process crash must not count bytes it never fsynced.

The shape, on real processes and real (simulated) disks: follower F1 receives a batch and is
killed before its fsync of it completes (powerfs holds the fsync, then fails it), so the batch
is only in F1's page cache. F1 restarts. A node that takes the log it finds on open for durable
claims the batch in its first Fetch; the leader counts it with its own copy (the other follower
is down), commits it and acknowledges the write. Then F1's disk loses power, the leader dies,
and F1 and the other follower, neither holding the batch, elect a leader that writes over its
offset: an acknowledged write is gone. Opening storage must make what it found durable (fsync)
before the node claims any of it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from testkit.polling import wait_until
from tests.powerloss.cluster import PowerCluster

pytestmark = pytest.mark.slow

# A long fetch timeout keeps the leader leading while F1 is held and restarting (a leader
# without a majority's Fetch for a while resigns, and a restart on a loaded machine may take
# seconds); a long write timeout keeps the held write's client waiting until F1 is back. The
# nodes started for the election at the end take the cluster's usual, short fetch timeout.
CONFIG = {"raft": {"fetch_timeout_ms": 30000}, "client": {"write_timeout_ms": 60000}}


class PendingPut:
    """A put in a thread of its own: its acknowledgement (the offset) or its error."""

    def __init__(self, c: PowerCluster, key: str, value: bytes) -> None:
        self.result: int | BaseException | None = None

        async def go() -> int:
            async with c.client(timeout=90) as q:
                return await q.put(key, value)

        def run() -> None:
            try:
                self.result = asyncio.run(go())
            except BaseException as e:
                self.result = e

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> int:
        self._thread.join(timeout)
        assert isinstance(self.result, int), f"the held write was not acknowledged: {self.result!r}"
        return self.result


def _put(c: PowerCluster, key: str, value: bytes) -> int:
    offset: int = c.call_as("rw.json", lambda q: q.put(key, value))
    return offset


def _get(c: PowerCluster, key: str) -> bytes | None:
    got: bytes | None = c.call_as("rw.json", lambda q: q.get(key))
    return got


def test_restart_after_crash_does_not_count_unsynced_batches(
    power_cluster: Callable[[dict[str, Any]], PowerCluster],
) -> None:
    c = power_cluster(CONFIG)
    for i in c.ports:
        c.start(i)
    leader = int(c.state()["leader_id"])
    f1, f2 = (i for i in c.ports if i != leader)
    _put(c, "before", b"all three")
    c.crash([f2])  # stays down until the election at the end
    _put(c, "leader+f1", b"committed by the leader and f1")

    # F1 writes the next batch to its page cache and is killed inside its fsync.
    disk = c.disks[f1]
    disk.command("hold-sync")
    held = PendingPut(c, "held", b"acknowledged only once f1 restarted")
    wait_until(
        f"node {f1}'s fsync of the new batch held",
        lambda: disk.stats()["held_syncs"] > 0,
        30,
        errors=(Exception,),
    )
    assert disk.stats()["dirty_files"] > 0, "the held batch is not in f1's page cache"
    c.fault(crash=[f1])  # inside its held fsync
    assert held.result is None, f"the write was answered before f1 restarted: {held.result!r}"

    c.start(f1)
    offset = held.join(90)  # counted with f1: acknowledged
    unsynced = disk.stats()["dirty_files"]
    print(f"'held' acknowledged at offset {offset}; node {f1}'s unsynced files at its power loss: {unsynced}")
    c.power_loss([f1])
    c.crash([leader])
    assert c.config_path is not None
    cfg = json.loads(c.config_path.read_text())
    cfg["raft"]["fetch_timeout_ms"] = 1500
    c.config_path.write_text(json.dumps(cfg))
    c.start(f1)
    c.start(f2)
    new_leader = wait_until(
        f"a leader among nodes {f1} and {f2}",
        lambda: (lid := int(c.state()["leader_id"])) != leader and lid,
        90,
        errors=(Exception,),
    )
    _put(c, "after", b"written by the new leader")  # at the held batch's offset, if f1 lost it

    assert _get(c, "held") == b"acknowledged only once f1 restarted", (
        f"the write acknowledged at offset {offset} is lost: node {f1} restarted after a crash, "
        f"counted toward the high watermark with a batch it had never fsynced ({unsynced} of its files "
        f"still unsynced), lost power, and node {new_leader} was elected without the batch"
    )
    for key, value in {"before": b"all three", "leader+f1": b"committed by the leader and f1",
                       "after": b"written by the new leader"}.items():
        assert _get(c, key) == value, f"{key} lost"

"""Power loss, as close as this machine allows: three nodes in the test-only
``log.unflushed_in_memory`` mode, so a SIGKILL loses exactly what a node had not fsynced (its
log bytes live in process memory until the flush; the quorum-state file and snapshots are
written durably anyway). Under a continuous write load from several concurrent clients, a
majority is killed at once in several combinations (the leader and a follower, both followers,
all three), restarted, and every ACKNOWLEDGED write must read back with its value.

Without the mode a killed process's writes survive in the page cache, which is why SIGKILL
chaos alone never showed the Fetch-offset durability hole (a Fetch claiming records not yet fsynced)."""

from __future__ import annotations

import asyncio
import signal
import threading
from functools import partial
from pathlib import Path

import pytest

from quorum.client import QuorumClient
from quorum.types import KraftError
from testkit.polling import ANY_ERROR, async_wait_until, wait_until
from tests.engine.cluster import LocalCluster

pytestmark = pytest.mark.slow

WRITERS = 8


class WriteLoad:
    """``WRITERS`` concurrent clients writing unique keys until stopped; records every write
    the quorum acknowledged (key -> value)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.acked: dict[str, bytes] = {}
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> WriteLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    async def _main(self) -> None:
        async with QuorumClient(self.bootstrap, timeout=5) as c:
            await asyncio.gather(*(self._writer(c, w) for w in range(WRITERS)))

    async def _writer(self, c: QuorumClient, w: int) -> None:
        i = 0
        while not self._stop.is_set():
            key, value = f"w{w}-{i}", f"value {w}/{i}".encode()
            i += 1
            # While the quorum is down the same write is tried again (a put is idempotent).
            await async_wait_until(f"writer {w}: {key} acknowledged, or the writers stopped",
                                   partial(self._put, c, key, value), 600, 0.05)

    async def _put(self, c: QuorumClient, key: str, value: bytes) -> bool:
        if self._stop.is_set():
            return True  # stopping: this write is given up, not acknowledged
        try:
            await c.put(key, value)
        except (KraftError, OSError):
            self.failed += 1  # not acknowledged: may or may not have taken effect
            return False
        self.acked[key] = value
        return True

    def acks(self) -> int:
        return len(self.acked)


async def _read_back(bootstrap: str, expected: dict[str, bytes]) -> dict[str, bytes | None]:
    sem = asyncio.Semaphore(32)
    async with QuorumClient(bootstrap, timeout=30) as c:

        async def one(k: str) -> tuple[str, bytes | None]:
            async with sem:
                return k, await c.get(k)

        return dict(await asyncio.gather(*(one(k) for k in expected)))


def _kill_together(c: LocalCluster, nodes: list[int]) -> None:
    procs = [c.procs[i] for i in nodes]
    for p in procs:  # signal all first: they die as one power cut, not one after the other
        p.send_signal(signal.SIGKILL)
    for i in nodes:
        c.kill(i)  # reaps the process


def test_acknowledged_writes_survive_majority_power_loss(tmp_path: Path) -> None:
    # Small segments and snapshots so that rolls, snapshots and segment deletion happen under
    # the load and the cuts too.
    cfg = {"log": {"unflushed_in_memory": True, "segment_bytes": 4096}, "snapshot": {"max_bytes": 8000}}
    with LocalCluster(tmp_path, 3, config=cfg).up() as c:
        c.leader()
        # Two nodes elect a leader without the third: node 1 may still be starting (a loaded
        # machine), so its start-up warning is waited for, not expected at once.
        wait_until(
            "node 1 logs the test-only power-loss mode",
            lambda: "test-only power-loss mode" in c.log_text(1),
            60,
        )
        with WriteLoad(c.bootstrap) as load:
            for what in ("leader+follower", "followers", "all", "leader+follower"):
                target = load.acks() + 200
                wait_until(
                    f"200 more acknowledged writes before {what!r}",
                    lambda t=target: load.acks() >= t,
                    60,
                    0.05,
                    errors=ANY_ERROR,
                )
                leader = c.leader()
                followers = [i for i in c.ports if i != leader]
                victims = {
                    "leader+follower": [leader, followers[0]],
                    "followers": followers,
                    "all": list(c.ports),
                }[what]
                _kill_together(c, victims)
                for i in victims:
                    c.start(i)
                c.leader(timeout=60)
            target = load.acks() + 100
            wait_until(
                "writes acknowledged after the last restart",
                lambda t=target: load.acks() >= t,
                60,
                0.05,
                errors=ANY_ERROR,
            )
        acked = dict(load.acked)
        got = asyncio.run(_read_back(c.bootstrap, acked))
    lost = sorted(k for k, v in acked.items() if got[k] != v)
    assert not lost, f"{len(lost)} acknowledged writes lost or changed, e.g. {lost[:5]}"
    assert len(acked) >= 900

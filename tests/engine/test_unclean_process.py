"""KIP-704 style unclean recovery with real processes: a majority is gone for good, the
administrator recovers the survivor, which becomes the sole voter, verifies itself, flips to
RECOVERED, and then accepts writes and new voters again."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from quorum.client import QuorumClient
from testkit.polling import ANY_ERROR, wait_until
from tests.engine.cluster import LocalCluster, run_cli

pytestmark = pytest.mark.slow


def test_recover_unclean_survivor_becomes_sole_voter_then_grows(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, 3).up() as c:
        c.leader()

        async def fill() -> None:
            async with QuorumClient(c.bootstrap, timeout=30) as cl:
                for i in range(100):
                    await cl.put(f"u{i}", b"x")

        asyncio.run(fill())
        hw = c.describe()["high_watermark"]
        wait_until(
            "all caught up",
            lambda: all(v["log_end_offset"] >= hw for v in c.describe()["voters"]),
            30,
            0.05,
            errors=ANY_ERROR,
        )
        # Nodes 2 and 3 are lost for good; node 1 survives but is stopped.
        for i in (1, 2, 3):
            c.kill(i)
        shutil.rmtree(c.data_dir(2))
        shutil.rmtree(c.data_dir(3))
        # recover-unclean refuses a directory that is not formatted.
        p = run_cli("quorum", "recover-unclean", "--dir", str(c.data_dir(2)), check=False)
        assert p.returncode != 0 and p.stderr.startswith("NOT_FORMATTED")
        out = run_cli("quorum", "recover-unclean", "--dir", str(c.data_dir(1))).stdout
        assert "UNCLEAN RECOVERY" in out and "sole voter" in out
        c.start(1)
        solo = c.endpoint(1)

        async def describe() -> dict[str, object]:
            async with QuorumClient(solo, timeout=10) as cl:
                return await cl.describe()

        d = wait_until(
            "the survivor to finish recovery",
            lambda: (lambda x: x if x["leader_recovery_state"] == "RECOVERED" else None)(
                asyncio.run(describe())
            ),
            60,
            0.05,
            errors=ANY_ERROR,
        )
        assert d["leader_id"] == 1
        assert [(v["id"], v["uuid"]) for v in d["voters"]] == [(1, c.uuids[1])]  # type: ignore[union-attr]

        async def use() -> list[bytes | None]:
            async with QuorumClient(solo, timeout=30) as cl:
                await cl.put("after", b"recovery")
                return [await cl.get("u5"), await cl.get("after")]

        assert asyncio.run(use()) == [b"x", b"recovery"]
        # A fresh node 2 joins as an observer and can be added again.
        c.format(2, replacement=True)
        c.start(2)

        def observer() -> str | None:
            obs = asyncio.run(describe())["observers"]
            return next((o["uuid"] for o in obs if o["id"] == 2), None)  # type: ignore[union-attr]

        new2 = wait_until("node 2 as an observer", observer, 60, 0.05, errors=ANY_ERROR)
        run_cli("quorum", "add-voter", "--bootstrap", solo, "--id", "2", "--uuid", str(new2), timeout=120)
        assert {v["id"] for v in asyncio.run(describe())["voters"]} == {1, 2}  # type: ignore[union-attr]

"""The data directory guarded, with real processes: one process per directory (a second
``start`` or an offline tool fails at once naming the holder), and damage is not a torn tail (a
node whose last batches were damaged stops with CORRUPT_LOG, never votes, and the quorum keeps
every acknowledged write; with a majority damaged the quorum stops and is brought back from the
undamaged replica). Each test ends with the data and the voter set checked."""

from __future__ import annotations

import asyncio
import random
import re
import stat
import subprocess
import time
from pathlib import Path

import pytest

from quorum.client import QuorumClient
from quorum.storage import METADATA_DIR
from quorum.storage.log import SegmentedLog
from testkit.polling import ANY_ERROR, wait_until
from tests.engine.cluster import KK, LocalCluster, free_ports, run_cli

pytestmark = pytest.mark.slow

KEYS = 60


def _fill(c: LocalCluster, prefix: str) -> dict[str, bytes]:
    acked: dict[str, bytes] = {}

    async def go() -> None:
        async with QuorumClient(c.bootstrap, timeout=30) as cl:
            for i in range(KEYS):
                k, v = f"{prefix}{i}", f"value {i} of {prefix}".encode()
                await cl.put(k, v)
                acked[k] = v

    asyncio.run(go())
    return acked


def _read(endpoint: str, keys: dict[str, bytes]) -> dict[str, bytes | None]:
    async def go() -> dict[str, bytes | None]:
        async with QuorumClient(endpoint, timeout=30) as cl:
            return {k: await cl.get(k) for k in keys}

    return asyncio.run(go())


def _all_caught_up(c: LocalCluster) -> None:
    def done() -> bool:
        d = c.describe()
        return all(v["log_end_offset"] >= d["high_watermark"] for v in d["voters"]) and len(d["voters"]) == 3

    wait_until("every voter caught up", done, 30, 0.05, errors=ANY_ERROR)


def test_one_process_per_data_directory_of_its_own(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, 3).up() as c:
        c.leader()
        acked = _fill(c, "lock")
        holder = c.procs[2].pid
        started = time.monotonic()
        p = subprocess.run(
            [*KK, "start", "--dir", str(c.data_dir(2)), "--listen", f"127.0.0.1:{free_ports(1)[0]}",
             "--voters", c.voters, "--config", str(c.config_path)],
            capture_output=True, text=True, timeout=60,
        )
        assert p.returncode != 0 and time.monotonic() - started < 30
        assert p.stderr.startswith("UNAVAILABLE") and str(c.data_dir(2)) in p.stderr, p.stderr
        assert f"pid {holder}" in p.stderr, p.stderr
        off = run_cli("quorum", "recover-unclean", "--dir", str(c.data_dir(1)), check=False)
        assert off.returncode != 0 and off.stderr.startswith("UNAVAILABLE"), off.stderr
        assert c.procs[2].poll() is None  # the holder keeps serving
        assert _read(c.bootstrap, acked) == acked
        assert sorted((v["id"], v["uuid"]) for v in c.describe()["voters"]) == sorted(c.uuids.items())
        # Each node's directory is its own: 0700 directories, 0600 files.
        for i in c.ports:
            d = c.data_dir(i)
            paths = [d, *d.rglob("*")]
            assert any(p.suffix == ".log" for p in paths) and any(p.name == "quorum-state" for p in paths)
            modes = {str(p): stat.S_IMODE(p.stat().st_mode) for p in paths}
            assert modes == {str(p): 0o700 if p.is_dir() else 0o600 for p in paths}


def _add_when_observer(c: LocalCluster, endpoint: str, i: int) -> None:
    """AddVoter (i, its new UUID) once the leader knows it as an observer (it has fetched)."""

    def observing() -> bool:
        async def d() -> dict[str, object]:
            async with QuorumClient(endpoint, timeout=10) as cl:
                return await cl.describe()

        obs = asyncio.run(d())["observers"]
        return any(o["id"] == i and o["uuid"] == c.uuids[i] for o in obs)  # type: ignore[attr-defined,index]

    wait_until(f"node {i} ({c.uuids[i]}) as an observer", observing, 60, 0.05, errors=ANY_ERROR)
    run_cli("quorum", "add-voter", "--bootstrap", endpoint, "--id", str(i), "--uuid", c.uuids[i], timeout=120)


def _damage_last_batches(c: LocalCluster, i: int, rng: random.Random) -> str:
    """Flip one bit at a random position of the last four batches of node i's last segment;
    returns the segment's name."""
    mdir = c.data_dir(i) / METADATA_DIR
    with SegmentedLog(mdir, sync_on_open=False) as lg:
        infos = lg.batch_infos()
    seg = sorted(mdir.glob("*.log"))[-1]
    first = [p for _o, s, p in infos if s == int(seg.name[:20])][-4]
    data = bytearray(seg.read_bytes())
    data[rng.randrange(first, len(data))] ^= 1 << rng.randrange(8)
    seg.write_bytes(bytes(data))
    return seg.name


def _exits_corrupt(c: LocalCluster, i: int, segment: str) -> None:
    proc = c.procs[i]
    wait_until(
        f"node {i} to stop on its damaged log", lambda: proc.poll() is not None, 60, 0.05, errors=ANY_ERROR,
    )
    text = c.log_text(i)
    assert proc.returncode != 0 and "CORRUPT_LOG" in text and segment in text, text[-2000:]
    assert re.search(r"position \d+ \(offset \d+\)", text), text[-2000:]
    assert "listening on" not in text.split("CORRUPT_LOG")[-1]


def test_damaged_follower_stops_and_is_replaced(tmp_path: Path) -> None:
    rng = random.Random(23)
    with LocalCluster(tmp_path, 3).up() as c:
        leader = c.leader()
        acked = _fill(c, "one")
        _all_caught_up(c)
        victim = next(i for i in c.ports if i != leader)
        c.kill(victim)
        seg = _damage_last_batches(c, victim, rng)
        c.start(victim)
        _exits_corrupt(c, victim, seg)
        acked |= _fill(c, "two")  # two voters still commit
        # The KIP-856 path: a new disk under a new storage UUID, added, the old one removed.
        old = c.uuids[victim]
        c.replace_disk(victim)
        new = c.uuids[victim]
        _add_when_observer(c, c.bootstrap, victim)
        run_cli("quorum", "remove-voter", "--bootstrap", c.bootstrap, "--id", str(victim), "--uuid", old,
                timeout=120)
        assert _read(c.bootstrap, acked) == acked
        voters = {(v["id"], v["uuid"]) for v in c.describe()["voters"]}
        assert (victim, new) in voters and (victim, old) not in voters and len(voters) == 3


def test_damaged_majority_recovers_from_the_undamaged_replica(tmp_path: Path) -> None:
    rng = random.Random(856)
    with LocalCluster(tmp_path, 3).up() as c:
        c.leader()
        acked = _fill(c, "maj")
        _all_caught_up(c)
        for i in (1, 2, 3):
            c.kill(i)
        damaged = {i: _damage_last_batches(c, i, rng) for i in (1, 2)}
        # The node logs are appended across restarts: only what node 3 wrote after this restart
        # counts (it may well have led epoch 1 before).
        before = len(c.log_text(3))
        for i in (1, 2, 3):
            c.start(i)
        for i, seg in damaged.items():
            _exits_corrupt(c, i, seg)
        # No majority can prove its log: nothing is elected (node 3 alone cannot win).
        assert c.procs[3].poll() is None
        c.kill(3)
        assert "role leader" not in c.log_text(3)[before:]
        # What the operator does: KIP-704 unclean recovery from the undamaged replica, then new
        # disks (new storage UUIDs) for the damaged ones, added back as voters.
        run_cli("quorum", "recover-unclean", "--dir", str(c.data_dir(3)))
        c.start(3)
        solo = c.endpoint(3)

        def recovered() -> bool:
            async def d() -> dict[str, object]:
                async with QuorumClient(solo, timeout=10) as cl:
                    return await cl.describe()

            return asyncio.run(d())["leader_recovery_state"] == "RECOVERED"

        wait_until("node 3 to finish its unclean recovery", recovered, 60, 0.05, errors=ANY_ERROR)
        assert _read(solo, acked) == acked
        for i in (1, 2):
            c.replace_disk(i)
            _add_when_observer(c, solo, i)
        assert {(v["id"], v["uuid"]) for v in c.describe()["voters"]} == set(c.uuids.items())
        assert _read(c.bootstrap, acked) == acked

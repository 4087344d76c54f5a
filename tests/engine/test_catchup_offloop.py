"""Catch-up through a snapshot (KIP-630) installs it off the event loop.

Three real ``Node`` objects (real storage, real fsync) in one event loop over
``InProcessTransport``; the leader snapshots and deletes its log prefix, then a fourth node
(an observer with an empty disk) catches up: it must fetch the snapshot. Its state machine's
decode of the snapshot is held in a worker thread until the test lets it go; meanwhile the
node's event loop keeps answering (health, a read refused with NOT_LEADER) and its map is
still the old one. Released, the node installs the snapshot and catches up to the leader.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from quorum.runtime.config import NodeConfig
from quorum.runtime.kv import KVStore, decode_snapshot, encode_put
from quorum.runtime.statemachine import Applier
from quorum.types import ErrorCode, KraftError
from testkit.polling import now
from tests.engine.inprocess import InProcessCluster, until

VOTERS = {i: f"node-{i}.test:{28100 + i}" for i in (1, 2, 3)}
OBSERVER = "node-4.test:28104"
VALUE = bytes(range(256)) * 16  # 4 KiB


async def _scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = NodeConfig(
        raft={"election_timeout_ms": 300, "fetch_timeout_ms": 800, "snapshot_chunk_bytes": 64 * 1024},
        fsync=True,
        segment_bytes=128 * 1024,
        snapshot_bytes=256 * 1024,
    )
    cluster = InProcessCluster(tmp_path, VOTERS, cfg, "catchup")
    nodes = cluster.nodes
    cluster.start_voters()
    try:
        leader = await cluster.leader()
        lead = nodes[leader]
        for k in range(200):  # 800 KiB of distinct keys: several snapshots, the log prefix deleted
            await until(lambda k=k: lead.put(f"key-{k:04d}", VALUE + k.to_bytes(2, "big")), f"write {k}")
        await until(now(lambda: lead.log.log_start_offset > 0), "the leader to delete its log prefix")

        # Hold the observer's snapshot decode in its worker thread until released.
        release = threading.Event()
        entered = threading.Event()
        threads: list[threading.Thread] = []
        real_prepare = Applier.prepare_snapshot

        def held_prepare(self: Applier, chunks: Iterable[bytes]) -> object:
            threads.append(threading.current_thread())
            entered.set()
            release.wait(30)
            return real_prepare(self, chunks)

        monkeypatch.setattr(Applier, "prepare_snapshot", held_prepare)
        cluster.start(4, OBSERVER)
        obs = nodes[4]
        await until(now(entered.is_set), "the observer to decode the fetched snapshot")
        loop_thread = threading.current_thread()
        assert threads and threads[0] is not loop_thread, "the snapshot was decoded on the event loop"
        # The loop keeps answering while the decode runs: several turns, health, a refused read.
        for _ in range(5):
            await asyncio.sleep(0)  # one turn of the event loop
            assert obs.health()[0]
        with pytest.raises(KraftError) as e:
            await obs.get("key-0000")
        assert e.value.code is ErrorCode.NOT_LEADER
        assert obs.applier.kv.data == {}, "the prepared state replaced the live map before finish"
        release.set()

        expect = {f"key-{k:04d}".encode(): VALUE + k.to_bytes(2, "big") for k in range(200)}
        await until(now(lambda: obs.applier.kv.data == expect), "the observer's map to equal the leader's")
        await until(
            now(lambda: obs.driver.applied_end >= lead.driver.applied_end), "the observer to catch up"
        )
        assert obs.snapshots.latest() is not None  # the download became a snapshot file
        assert obs.log.log_start_offset > 0  # its log starts at the installed snapshot
    finally:
        await cluster.close()


def test_snapshot_installed_off_the_loop_while_the_node_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(_scenario(tmp_path, monkeypatch))


def test_prepare_leaves_the_live_map_and_install_swaps_it() -> None:
    """The two halves on their own: ``prepare_snapshot`` builds a new map and touches nothing
    live; ``install_snapshot`` swaps it in, moves the applied offset and counts the installed
    snapshot as this replica's latest (no immediate re-snapshot of the same state)."""
    ap = Applier()
    ap.apply_batch(0, [encode_put("live", b"1")])
    ap.advanced(1, 1)
    source = KVStore()
    source.data = {b"a": b"x" * 100, b"b": b"y"}
    chunks = [memoryview(c) for c in source.snapshot_chunks()]
    prepared = ap.prepare_snapshot(chunks)
    assert ap.kv.data == {b"live": b"1"} and ap.applied_end == 1 and ap.bytes_since_snapshot > 0
    ap.install_snapshot(prepared, 41)
    assert ap.kv.data == source.data and ap.kv.applied_offset == 41
    assert ap.applied_end == 42 and ap.bytes_since_snapshot == 0
    with pytest.raises(KraftError):
        ap.install_snapshot(["not a map"], 50)


def test_snapshot_values_are_views_of_the_received_chunks_and_reads_return_bytes() -> None:
    """A fetched snapshot's state is decoded without copying its values (they stay
    views of the received chunks); reads still return bytes, and the map snapshots, digests and
    compares the same as one built by copies. A chunk cut short is CORRUPT_RECORD."""
    source = KVStore()
    source.data = {b"a": b"x" * 100, b"b": b"y" * 5, b"c": b""}
    chunks = [bytearray(c) for c in source.snapshot_chunks()]
    data = decode_snapshot(chunks)
    assert data == source.data
    assert all(isinstance(v, memoryview) and v.obj is chunks[0] for v in data.values())
    kv = KVStore()
    kv.load_snapshot(chunks, 9)
    got = kv.get("a")
    assert got == b"x" * 100 and type(got) is bytes and kv.get("zz") is None
    assert list(kv.snapshot_chunks()) == list(source.snapshot_chunks())
    assert kv.digest() == source.digest()
    with pytest.raises(KraftError) as e:
        decode_snapshot([chunks[0][:-1]])
    assert e.value.code is ErrorCode.CORRUPT_RECORD

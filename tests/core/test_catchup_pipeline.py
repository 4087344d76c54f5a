"""Catch-up without wasted work: batches a node appended are applied from memory
(no read-back of the log, also on the leader), the log is still the fallback (restart, cache
full, truncation), and a fetched snapshot's next FetchSnapshot leaves before the chunk just
received is written, while the chunks still reach the file in order."""

from __future__ import annotations

import json
from typing import Any

from quorum.core.messages import FetchSnapshotRequest
from quorum.core.ready import LeaderBatch, Outbound, RawBatches
from quorum.driver.driver import APPLY_READ_BYTES
from quorum.driver.recent import RecentBatches
from quorum.records import decode_batches, encode_batch
from quorum.types import OffsetAndEpoch
from tests.core.test_recovery_snapshot import _wire
from tests.core.util import Harness, leader, make


def _count_apply_reads(h: Harness) -> list[int]:
    """Record the log reads of the apply step (the only caller asking APPLY_READ_BYTES)."""
    calls: list[int] = []
    orig = h.store.log.read

    def read(offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        if max_bytes == APPLY_READ_BYTES:
            calls.append(offset)
        return orig(offset, max_bytes, max_offset)

    h.store.log.read = read  # type: ignore[method-assign]
    return calls


def _put(i: int) -> bytes:
    return json.dumps({"k": f"k{i}", "v": f"v{i}"}).encode()


def _commit(h: Harness, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        h.core.propose([_put(i)], h.now)
        h.drain()
        h.fetch(2)
        h.fetch(3)
    h.fetch(2)
    h.fetch(3)


def test_leader_applies_its_own_batches_from_memory() -> None:
    h = leader()
    reads = _count_apply_reads(h)
    _commit(h, 10)
    assert h.core.hw == h.log.end_offset
    assert h.sm.data == {f"k{i}": f"v{i}" for i in range(10)}
    assert reads == [], f"the leader read back batches it had in memory: {reads}"
    assert len(h.driver.recent) == 0  # everything applied, nothing kept


def test_leader_falls_back_to_the_log_for_what_memory_lacks() -> None:
    h = leader()
    reads = _count_apply_reads(h)
    h.driver.recent.limit_bytes = 1  # keeps at most one batch: older ones come from the log
    for i in range(6):
        h.core.propose([_put(i)], h.now)
        h.drain()
    _commit(h, 0)
    assert h.sm.data == {f"k{i}": f"v{i}" for i in range(6)}
    assert reads, "nothing was read back although the cache held one batch"


def test_applied_after_a_restart_of_the_driver_memory() -> None:
    h = leader()
    for i in range(4):
        h.core.propose([_put(i)], h.now)
        h.drain()
    h.driver.recent.clear()  # as after a restart: the log is all there is
    reads = _count_apply_reads(h)
    _commit(h, 0)
    assert h.sm.data == {f"k{i}": f"v{i}" for i in range(4)}
    assert reads


def test_follower_applies_fetched_batches_without_reading_them_back() -> None:
    h = leader(voters=(1, 2))
    for i in range(5):
        h.core.propose([_put(i)], h.now)
        h.drain()
    f = make(local=2, voters=(1, 2))
    f.now = h.now
    reads = _count_apply_reads(f)
    _wire(h, f)
    assert f.core.hw == h.core.hw == h.log.end_offset
    assert f.sm.data == h.sm.data == {f"k{i}": f"v{i}" for i in range(5)}
    assert reads == []


def test_recent_batches_hold_only_a_contiguous_bounded_run() -> None:
    r = RecentBatches(limit_bytes=10)
    r.add_leader(LeaderBatch(0, 1, (b"aaaa",)))
    r.add_leader(LeaderBatch(1, 1, (b"bbbb",)))
    r.add_leader(LeaderBatch(2, 1, (b"cccc",)))  # 12 bytes > 10: the oldest goes
    assert r.peek_base() == 1
    assert r.take(0) is None and r.peek_base() == 1
    b = r.take(1)
    assert b is not None and b.data() == [b"bbbb"]
    r.add_leader(LeaderBatch(7, 1, (b"x",)))  # a gap (never expected): start over
    assert r.peek_base() == 7 and len(r) == 1
    r.limit_bytes = 1000
    data = encode_batch(8, 1, [b"one", b"two"]) + encode_batch(10, 1, [b"three"])
    infos = tuple(b.info for b in decode_batches(data)[0])
    r.add_fetched(RawBatches(data, infos))
    got = [r.take(o) for o in (7, 8, 10)]
    assert [g.data() if g else None for g in got] == [[b"x"], [b"one", b"two"], [b"three"]]


def test_next_fetch_snapshot_leaves_before_the_chunk_is_written() -> None:
    h = leader(snapshot_chunk_bytes=64)
    _commit(h, 5)
    hw = h.core.hw
    sid = OffsetAndEpoch(hw, h.core.epoch_at(hw - 1))
    h.store.snapshots.write(sid, h.core.controls_at(hw), [json.dumps({"pad": "z" * 400}).encode()])
    h.log.delete_before(hw)
    h.core.snapshot_taken(sid, min(h.log.log_start_offset, hw))
    size = h.store.snapshots.read_chunk(sid, 0, 1 << 20)[1]

    f = make(local=2, snapshot_chunk_bytes=64)
    f.now = h.now
    events: list[tuple[str, int]] = []
    orig_write = f.store.snapshots.write_chunk
    orig_send = f.transport.send

    def write_chunk(s: OffsetAndEpoch, position: int, data: Any) -> None:
        events.append(("write", position))
        orig_write(s, position, data)

    def send(out: Outbound) -> None:
        if isinstance(out.message, FetchSnapshotRequest):
            events.append(("request", out.message.position))
        orig_send(out)

    f.store.snapshots.write_chunk = write_chunk  # type: ignore[method-assign]
    f.transport.send = send  # type: ignore[method-assign]
    _wire(h, f, rounds=2000)
    assert f.store.snapshots.latest() == sid and f.sm.data == {"pad": "z" * 400}
    writes = [p for kind, p in events if kind == "write"]
    assert writes == sorted(writes) and writes[0] == 0 and len(writes) == -(-size // 64)
    # every chunk but the last: the request for the next position went out before its write
    for p in writes[:-1]:
        assert events.index(("request", p + 64)) < events.index(("write", p)), events


def test_leader_knows_a_snapshot_is_being_fetched() -> None:
    h = leader(snapshot_chunk_bytes=64)
    _commit(h, 3)
    assert not h.core.snapshot_being_fetched(5_000)  # never served one
    hw = h.core.hw
    sid = OffsetAndEpoch(hw, h.core.epoch_at(hw - 1))
    h.store.snapshots.write(sid, h.core.controls_at(hw), [b"{}"])
    h.log.delete_before(hw)
    h.core.snapshot_taken(sid, min(h.log.log_start_offset, hw))
    f = make(local=2, snapshot_chunk_bytes=64)
    f.now = h.now
    _wire(h, f)
    assert f.store.snapshots.latest() == sid
    assert h.core.snapshot_being_fetched(5_000)
    h.tick(6_000)
    assert not h.core.snapshot_being_fetched(5_000)

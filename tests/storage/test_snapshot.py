"""Snapshots (KIP-630), the same behaviour for SnapshotStore (real files) and
MemorySnapshotStore, plus the file-only crash cases."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import quorum.storage.snapshot as snapmod
from quorum import records
from quorum.storage.memory import MemorySnapshotStore
from quorum.storage.snapshot import SnapshotStore, parse_snapshot, snapshot_file_name
from quorum.types import (
    AddVoter,
    ErrorCode,
    KraftError,
    LeaderRecovery,
    LeaderRecoveryState,
    OffsetAndEpoch,
    ReplicaKey,
    SnapshotFooter,
    SnapshotHeader,
    TargetVoters,
)

Factory = Callable[[], SnapshotStore | MemorySnapshotStore]
SID = OffsetAndEpoch(1000, 4)
CONTROLS = (
    AddVoter(ReplicaKey(1, "00000000-0000-4000-8000-000000000001"), "127.0.0.1:9001"),
    AddVoter(ReplicaKey(2, "00000000-0000-4000-8000-000000000002"), "127.0.0.1:9002"),
    TargetVoters(None),
    LeaderRecovery(LeaderRecoveryState.RECOVERED),
)
CHUNKS = [b"state-part-1" * 100, b"", b"\x00\xff" * 5000]


def fetch_all(store: SnapshotStore | MemorySnapshotStore, sid: OffsetAndEpoch, step: int) -> bytes:
    out = b""
    while True:
        chunk, total = store.read_chunk(sid, len(out), step)
        out += chunk
        if len(out) == total:
            return out
        assert chunk, "no progress"


def test_write_latest_load(snapshot_factory: Factory) -> None:
    store = snapshot_factory()
    assert store.latest() is None
    path = store.write(SID, CONTROLS, iter(CHUNKS), last_contained_log_timestamp=123)
    assert (
        path.endswith(snapshot_file_name(SID))
        and snapshot_file_name(SID) == "00000000000000001000-0000000004.checkpoint"
    )
    assert store.latest() == SID
    controls, chunks = store.load(SID)
    assert controls == CONTROLS and chunks == CHUNKS
    assert store.controls(SID) == CONTROLS
    store.write(OffsetAndEpoch(2000, 4), (), [])
    assert store.latest() == OffsetAndEpoch(2000, 4)
    assert store.load(OffsetAndEpoch(2000, 4)) == ((), [])
    assert store.snapshot_ids() == [SID, OffsetAndEpoch(2000, 4)]


def test_file_layout(snapshot_factory: Factory) -> None:
    store = snapshot_factory()
    store.write(SID, CONTROLS, CHUNKS, 5)
    raw = fetch_all(store, SID, 1 << 20)
    batches, _ = records.decode_batches(raw)
    assert batches[0].info.controls == (SnapshotHeader(5), *CONTROLS)
    assert batches[-1].info.controls == (SnapshotFooter(),)
    assert [records.data_records(b) for b in batches[1:-1]] == [[c] for c in CHUNKS]
    assert {b.info.epoch for b in batches} == {4}


def test_read_chunk_and_errors(snapshot_factory: Factory) -> None:
    store = snapshot_factory()
    store.write(SID, CONTROLS, CHUNKS)
    whole = fetch_all(store, SID, 1 << 20)
    assert store.size(SID) == len(whole)
    assert fetch_all(store, SID, 777) == whole
    assert store.read_chunk(SID, len(whole), 100) == (b"", len(whole))
    with pytest.raises(KraftError) as e:
        store.read_chunk(SID, len(whole) + 1, 100)
    assert e.value.code is ErrorCode.POSITION_OUT_OF_RANGE
    with pytest.raises(KraftError) as e:
        store.read_chunk(OffsetAndEpoch(5, 1), 0, 100)
    assert e.value.code is ErrorCode.SNAPSHOT_NOT_FOUND
    with pytest.raises(KraftError) as e:
        store.load(OffsetAndEpoch(5, 1))
    assert e.value.code is ErrorCode.SNAPSHOT_NOT_FOUND


def test_chunked_download_between_stores(snapshot_factory: Factory, tmp_path: Path) -> None:
    leader = snapshot_factory()
    leader.write(SID, CONTROLS, CHUNKS)
    follower = SnapshotStore(tmp_path / "follower")
    try:
        follower.begin_download(SID)
        pos = 0
        while True:
            chunk, total = leader.read_chunk(SID, pos, 1000)
            follower.write_chunk(SID, pos, chunk)
            pos += len(chunk)
            if pos == total:
                break
        assert follower.latest() is None  # not before finish
        follower.finish_download(SID)
        assert follower.latest() == SID and follower.load(SID) == (CONTROLS, CHUNKS)
        assert not list((tmp_path / "follower").glob("*.part"))
    finally:
        follower.close()


def _download(store: SnapshotStore | MemorySnapshotStore, sid: OffsetAndEpoch, raw: bytes) -> None:
    store.begin_download(sid)
    for pos in range(0, len(raw), 500):
        store.write_chunk(sid, pos, raw[pos : pos + 500])


@pytest.mark.parametrize("damage", ["flip", "truncate", "no-footer", "wrong-epoch", "empty"])
def test_corrupt_download_is_refused(snapshot_factory: Factory, damage: str) -> None:
    source = MemorySnapshotStore()
    source.write(SID, CONTROLS, CHUNKS)
    raw = bytearray(source.read_chunk(SID, 0, 1 << 20)[0])
    sid = SID
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x01
    elif damage == "truncate":
        raw = raw[:-5]
    elif damage == "no-footer":
        raw = raw[: len(raw) - records.decode_batches(bytes(raw))[0][-1].info.size_bytes]
    elif damage == "wrong-epoch":
        sid = OffsetAndEpoch(SID.offset, SID.epoch + 1)
    else:
        raw = bytearray()
    store = snapshot_factory()
    store.write(OffsetAndEpoch(10, 1), (), [b"older"])
    _download(store, sid, bytes(raw))
    with pytest.raises(KraftError) as e:
        store.finish_download(sid)
    assert e.value.code is ErrorCode.CORRUPT_RECORD
    assert str(sid) in e.value.message
    assert store.latest() == OffsetAndEpoch(10, 1)  # nothing installed, the old one intact
    assert store.load(OffsetAndEpoch(10, 1)) == ((), [b"older"])
    with pytest.raises(KraftError):  # the download is gone; it must start again
        store.write_chunk(sid, 0, b"x")


def test_download_position_must_follow(snapshot_factory: Factory) -> None:
    store = snapshot_factory()
    with pytest.raises(KraftError) as e:
        store.write_chunk(SID, 0, b"x")
    assert e.value.code is ErrorCode.INVALID_REQUEST
    store.begin_download(SID)
    store.write_chunk(SID, 0, b"abc")
    with pytest.raises(KraftError) as e:
        store.write_chunk(SID, 5, b"x")
    assert e.value.code is ErrorCode.POSITION_OUT_OF_RANGE
    store.begin_download(SID)  # restart from zero
    store.write_chunk(SID, 0, b"x")
    store.abort_download(SID)
    assert store.latest() is None


def test_delete_older_than_keeps_latest(snapshot_factory: Factory) -> None:
    store = snapshot_factory()
    ids = [OffsetAndEpoch(o, 1) for o in (10, 20, 30)]
    for sid in ids:
        store.write(sid, (), [str(sid).encode()])
    store.read_chunk(ids[0], 0, 10)  # an open reader must not block deletion
    store.delete_older_than(ids[2])
    assert store.snapshot_ids() == [ids[2]]
    store.delete_older_than(OffsetAndEpoch(99, 9))
    assert store.snapshot_ids() == [ids[2]]  # the latest always stays
    with pytest.raises(KraftError):
        store.load(ids[0])


def test_write_rejects_bad_input(snapshot_factory: Factory) -> None:
    store = snapshot_factory()
    with pytest.raises(KraftError) as e:
        store.write(OffsetAndEpoch(-1, 0), (), [])
    assert e.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(KraftError) as e:
        store.write(SID, (SnapshotFooter(),), [])
    assert e.value.code is ErrorCode.INVALID_REQUEST

    def failing() -> Iterator[bytes]:
        yield b"ok"
        raise RuntimeError("state machine failed mid-snapshot")

    with pytest.raises(RuntimeError):
        store.write(SID, (), failing())
    assert store.latest() is None


def test_leftover_part_files_are_deleted_on_open(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    store.write(SID, CONTROLS, CHUNKS)
    store.begin_download(OffsetAndEpoch(2000, 5))
    store.write_chunk(OffsetAndEpoch(2000, 5), 0, b"partial")
    (tmp_path / "00000000000000003000-0000000005.checkpoint.part").write_bytes(b"crashed write")
    # a crash: the store is not closed, its .part files stay on disk
    reopened = SnapshotStore(tmp_path)
    try:
        assert reopened.snapshot_ids() == [SID]
        assert sorted(p.name for p in tmp_path.iterdir()) == [snapshot_file_name(SID)]
    finally:
        reopened.close()
        store.close()


def test_damaged_stored_snapshot_is_corrupt_log(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    path = Path(store.write(SID, CONTROLS, CHUNKS))
    store.close()
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    store = SnapshotStore(tmp_path)
    try:
        with pytest.raises(KraftError) as e:
            store.load(SID)
        assert e.value.code is ErrorCode.CORRUPT_LOG and path.name in e.value.message
        assert store.controls(SID) == CONTROLS  # the header batch itself is intact
    finally:
        store.close()


def test_parse_snapshot_rejects_extra_header() -> None:
    raw = records.encode_control_batch(
        0, 1, [SnapshotHeader(0), SnapshotHeader(0)]
    ) + records.encode_control_batch(2, 1, [SnapshotFooter()])
    with pytest.raises(KraftError) as e:
        parse_snapshot(raw, OffsetAndEpoch(5, 1), "x")
    assert e.value.code is ErrorCode.CORRUPT_RECORD and "second header" in e.value.message


def test_rewriting_an_existing_id_keeps_the_first(snapshot_factory: Factory) -> None:
    store = snapshot_factory()
    p1 = store.write(SID, CONTROLS, [b"first"])
    p2 = store.write(SID, (), [b"second"])
    assert p1 == p2 and store.load(SID) == (CONTROLS, [b"first"])
    assert store.snapshot_ids() == [SID]


def test_refetching_an_existing_id_replaces_it_for_readers(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    try:
        store.write(SID, (), [b"old"])
        assert store.read_chunk(SID, 0, 10)[0]  # caches a reader on the old file
        fresh = MemorySnapshotStore()
        fresh.write(SID, CONTROLS, [b"new"])
        raw, _ = fresh.read_chunk(SID, 0, 1 << 20)
        _download(store, SID, raw)
        store.finish_download(SID)
        assert store.read_chunk(SID, 0, 1 << 20)[0] == raw
        assert store.load(SID) == (CONTROLS, [b"new"])
    finally:
        store.close()


def test_a_download_frees_its_page_cache_after_each_fsync(
    snapshot_factory: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetched snapshot's page cache is freed once fsynced (its content stays in
    memory until installed; nothing reads it back): after each periodic fdatasync, up to the
    bytes written, and after the final fsync, all of it; the leader's own snapshots keep theirs."""
    events: list[tuple[str, int]] = []
    real_datasync, real_fsync = os.fdatasync, os.fsync
    monkeypatch.setattr(snapmod, "SYNC_EVERY_BYTES", 4000)
    monkeypatch.setattr(snapmod, "drop_synced", lambda fd, start, n: events.append(("drop", start + n)))
    monkeypatch.setattr(os, "fdatasync", lambda fd: (events.append(("sync", 0)), real_datasync(fd))[1])
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("sync", 0)), real_fsync(fd))[1])
    leader = snapshot_factory()
    leader.write(SID, CONTROLS, CHUNKS)
    assert not [e for e in events if e[0] == "drop"]  # a snapshot written here keeps its cache
    follower = SnapshotStore(tmp_path / "follower")
    try:
        follower.begin_download(SID)
        pos = 0
        while True:
            chunk, total = leader.read_chunk(SID, pos, 3000)
            events.clear()
            follower.write_chunk(SID, pos, chunk)
            pos += len(chunk)
            if pos // 4000 != (pos - len(chunk)) // 4000:
                assert events[-2:] == [("sync", 0), ("drop", pos)]
            else:
                assert events == []
            if pos == total:
                break
        events.clear()
        follower.finish_download(SID)
        drops = [e for e in events if e[0] == "drop"]
        assert drops == [("drop", total)] and events.index(drops[0]) > 0  # after the fsync
        assert follower.load(SID) == (CONTROLS, CHUNKS)
    finally:
        follower.close()

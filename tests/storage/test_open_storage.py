"""open_storage: the node runtime's entry point over a formatted directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorum.storage import (
    METADATA_DIR,
    LogStorage,
    MemoryLog,
    MemoryQuorumStateStore,
    MemorySnapshotStore,
    QuorumStateStorage,
    QuorumStateStore,
    SegmentedLog,
    SnapshotStorage,
    SnapshotStore,
    format_dir,
    open_storage,
    recover_log,
)
from quorum.storage.log import segment_name
from quorum.types import AddVoter, ErrorCode, KraftError, OffsetAndEpoch, QuorumState, ReplicaKey

R1 = ReplicaKey(1, "00000000-0000-4000-8000-000000000001")


def test_unformatted_dir_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(KraftError) as e:
        open_storage(tmp_path)
    assert e.value.code is ErrorCode.NOT_FORMATTED
    assert list(tmp_path.iterdir()) == []  # nothing created in an unformatted directory


def test_fresh_then_restart(tmp_path: Path) -> None:
    meta = format_dir(tmp_path, "c1", 1)
    m, states, log, snaps, summary = open_storage(tmp_path)
    assert m == meta
    assert (summary.log_start_offset, summary.end_offset, summary.snapshot) == (0, 0, None)
    assert states.load() == QuorumState("c1")
    states.save(QuorumState("c1", leader_id=1, leader_epoch=2))
    log.append(0, 2, [AddVoter(R1)])
    log.append(1, 2, [b"x"] * 10)
    snaps.write(OffsetAndEpoch(6, 2), (AddVoter(R1),), [b"state"])
    log.close()
    snaps.close()
    _, states, log, snaps, summary = open_storage(tmp_path)
    try:
        assert states.load().leader_epoch == 2
        assert summary.end_offset == 11 and summary.snapshot == OffsetAndEpoch(6, 2)
        assert summary.snapshot_controls == (AddVoter(R1),)
        assert summary.control_batches == []  # the AddVoter batch lies before the snapshot
        assert summary.epoch_starts == [(2, 6)]
        assert (tmp_path / METADATA_DIR / segment_name(0)).exists()
    finally:
        log.close()
        snaps.close()


def test_log_behind_snapshot_is_reset(tmp_path: Path) -> None:
    format_dir(tmp_path, "c1", 1)
    _, _, log, snaps, _ = open_storage(tmp_path)
    log.append(0, 1, [b"a"])
    snaps.write(OffsetAndEpoch(50, 3), (AddVoter(R1),), [])  # a fetched snapshot, log not yet reset
    log.close()
    snaps.close()
    _, _, log, snaps, summary = open_storage(tmp_path)
    try:
        assert (summary.log_start_offset, summary.end_offset, summary.last_epoch) == (50, 50, 3)
        assert log.end_offset == 50
    finally:
        log.close()
        snaps.close()


def test_log_starting_above_snapshot_is_corrupt(tmp_path: Path) -> None:
    format_dir(tmp_path, "c1", 1)
    mdir = tmp_path / METADATA_DIR
    _, _, log, snaps, _ = open_storage(tmp_path)
    log.reset_to_snapshot(OffsetAndEpoch(100, 2))  # as if the snapshot file were then lost
    log.append(100, 2, [b"a"])
    log.close()
    snaps.close()
    with pytest.raises(KraftError) as e:
        open_storage(tmp_path)
    assert e.value.code is ErrorCode.CORRUPT_LOG and "no snapshot" in e.value.message
    assert (mdir / segment_name(100)).stat().st_size > 0  # untouched


def test_corrupt_quorum_state_stops_open(tmp_path: Path) -> None:
    format_dir(tmp_path, "c1", 1)
    (tmp_path / METADATA_DIR).mkdir()
    (tmp_path / METADATA_DIR / "quorum-state").write_text("{not json")
    with pytest.raises(KraftError) as e:
        open_storage(tmp_path)
    assert e.value.code is ErrorCode.CORRUPT_LOG and "quorum-state" in e.value.message


def test_recover_log_with_memory_twins() -> None:
    log, snaps = MemoryLog(), MemorySnapshotStore()
    log.append(0, 1, [b"a"])
    snaps.write(OffsetAndEpoch(10, 2), (AddVoter(R1),), [b"s"])
    summary = recover_log(log, snaps)
    assert (summary.end_offset, summary.snapshot_controls, summary.last_epoch) == (10, (AddVoter(R1),), 2)


def test_empty_log_after_snapshot_knows_its_epoch(tmp_path: Path) -> None:
    format_dir(tmp_path, "c1", 1)
    _, _, log, snaps, _ = open_storage(tmp_path)
    snaps.write(OffsetAndEpoch(40, 6), (AddVoter(R1),), [b"s"])
    log.reset_to_snapshot(OffsetAndEpoch(40, 6))
    log.close()
    snaps.close()
    _, _, log, snaps, summary = open_storage(tmp_path)
    try:
        assert (summary.end_offset, summary.last_epoch, log.last_epoch) == (40, 6, 6)
        with pytest.raises(KraftError) as e:
            log.append(40, 5, [b"older epoch than the snapshot"])
        assert e.value.code is ErrorCode.INVALID_REQUEST
    finally:
        log.close()
        snaps.close()


def test_implementations_satisfy_the_protocols(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path / "log") as log:
        assert isinstance(log, LogStorage)
    assert isinstance(MemoryLog(), LogStorage)
    store = SnapshotStore(tmp_path / "snaps")
    assert isinstance(store, SnapshotStorage) and isinstance(MemorySnapshotStore(), SnapshotStorage)
    store.close()
    assert isinstance(QuorumStateStore(tmp_path, "c"), QuorumStateStorage)
    assert isinstance(MemoryQuorumStateStore("c"), QuorumStateStorage)

"""What ``open_storage`` does before the node may use a directory: take its lock (one process per
data directory), make durable what a killed process left in the page cache, and keep the
directory the node's alone (0700 directories, 0600 files)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorum.storage import LOCK_FILE, METADATA_DIR, DataDirLock, format_dir, open_storage
from quorum.storage.log import segment_name
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch, QuorumState


@pytest.fixture
def formatted(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    format_dir(d, "c1", 1)
    return d


def test_a_second_open_fails_naming_the_directory_and_holder(formatted: Path) -> None:
    _m, _q, log, snaps, _s = open_storage(formatted)
    try:
        with pytest.raises(KraftError) as e:
            open_storage(formatted)
        assert e.value.code is ErrorCode.UNAVAILABLE
        assert str(formatted) in e.value.message and f"pid {os.getpid()}" in e.value.message
        with pytest.raises(KraftError) as f:  # nor may it be formatted meanwhile
            format_dir(formatted, "c1", 1, ignore_formatted=False)
        assert f.value.code is ErrorCode.ALREADY_FORMATTED
    finally:
        log.close()
        snaps.close()
    _m, _q, log, snaps, _s = open_storage(formatted)  # close released it
    log.close()
    snaps.close()


def test_format_refuses_a_directory_in_use(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    held = DataDirLock.acquire(d)
    try:
        with pytest.raises(KraftError) as e:
            format_dir(d, "c1", 1)
        assert e.value.code is ErrorCode.UNAVAILABLE and str(d) in e.value.message
        assert not (d / "meta.properties").exists()
    finally:
        held.release()


def test_a_failed_open_releases_the_lock(formatted: Path) -> None:
    (formatted / METADATA_DIR).mkdir(exist_ok=True)
    (formatted / METADATA_DIR / "quorum-state").write_text("{not json")
    with pytest.raises(KraftError) as e:
        open_storage(formatted)
    assert e.value.code is ErrorCode.CORRUPT_LOG
    (formatted / METADATA_DIR / "quorum-state").unlink()
    _m, _q, log, snaps, _s = open_storage(formatted)
    log.close()
    snaps.close()


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every path ``os.fsync`` / ``os.fdatasync`` is called on, in order."""
    seen: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def name(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def fsync(fd: int) -> None:
        seen.append(name(fd))
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        seen.append(name(fd))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    yield seen


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to name fsynced files")
def test_open_syncs_what_a_killed_process_left_unsynced(formatted: Path, fsynced: list[str]) -> None:
    _m, q, log, snaps, _s = open_storage(formatted)
    q.save(QuorumState("c1", leader_id=1, leader_epoch=3))
    for i in range(5):
        log.append(i, 3, [b"unsynced"])
    # a killed process: no flush, no close (the descriptors just go away)
    log._close_fds()
    log._dir_lock.release()  # type: ignore[union-attr]  # the kernel drops it with the process
    snaps.close()
    fsynced.clear()
    _m, q, log, snaps, summary = open_storage(formatted)
    try:
        mdir = str(formatted / METADATA_DIR)
        for path in (
            str(formatted / "meta.properties"),
            str(formatted),
            os.path.join(mdir, "quorum-state"),
            os.path.join(mdir, segment_name(0)),
            mdir,
        ):
            assert path in fsynced, (path, fsynced)
        assert summary.end_offset == 5 and log.flushed_end_offset == 5
    finally:
        log.close()
        snaps.close()


def test_without_sync_on_open_nothing_is_synced(formatted: Path, fsynced: list[str]) -> None:
    """The switch that shows the hole in tests and the bench really removes the syncs."""
    _m, _q, log, snaps, _s = open_storage(formatted)
    log.close()
    snaps.close()
    fsynced.clear()
    _m, _q, log, snaps, _s = open_storage(formatted, sync_on_open=False)
    log.close()
    snaps.close()
    assert not [p for p in fsynced if p.endswith(segment_name(0)) or p.endswith("quorum-state")]


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_directories_0700_files_0600(tmp_path: Path) -> None:
    d = tmp_path / "data"
    format_dir(d, "c1", 1)
    _m, q, log, snaps, _s = open_storage(d, segment_bytes=1024)
    try:
        q.save(QuorumState("c1", leader_id=1, leader_epoch=1))
        for i in range(40):
            log.append(i, 1, [b"v" * 60])
        log.flush()
        snaps.write(OffsetAndEpoch(10, 1), (), [b"state"])
    finally:
        log.close()
        snaps.close()
    mdir = d / METADATA_DIR
    assert _mode(d) == 0o700 and _mode(mdir) == 0o700
    files = [d / "meta.properties", d / LOCK_FILE, *mdir.iterdir()]
    assert len([f for f in files if f.suffix == ".log"]) > 1 and any(f.suffix == ".checkpoint" for f in files)
    assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}


def test_open_tightens_an_older_directory(tmp_path: Path) -> None:
    d = tmp_path / "data"
    format_dir(d, "c1", 1)
    os.chmod(d, 0o755)
    _m, _q, log, snaps, _s = open_storage(d)
    log.close()
    snaps.close()
    assert _mode(d) == 0o700 and _mode(d / METADATA_DIR) == 0o700

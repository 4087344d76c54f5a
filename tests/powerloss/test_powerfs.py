"""powerfs itself (tools/powerfs): what a power loss (``clear-cache``) keeps and drops.

Kept: what was fsynced or fdatasynced, and every name (creations, renames, removals go to the
backing directory at once). Dropped: file data and size changes (writes, truncations) made
since the file's last sync. A seeded random sequence of writes, truncations, syncs and power
losses is compared against a model of exactly those rules."""

from __future__ import annotations

import errno
import mmap
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.polling import wait_until
from tests.powerloss.powerfs import PowerFs

Mount = Callable[[str], PowerFs]


def _write(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, os.fstat(fd).st_size)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_unsynced_data_is_lost_synced_data_kept(mount_powerfs: Mount) -> None:
    fs = mount_powerfs("disk")
    a, b, c = fs.mountpoint / "a", fs.mountpoint / "b", fs.mountpoint / "c"
    _write(a, b"x" * 5000, sync=True)
    _write(a, b"tail", sync=False)
    fd = os.open(a, os.O_RDWR)
    os.pwrite(fd, b"OVER", 10)  # an unsynced overwrite inside the synced part
    os.close(fd)
    _write(b, b"datasynced", sync=False)
    fd = os.open(b, os.O_RDWR)
    os.fdatasync(fd)
    os.close(fd)
    _write(c, b"never synced", sync=False)
    assert a.read_bytes()[:14] == b"xxxxxxxxxxOVER" and a.stat().st_size == 5004
    assert (fs.backing / "a").stat().st_size == 5000  # the disk has only what was synced
    assert fs.stats()["dirty_files"] == 2

    fs.clear_cache()
    assert a.read_bytes() == b"x" * 5000
    assert b.read_bytes() == b"datasynced"
    assert c.exists() and c.read_bytes() == b""  # its name survives, its data does not
    assert fs.stats()["dirty_files"] == 0


def test_rename_keeps_the_cache_and_replaces_the_target(mount_powerfs: Mount) -> None:
    fs = mount_powerfs("disk")
    m = fs.mountpoint
    _write(m / "target", b"old synced", sync=True)
    _write(m / "target", b" + old unsynced", sync=False)
    # The crash-safe replacement pattern: write a temporary file, fsync it, rename it over.
    fd = os.open(m / "tmp", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"new")
    os.fsync(fd)
    os.write(fd, b" + unsynced after the sync")
    os.close(fd)
    os.rename(m / "tmp", m / "target")
    assert (m / "target").read_bytes() == b"new + unsynced after the sync"  # cached by inode
    _write(m / "moved", b"unsynced", sync=False)
    os.rename(m / "moved", m / "moved2")
    fd = os.open(m / "moved2", os.O_RDWR)
    os.fsync(fd)  # a sync through the new name syncs what was written under the old one
    os.close(fd)
    fs.clear_cache()
    assert (m / "target").read_bytes() == b"new"
    assert (m / "moved2").read_bytes() == b"unsynced"
    assert sorted(os.listdir(m)) == ["moved2", "target"]
    wait_until("every cache entry freed", lambda: fs.stats()["entries"] == 0, 10, 0.02)


def test_truncation_is_cached_like_a_write(mount_powerfs: Mount) -> None:
    fs = mount_powerfs("disk")
    f = fs.mountpoint / "f"
    synced = bytes(range(256)) * 40
    _write(f, synced, sync=True)
    os.truncate(f, 100)
    assert f.stat().st_size == 100 and (fs.backing / "f").stat().st_size == len(synced)
    fs.clear_cache()
    assert f.read_bytes() == synced  # a truncation not synced is undone by a power loss

    fd = os.open(f, os.O_RDWR)
    os.ftruncate(fd, 100)
    os.pwrite(fd, b"END", 8000)  # the bytes between the cut and the write are zeros, not old data
    expected = synced[:100] + bytes(7900) + b"END"
    assert f.read_bytes() == expected
    os.fsync(fd)
    os.close(fd)
    assert (fs.backing / "f").read_bytes() == expected
    with open(f, "wb") as h:  # O_TRUNC at open is a truncation too
        h.write(b"short")
    assert (fs.backing / "f").read_bytes() == expected
    assert f.read_bytes() == b"short"
    fs.clear_cache()
    assert f.read_bytes() == expected


def test_unlink_and_directories_pass_through(mount_powerfs: Mount) -> None:
    fs = mount_powerfs("disk")
    m = fs.mountpoint
    (m / "sub").mkdir()
    _write(m / "sub" / "gone", b"unsynced", sync=False)
    fd = os.open(m / "sub" / "gone", os.O_RDONLY)
    os.unlink(m / "sub" / "gone")
    assert os.pread(fd, 100, 0) == b"unsynced"  # an open unlinked file stays readable
    os.close(fd)
    assert not (fs.backing / "sub" / "gone").exists()
    # The kernel sends the release of a closed file in the background: the entry goes then.
    wait_until("the unlinked file's cache entry freed", lambda: fs.stats()["entries"] == 0, 10, 0.02)
    dfd = os.open(m / "sub", os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    os.rmdir(m / "sub")
    assert os.listdir(m) == [] and os.statvfs(m).f_bsize > 0


def test_mmap_reads_the_cached_data(mount_powerfs: Mount) -> None:
    """The log's recovery scan maps its last segment: the mapping must show unsynced bytes."""
    fs = mount_powerfs("disk")
    f = fs.mountpoint / "seg"
    _write(f, b"a" * 10000, sync=True)
    _write(f, b"b" * 3000, sync=False)
    fd = os.open(f, os.O_RDWR)
    with mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_READ) as mm:
        assert mm[9999:10001] == b"ab" and len(mm) == 13000
    os.close(fd)


def test_a_file_kept_open_sees_the_power_loss(mount_powerfs: Mount) -> None:
    """The kernel's cached pages of an open file are dropped with the cache (a same-size
    overwrite changes no size or time the kernel could notice), also after its directory was
    renamed."""
    fs = mount_powerfs("disk")
    (fs.mountpoint / "d").mkdir()
    f = fs.mountpoint / "d" / "f"
    _write(f, b"a" * 8192, sync=True)
    fd = os.open(f, os.O_RDWR)
    os.pwrite(fd, b"b" * 8192, 0)
    assert os.pread(fd, 8192, 0) == b"b" * 8192  # now in the kernel's page cache
    os.rename(fs.mountpoint / "d", fs.mountpoint / "e")
    fs.clear_cache()
    assert os.pread(fd, 8192, 0) == b"a" * 8192
    os.close(fd)


def test_held_sync_fails_without_syncing(mount_powerfs: Mount) -> None:
    """``hold-sync`` stops fsyncs where they are (a process killed in the middle of one);
    ``fail-held-sync`` ends them with EIO, their data still unsynced."""
    fs = mount_powerfs("disk")
    f = fs.mountpoint / "f"
    _write(f, b"synced", sync=True)
    _write(f, b" pending", sync=False)
    fs.command("hold-sync")
    result: list[BaseException | None] = []

    def sync() -> None:
        fd = os.open(f, os.O_RDWR)
        try:
            os.fsync(fd)
            result.append(None)
        except OSError as e:
            result.append(e)
        finally:
            os.close(fd)

    t = threading.Thread(target=sync)
    t.start()
    wait_until("the fsync held", lambda: fs.stats()["held_syncs"] == 1, 10, 0.02)
    assert fs.command("fail-held-sync") == "ok failed=1"
    t.join(10)
    assert isinstance(result[0], OSError) and result[0].errno == errno.EIO
    fs.clear_cache()
    assert f.read_bytes() == b"synced"
    _write(f, b"!", sync=True)  # no longer held
    assert (fs.backing / "f").read_bytes() == b"synced!"


def test_unknown_command_is_named(mount_powerfs: Mount) -> None:
    fs = mount_powerfs("disk")
    with pytest.raises(AssertionError, match="unknown command 'clear-cach'"):
        fs.command("clear-cach")


def test_random_operations_match_the_model(mount_powerfs: Mount) -> None:
    """Seeded random writes (also sparse and across pages), truncations, syncs, reopenings and
    power losses on a few files from several threads, against a model: the current contents,
    and the contents at the last sync."""
    seed = random.randrange(1 << 30)
    print(f"powerfs model seed {seed}")
    fs = mount_powerfs("disk")
    errors: list[str] = []
    lock = threading.Lock()  # one operation at a time: a power loss resets every file's model
    current = {w: bytearray() for w in range(4)}
    synced = {w: bytearray() for w in range(4)}

    def worker(w: int) -> None:
        rnd = random.Random(seed * 31 + w)
        path = fs.mountpoint / f"file-{w}"
        cur = current[w]
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        for step in range(300):
            with lock:
                op = rnd.random()
                if op < 0.45:
                    off = rnd.randrange(0, len(cur) + 9000)
                    data = rnd.randbytes(rnd.randrange(1, 9000))
                    os.pwrite(fd, data, off)
                    if off > len(cur):
                        cur.extend(bytes(off - len(cur)))
                    cur[off : off + len(data)] = data
                elif op < 0.6:
                    size = rnd.randrange(0, len(cur) + 5000)
                    os.ftruncate(fd, size)
                    del cur[size:]
                    cur.extend(bytes(size - len(cur)))
                elif op < 0.75:
                    (os.fsync if rnd.random() < 0.5 else os.fdatasync)(fd)
                    synced[w][:] = cur
                elif op < 0.85:
                    os.close(fd)
                    fd = os.open(path, os.O_RDWR)
                elif op < 0.9:
                    fs.clear_cache()
                    for v in current:
                        current[v][:] = synced[v]
                got = os.pread(fd, len(cur) + 10, 0)
                if got != cur or os.fstat(fd).st_size != len(cur):
                    errors.append(f"worker {w} step {step} (seed {seed}): contents differ from the model")
                    break
        os.close(fd)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors

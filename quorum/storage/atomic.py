"""Crash-safe file replacement for the small state files (meta.properties, quorum-state).

``atomic_write`` gives the all-or-nothing property KIP-856 asks of meta.properties ("atomically
replaced") and KIP-595 of the quorum-state file: after a crash the path holds either the old
or the new content, never a mix. Invariant: the new content is durable (file and directory
entry fsynced) before the function returns.
"""

from __future__ import annotations

import os
import tempfile

__all__ = [
    "CATCHUP_DROP_MIN_BYTES",
    "DIR_MODE",
    "FILE_MODE",
    "atomic_write",
    "drop_synced",
    "ensure_dir",
    "fsync_dir",
    "fsync_existing",
    "restrict_dir",
]

# Data directories and every file in them are the node's alone: the log holds client data, the
# quorum-state file the node's votes (a local user editing either can break the quorum).
DIR_MODE = 0o700
FILE_MODE = 0o600

# A follower's write of at least this many bytes at once is catch-up (one large Fetch response
# or snapshot chunk), whose page cache ``drop_synced`` frees once it is fsynced.
CATCHUP_DROP_MIN_BYTES = 1024 * 1024


def drop_synced(fd: int, start: int, length: int) -> None:
    """Free the page cache of ``[start, start + length)`` of ``fd``, already fsynced (Linux
    ``posix_fadvise(POSIX_FADV_DONTNEED)``; nothing elsewhere). For bulk catch-up writes: a
    replica that received a 1 GB log holds it in memory until applied anyway, and reads none of
    it back; keeping it cached made every written page a newly allocated one. Freed at once
    after each fsync, the same pages take the next writes: on this project's VMs (free guest
    pages go back to the host) writing 1 GiB in 32 MiB pieces with an fdatasync per 64 MiB took
    1.6-2.3 CPU s and 4-5.8 s that way, 0.3 CPU s and 0.8-1.5 s with the drop. Dirty pages are
    never dropped by this call, so it cannot lose data; a range not yet synced would only start
    its writeback."""
    if length <= 0 or fd < 0 or not hasattr(os, "posix_fadvise"):
        return
    try:
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass  # advice only: a file system that refuses it keeps its cache


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that entries created, renamed or removed in it survive a crash."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_existing(path: str | os.PathLike[str]) -> bool:
    """fsync ``path`` if it exists (False if it does not). After a process crash its last
    write may still be only in the page cache: a power cut would take it although the
    restarted process already read (and acted on) it."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def restrict_dir(path: str | os.PathLike[str]) -> None:
    """Make an existing directory the node's alone (0700): a directory made by an older version
    or by someone else (a volume mount) is tightened on open. Best effort: a directory this
    user does not own keeps its mode (its owner chose it)."""
    try:
        if os.stat(path).st_mode & 0o077:
            os.chmod(path, DIR_MODE)
    except PermissionError:
        pass


def ensure_dir(path: str | os.PathLike[str], *, fsync: bool = True) -> None:
    """Create ``path`` (and missing parents, mode 0700); fsync the parent of every directory
    created so that the new directory entries survive a crash as well."""
    target = os.path.abspath(os.fspath(path))
    missing: list[str] = []
    d = target
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    os.makedirs(target, mode=DIR_MODE, exist_ok=True)
    if fsync:
        for created in reversed(missing):
            fsync_dir(os.path.dirname(created))


def atomic_write(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data``: temp file in the same directory (so ``rename`` stays on
    one file system and is atomic), fsync it, rename it over ``path``, fsync the directory.

    ``fsync=False`` skips both fsyncs (simulations on tmpfs); the rename stays atomic."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(target) + ".", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, FILE_MODE)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(directory)

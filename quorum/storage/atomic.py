"""Crash-safe file replacement for the small state files (meta.properties, quorum-state).

``atomic_write`` gives the all-or-nothing property KIP-856 asks of meta.properties ("atomically
replaced") and KIP-595 of the quorum-state file: after a crash the path holds either the old
or the new content, never a mix. Invariant: the new content is durable (file and directory
entry fsynced) before the function returns.
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["atomic_write", "ensure_dir", "fsync_dir"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that entries created, renamed or removed in it survive a crash."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: str | os.PathLike[str], *, fsync: bool = True) -> None:
    """Create ``path`` (and missing parents); fsync the parent of every directory created so
    that the new directory entries survive a crash as well."""
    target = os.path.abspath(os.fspath(path))
    missing: list[str] = []
    d = target
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    os.makedirs(target, exist_ok=True)
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
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; these files are not secret
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

"""One process per data directory: an exclusive ``flock`` on ``DIR/.lock``.

Two processes serving one directory would both append, both acknowledge, and on the next open
one's acknowledged batches would look like the other's torn tail. ``open_storage`` (the node's
start, ``recover-unclean``, every tool) and ``format_dir`` take the lock before they read or
write anything else; a second taker fails at once with UNAVAILABLE naming the directory and the
holder (pid, host, start time) that the lock file records.

``flock`` rather than a pid file: the kernel drops the lock when the holder's last descriptor
closes, also on SIGKILL, so a crashed node never leaves a stale lock behind; a lock is held per
open file description, so two opens inside one process exclude each other as well (the
in-process test clusters rely on :meth:`DataDirLock.release` at close). The file stays after
release (unlinking it would let a third process lock a new inode while a second still holds the
old one).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket

from quorum.timefmt import rfc3339
from quorum.types import ErrorCode, KraftError

__all__ = ["LOCK_FILE", "DataDirLock"]

LOCK_FILE = ".lock"


class DataDirLock:
    """The held lock of one data directory; :meth:`acquire` takes it, :meth:`release` gives it
    back (idempotent)."""

    def __init__(self, directory: str, fd: int) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    @classmethod
    def acquire(cls, directory: str | os.PathLike[str], purpose: str = "node") -> DataDirLock:
        """Lock ``directory`` (which must exist) or raise UNAVAILABLE naming the holder."""
        d = os.fspath(directory)
        path = os.path.join(d, LOCK_FILE)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            raise KraftError(ErrorCode.NOT_FORMATTED, f"{d} does not exist") from None
        except NotADirectoryError:
            raise KraftError(ErrorCode.NOT_FORMATTED, f"{d} is not a directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise KraftError(
                ErrorCode.UNAVAILABLE,
                f"data directory {d} is in use by another process ({holder}); one process per "
                f"data directory: stop that one first",
                directory=d,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.fchmod(fd, 0o600)
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": rfc3339(),
                "purpose": purpose,
            }
            data = (json.dumps(info) + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(d, fd)

    def release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)  # closing the only descriptor drops the flock


def _describe_holder(fd: int) -> str:
    """What the holder wrote into the lock file (it may be mid-write: then say so)."""
    try:
        raw = os.pread(fd, 4096, 0)
        info = json.loads(raw.decode())
        return f"pid {int(info['pid'])} on host {info.get('host', '?')}, started {info.get('started', '?')}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown: the lock file is being written"

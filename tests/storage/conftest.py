"""Fixtures running the same behavioural tests against the file and in-memory storage."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from quorum.storage.log import SegmentedLog
from quorum.storage.memory import MemoryLog, MemorySnapshotStore
from quorum.storage.snapshot import SnapshotStore

SMALL_SEGMENT = 1024  # small enough that a few dozen batches roll several segments


class LogHarness:
    """Opens a log of one kind and 'restarts' it (clean close and reopen)."""

    def __init__(self, kind: str, path: Path, segment_bytes: int = SMALL_SEGMENT) -> None:
        self.kind = kind
        self.path = path
        self.segment_bytes = segment_bytes
        self.log: SegmentedLog | MemoryLog = self._open()

    def _open(self) -> SegmentedLog | MemoryLog:
        if self.kind == "file":
            return SegmentedLog(self.path, segment_bytes=self.segment_bytes, fsync=True)
        if self.kind == "file-unflushed-in-memory":  # the test-only power-loss mode
            return SegmentedLog(
                self.path, segment_bytes=self.segment_bytes, fsync=True, unflushed_in_memory=True
            )
        return MemoryLog()

    def restart(self) -> SegmentedLog | MemoryLog:
        self.log.close()
        if isinstance(self.log, MemoryLog):
            self.log.reopen()
        else:
            self.log = self._open()
        return self.log


@pytest.fixture(params=["file", "file-unflushed-in-memory", "memory"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogHarness]:
    h = LogHarness(request.param, tmp_path / "log")
    yield h
    h.log.close()


@pytest.fixture(params=["file", "memory"])
def snapshot_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], SnapshotStore | MemorySnapshotStore]]:
    made: list[SnapshotStore | MemorySnapshotStore] = []
    mem = MemorySnapshotStore()

    def make() -> SnapshotStore | MemorySnapshotStore:
        store: SnapshotStore | MemorySnapshotStore = (
            SnapshotStore(tmp_path / "snaps") if request.param == "file" else mem
        )
        made.append(store)
        return store

    yield make
    for s in made:
        s.close()

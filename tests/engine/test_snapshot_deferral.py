"""The snapshotter waits while a replica downloads the current snapshot: a new one
would delete it under the download, which would start over. The wait is bounded: past
``DEFER_LIMIT`` times ``snapshot.max_bytes`` of applied log a snapshot is due anyway."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quorum.runtime.snapshots import DEFER_LIMIT, DOWNLOAD_QUIET_MS, Snapshotter
from quorum.runtime.statemachine import Applier
from quorum.types import OffsetAndEpoch


@dataclass
class FakeCore:
    fetching: bool = False
    asked: int = -1

    def snapshot_being_fetched(self, within_ms: int) -> bool:
        self.asked = within_ms
        return self.fetching


def _snapshotter(core: FakeCore, applied: int) -> Snapshotter:
    ap = Applier()
    ap.bytes_since_snapshot = applied
    nothing: Any = None  # storage and metrics are not touched by due()
    return Snapshotter(core, nothing, nothing, ap, lambda: OffsetAndEpoch(0, 0), nothing,  # type: ignore[arg-type]
                       snapshot_bytes=100, wake=lambda: None)


def test_due_when_enough_applied_and_nobody_downloading() -> None:
    assert not _snapshotter(FakeCore(), 99).due()
    assert _snapshotter(FakeCore(), 100).due()


def test_deferred_while_a_download_runs_but_not_forever() -> None:
    core = FakeCore(fetching=True)
    s = _snapshotter(core, 150)
    assert not s.due() and core.asked == DOWNLOAD_QUIET_MS
    assert _snapshotter(FakeCore(fetching=True), DEFER_LIMIT * 100).due()
    s.busy = True
    core.fetching = False
    assert not s.due()  # one snapshot at a time

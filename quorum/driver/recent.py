"""The batches this node appended but has not applied yet, kept in memory for the apply step.

Apply-after-commit used to read every committed batch back from the log and decode it again,
also on the leader, which had the records in hand when it appended them. The
driver now remembers each appended batch here (the leader's records as they were proposed,
a follower's fetched bytes, whose CRCs ``append_fetched`` checked once) until it is applied,
and reads the log only for what is not here: batches from before a restart, or those dropped
because the cache was full. It only ever holds what the log holds at the same offsets: any
truncation or snapshot install clears it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from quorum.core.ready import LeaderBatch, RawBatches
from quorum.records import data_records

__all__ = ["RecentBatch", "RecentBatches"]

# Bounded so that a leader whose followers are away (nothing commits, appends go on) cannot
# grow without limit; past it the oldest batches are applied from the log, as before.
DEFAULT_LIMIT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class RecentBatch:
    base_offset: int
    next_offset: int
    epoch: int
    is_control: bool
    records: Sequence[bytes] | None  # the leader's records; None: decode ``raw``
    raw: memoryview | None  # one whole fetched batch (already CRC-checked)
    size: int

    def data(self) -> list[bytes]:
        if self.records is not None:
            return list(self.records)
        assert self.raw is not None
        return data_records(self.raw)


class RecentBatches:
    def __init__(self, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self._q: deque[RecentBatch] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._q)

    def clear(self) -> None:
        self._q.clear()
        self._bytes = 0

    def _push(self, b: RecentBatch) -> None:
        if self._q and self._q[-1].next_offset != b.base_offset:
            self.clear()  # not contiguous with what we hold (never expected): start over
        self._q.append(b)
        self._bytes += b.size
        while self._bytes > self.limit_bytes and self._q:
            self._bytes -= self._q.popleft().size

    def add_leader(self, b: LeaderBatch) -> None:
        size = sum(len(r) for r in b.records) if not b.controls else 64 * len(b.controls)
        self._push(RecentBatch(b.base_offset, b.next_offset, b.epoch, bool(b.controls),
                               b.records if not b.controls else (), None, size))

    def add_fetched(self, raw: RawBatches) -> None:
        view = memoryview(raw.data)
        pos = 0
        for info in raw.infos:
            size = info.size_bytes
            self._push(RecentBatch(info.base_offset, info.next_offset, info.epoch, info.is_control,
                                   () if info.is_control else None, view[pos : pos + size], size))
            pos += size

    def take(self, offset: int) -> RecentBatch | None:
        """The batch starting at ``offset`` (dropping older ones), or None if not held."""
        while self._q and self._q[0].base_offset < offset:
            self._bytes -= self._q.popleft().size
        if self._q and self._q[0].base_offset == offset:
            b = self._q.popleft()
            self._bytes -= b.size
            return b
        return None

    def put_back(self, b: RecentBatch) -> None:
        """Return a batch ``take`` gave out that could not be applied yet (not committed)."""
        self._q.appendleft(b)
        self._bytes += b.size

    def peek_base(self) -> int | None:
        return self._q[0].base_offset if self._q else None

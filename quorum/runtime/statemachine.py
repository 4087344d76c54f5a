"""Apply-after-commit: the KV state machine fed from the local log up to the high watermark.

Records are applied only once committed (the core's ``Ready.commit``), in log order, straight
from the log's bytes (control batches are skipped). Linearizable reads wait here until the
state machine has applied the read index the core confirmed (KIP-595 leaders answer reads only
for what a majority acknowledged; Raft dissertation §6.4 read index).
"""

from __future__ import annotations

import asyncio

from quorum.records import data_records, decode_batches
from quorum.runtime.kv import KVStore
from quorum.storage.base import LogStorage
from quorum.types import OffsetAndEpoch

__all__ = ["Applier"]

_READ_BYTES = 16 * 1024 * 1024


class Applier:
    """The KV store and how far it has applied the log."""

    def __init__(self, log: LogStorage, applied_end: int, applied_epoch: int) -> None:
        self.log = log
        self.kv = KVStore()
        self.applied_end = applied_end  # exclusive end of what the KV store applied
        self.applied_epoch = applied_epoch
        self.bytes_since_snapshot = 0
        self.applied = asyncio.Event()  # set whenever more records were applied
        self._read_waiting: list[tuple[int, asyncio.Future[None]]] = []  # (index, fut)

    def load_snapshot(self, sid: OffsetAndEpoch, chunks: list[bytes]) -> None:
        """Replace the state by a KIP-630 snapshot ending at ``sid.offset``."""
        self.kv.load_snapshot(chunks, sid.offset - 1)
        self.applied_end = sid.offset
        self.applied_epoch = sid.epoch

    def apply_to(self, hw: int) -> None:
        """Apply every committed batch below ``hw`` not applied yet, then release the reads
        that waited for it."""
        while self.applied_end < hw:
            data = self.log.read(self.applied_end, _READ_BYTES)
            if not data:
                break
            batches, _ = decode_batches(data, verify_crc=False)
            for b in batches:
                if b.info.base_offset >= hw:
                    break
                if not b.info.is_control:
                    self.kv.apply_batch(b.info.base_offset, data_records(b))
                self.bytes_since_snapshot += b.info.size_bytes
                self.applied_end = b.info.next_offset
                self.applied_epoch = b.info.epoch
            else:
                continue
            break
        self.applied.set()
        if self._read_waiting:
            still = []
            for index, fut in self._read_waiting:
                if self.applied_end >= index:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    still.append((index, fut))
            self._read_waiting = still

    async def wait_applied(self, index: int, timeout_s: float) -> None:
        """Until the state machine has applied everything below ``index`` (TimeoutError)."""
        if self.applied_end >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._read_waiting.append((index, fut))
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            self._read_waiting = [(i, f) for i, f in self._read_waiting if f is not fut]
            raise

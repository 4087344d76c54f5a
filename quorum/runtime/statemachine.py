"""The KV state machine as the driver's ``StateMachine`` port, and linearizable reads.

The driver (``quorum.driver``) applies committed data batches in log order (apply-after-commit)
and reports the applied end through the node's sink (:meth:`Applier.advanced`). Reads wait
here until the state machine has applied the read index the core confirmed (KIP-595 leaders
answer reads only for what a majority acknowledged; Raft dissertation §6.4, read index).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from quorum.runtime.kv import KVStore, decode_snapshot
from quorum.types import ErrorCode, KraftError

__all__ = ["Applier"]

# What one record costs in a batch besides its bytes (its length field): for the
# ``snapshot.max_bytes`` policy, which counts log bytes applied since the last snapshot.
_RECORD_OVERHEAD = 4


class Applier:
    """The KV store, how far it has applied the log, and the reads waiting for it."""

    def __init__(self) -> None:
        self.kv = KVStore()
        self.applied_end = 0  # exclusive end of what the KV store applied
        self.applied_epoch = 0
        self.bytes_since_snapshot = 0
        self.applied = asyncio.Event()  # set whenever more records were applied
        self._read_waiting: list[tuple[int, asyncio.Future[None]]] = []  # (index, fut)

    # -- the driver's StateMachine port ------------------------------------------------------
    def apply_batch(self, base_offset: int, records: Iterable[bytes]) -> None:
        recs = records if isinstance(records, list) else list(records)
        self.kv.apply_batch(base_offset, recs)
        self.bytes_since_snapshot += sum(len(r) for r in recs) + _RECORD_OVERHEAD * len(recs)

    def load_snapshot(self, chunks: Iterable[bytes | memoryview], applied_offset: int) -> None:
        """Replace the state by a KIP-630 snapshot holding everything up to ``applied_offset``."""
        self.install_snapshot(self.prepare_snapshot(chunks), applied_offset)

    def prepare_snapshot(self, chunks: Iterable[bytes | memoryview]) -> object:
        """Decode a fetched snapshot into a new map; pure (the driver runs it off the event
        loop while the current map keeps serving)."""
        return decode_snapshot(chunks)

    def install_snapshot(self, state: object, applied_offset: int) -> None:
        """Swap in a map ``prepare_snapshot`` made (on the event loop: reads see the old map
        or the new one, never a mix)."""
        if not isinstance(state, dict):
            raise KraftError(ErrorCode.UNKNOWN_SERVER_ERROR, f"not a prepared KV snapshot: {type(state)}")
        self.kv.data = state
        self.kv.applied_offset = applied_offset
        self.bytes_since_snapshot = 0  # the installed snapshot is this replica's latest one
        self.advanced(applied_offset + 1, self.applied_epoch)

    # -- progress ---------------------------------------------------------------------------
    def advanced(self, applied_end: int, applied_epoch: int) -> None:
        """The driver applied up to ``applied_end``: release the reads waiting for it."""
        self.applied_end, self.applied_epoch = applied_end, applied_epoch
        self.applied.set()
        if self._read_waiting:
            still = []
            for index, fut in self._read_waiting:
                if applied_end >= index:
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

"""Client waits: the futures of writes, linearizable reads and voter changes until the core
reports their outcome in a ``Ready`` (``proposal_results``, ``reads``, ``admin_results``).

A write is acknowledged only once its record is committed AND applied: the driver applies
``commit`` before it reports the results (``quorum/core/ready.py``, the Ready order).
"""

from __future__ import annotations

import asyncio
import itertools
import time

from quorum.core.ready import AdminResult, ProposalResult, ReadResult
from quorum.runtime.metrics import Registry
from quorum.runtime.view import NodeView
from quorum.types import ErrorCode, KraftError

__all__ = ["ClientWaits"]


def _expire(fut: asyncio.Future[None], offset: int) -> None:
    if not fut.done():
        fut.set_exception(
            KraftError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"write at offset {offset} not committed in time; it may or may not take effect",
            )
        )


class ClientWaits:
    def __init__(self, view: NodeView, metrics: Registry) -> None:
        self.view = view
        self._commit_latency = metrics.histogram("commit_latency_seconds", "Time from propose to commit")
        self._ids = itertools.count(1)
        self._proposals: dict[int, asyncio.Future[None]] = {}
        self._commit_t0: dict[int, float] = {}
        self._reads: dict[int, asyncio.Future[int]] = {}
        self._admin: dict[int, asyncio.Future[None]] = {}

    def next_id(self) -> int:
        return next(self._ids)

    # -- waiting ---------------------------------------------------------------------------
    async def write(self, last_offset: int, timeout_s: float) -> None:
        """Until the proposal ending at ``last_offset`` is committed and applied."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._proposals[last_offset] = fut
        self._commit_t0[last_offset] = time.monotonic()
        # A timer handle rather than asyncio.wait_for: this is the hot path of every write.
        timer = loop.call_later(timeout_s, _expire, fut, last_offset)
        try:
            await fut
        finally:
            timer.cancel()
            self._proposals.pop(last_offset, None)
            self._commit_t0.pop(last_offset, None)

    def read_future(self, read_id: int) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._reads[read_id] = fut
        return fut

    def drop_read(self, read_id: int) -> None:
        self._reads.pop(read_id, None)

    def admin_future(self, request_id: int) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._admin[request_id] = fut
        return fut

    def drop_admin(self, request_id: int) -> None:
        self._admin.pop(request_id, None)

    # -- completion (the driver's sink, after the records are applied) ---------------------
    def proposal_done(self, pr: ProposalResult) -> None:
        fut = self._proposals.pop(pr.last_offset, None)
        t0 = self._commit_t0.pop(pr.last_offset, None)
        if t0 is not None and pr.error is ErrorCode.NONE:
            self._commit_latency.observe(time.monotonic() - t0)
        if fut is not None and not fut.done():
            if pr.error is ErrorCode.NONE:
                fut.set_result(None)
            else:
                fut.set_exception(KraftError(pr.error, pr.message or "write outcome unknown"))

    def read_done(self, rr: ReadResult) -> None:
        rfut = self._reads.pop(rr.read_id, None)
        if rfut is not None and not rfut.done():
            if rr.error is ErrorCode.NONE:
                rfut.set_result(rr.index)
            else:
                rfut.set_exception(self.view.error(rr.error, rr.message))

    def admin_done(self, ar: AdminResult) -> None:
        afut = self._admin.pop(ar.request_id, None)
        if afut is not None and not afut.done():
            if ar.error is ErrorCode.NONE:
                afut.set_result(None)
            else:
                afut.set_exception(
                    KraftError(
                        ar.error,
                        ar.message,
                        leader_id=ar.leader_id,
                        leader_epoch=ar.leader_epoch,
                        leader_endpoint=ar.leader_endpoint,
                    )
                )

"""Node-to-node RPCs around the core, the driver's ``Transport`` port: outbound requests go
through a :class:`~quorum.runtime.transport.Transport` and their responses (or ``RpcFailed``)
are stepped back into the core; inbound requests are stepped into the core and wait for the
response it queues under their correlation id.

Inbound correlation ids are replaced by ids local to this node (peers choose theirs
independently) and restored on the answer. A request the core does not answer within the
request timeout (plus the Fetch long-poll wait) is answered REQUEST_TIMED_OUT.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from quorum.core import messages as m
from quorum.core.raft import RaftCore
from quorum.core.ready import Outbound
from quorum.runtime import wire
from quorum.runtime.metrics import Registry
from quorum.runtime.tasks import Tasks
from quorum.runtime.transport import Transport, TransportError
from quorum.types import ErrorCode, KraftError

__all__ = ["InboundCheck", "Peers"]

# (what the server's authentication learned about the caller, the decoded request) -> None,
# or raise KraftError to refuse it before the core sees it (a Fetch as replica 2 must
# come with replica 2's certificate).
InboundCheck = Callable[[object | None, Any], None]


class Peers:
    def __init__(
        self,
        core: RaftCore,
        transport: Transport,
        tasks: Tasks,
        metrics: Registry,
        now_ms: Callable[[], int],
        wake: Callable[[], None],
        request_timeout_ms: int,
        inbound_check: InboundCheck | None = None,
    ) -> None:
        self.core = core
        self.transport = transport
        self.tasks = tasks
        self.metrics = metrics
        self.now_ms = now_ms
        self.wake = wake
        self.request_timeout_s = request_timeout_ms / 1000
        self.inbound_check = inbound_check
        self.stopping = False
        self._ids = itertools.count(1)
        self._waiters: dict[int, tuple[asyncio.Future[Any], int]] = {}

    def _limit(self, msg: Any) -> float:
        if isinstance(msg, m.FetchRequest):
            return self.request_timeout_s + msg.max_wait_ms / 1000
        return self.request_timeout_s

    # -- outbound ---------------------------------------------------------------------------
    def send(self, out: Outbound) -> None:
        """The driver's ``Transport`` port (never blocks): send a request in the background, or
        answer the inbound request waiting for this response."""
        msg = out.message
        if out.is_request:
            self.tasks.spawn(self._send(out))
            return
        waiter = self._waiters.pop(msg.correlation_id, None)
        if waiter is None:
            return  # the inbound request already timed out
        fut, original_cid = waiter
        if not fut.done():
            fut.set_result(dataclasses.replace(msg, correlation_id=original_cid))

    async def _send(self, out: Outbound) -> None:
        msg = out.message
        resp: Any
        if out.destination_endpoint is None:
            resp = m.RpcFailed(msg.correlation_id, out.destination_id, "no endpoint known")
        else:
            try:
                resp = await self.transport.send(
                    out.destination_id, out.destination_endpoint, msg, self._limit(msg)
                )
            except TransportError as e:
                resp = m.RpcFailed(msg.correlation_id, out.destination_id, str(e))
        if self.stopping:
            return
        self.core.step(resp, self.now_ms())
        self.wake()

    # -- inbound ----------------------------------------------------------------------------
    async def handle_rpc(
        self, path: str, body: bytes, peer: object | None = None, decoded: object | None = None
    ) -> bytes | wire.Frame:
        """``decoded``: the request as the server's authorization middleware already decoded
        it from ``body`` (TLS: it checks the replica id the request claims), so that it is not
        decoded twice; taken only if it is a message of the type ``path`` names."""
        cls = wire.REQUEST_BY_PATH.get(path)
        if cls is None:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"unknown RPC {path!r}")
        msg: Any = decoded if type(decoded) is cls else wire.decode(cls, body)
        if self.inbound_check is not None:
            self.inbound_check(peer, msg)
        self.metrics.inc(f"rpc-{path}-requests", help=f"{path} requests received")
        cid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[cid] = (fut, msg.correlation_id)
        self.core.step(dataclasses.replace(msg, correlation_id=cid), self.now_ms())
        self.wake()
        limit = self._limit(msg)
        try:
            async with asyncio.timeout(limit):  # not wait_for: one loop turn less per request
                resp = await fut
        except TimeoutError:
            raise KraftError(ErrorCode.REQUEST_TIMED_OUT, f"{path} not answered in {limit:.1f}s") from None
        finally:
            self._waiters.pop(cid, None)
        return wire.encode_body(resp)  # a large Fetch response stays in two parts (wire.Frame)

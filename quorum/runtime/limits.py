"""Connection and memory limits of the node's HTTP server (issue 8, "A node no request can
brick").

aiohttp bounds one request's body (``client_max_size``) but not how many connections a client
may hold open, how long it may take to send a request head, or how many large bodies are read
at once. Tried on loopback, 500 half-sent connections were all kept open and 100 connections
each sending a 4 MiB body took the leader to 720 MiB. Three rules fix that:

* **Connection cap** (:class:`Limits.max_connections`): :class:`GuardedProtocol` wraps aiohttp's
  protocol; at the cap a new connection evicts the oldest one that is not inside a handler
  (idle or half-sent), and is refused only if every connection is busy. etcd and Kafka both cap
  connections per listener (Kafka ``max.connections``).
* **Head and body deadlines**: a request head must be complete within ``head_timeout_s`` of its
  first byte (or of the connection opening), else the connection is closed (the slowloris
  defence); a body must arrive within ``body_timeout_s`` (408).
* **Body budget**: the bodies being buffered at once share ``body_budget`` bytes; a request
  whose body does not fit gets 503 ``UNAVAILABLE`` at once instead of being buffered, so the
  memory a node spends on request bodies is bounded whatever the number of connections. Large
  bodies leave a reserve for small ones (raft RPCs, ordinary writes).
  aiohttp's own flow control keeps an unread body to about 128 KiB per connection.

The handshake of a TLS connection is bounded separately (``ssl_handshake_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from quorum.types import ErrorCode, KraftError

__all__ = [
    "LIMITS_KEY",
    "GuardedProtocol",
    "Limits",
    "body_middleware",
    "connection_middleware",
    "metrics_text",
]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Limits:
    """The server's limits and its live bookkeeping (one per listening server)."""

    max_connections: int = 512
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 120.0  # a keep-alive connection with no request at all
    body_budget: int = 64 * 1024 * 1024
    handshake_timeout_s: float = 10.0
    linger_s: float = 2.0  # draining a refused body before closing (aiohttp lingering_time)
    small_body: int = 64 * 1024
    small_reserve: int = 8 * 1024 * 1024
    max_body: int = 4 * 1024 * 1024 + 64 * 1024  # set by build_app to its client_max_size
    # live state
    guards: dict[object, GuardedProtocol] = field(default_factory=dict)  # transport -> guard
    buffered: int = 0
    refused_connections: int = 0
    refused_bodies: int = 0

    def stats(self) -> dict[str, int]:
        return {
            "connections": len(self.guards),
            "buffered_body_bytes": self.buffered,
            "refused_connections": self.refused_connections,
            "refused_bodies": self.refused_bodies,
        }


_METRICS = {
    "connections": ("gauge", "Open client and peer connections (issue 8 cap: max_connections)"),
    "buffered_body_bytes": ("gauge", "Request body bytes reserved from the body budget right now"),
    "refused_connections": ("counter", "Connections refused or evicted at the connection cap"),
    "refused_bodies": ("counter", "Requests answered 503 because their body did not fit the budget"),
}


def metrics_text(limits: Limits, prefix: str = "kraftkeeper_http") -> str:
    """The limits in Prometheus text format (appended to the node's /metrics)."""
    out: list[str] = []
    for name, value in limits.stats().items():
        kind, help_text = _METRICS[name]
        n = f"{prefix}_{name}" + ("_total" if kind == "counter" else "")
        out += [f"# HELP {n} {help_text}", f"# TYPE {n} {kind}", f"{n} {value}"]
    return "\n".join(out) + "\n"


LIMITS_KEY = web.AppKey("limits", Limits)


class GuardedProtocol(asyncio.Protocol):
    """Delegates to aiohttp's request handler; applies the connection cap and the head and idle
    deadlines. ``in_request`` is set by :func:`limits_middleware` while a handler runs."""

    def __init__(self, inner: asyncio.Protocol, limits: Limits) -> None:
        self.inner = inner
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.in_request = False
        self._waiting_head = False  # bytes of a request head arrived, the handler not yet run
        self._timer: asyncio.TimerHandle | None = None
        self._admitted = False

    # -- deadlines ---------------------------------------------------------------------------
    def _arm(self, seconds: float, why: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire, why)

    def _expire(self, why: str) -> None:
        self._timer = None
        if not self.in_request and self.transport is not None:
            log.info("closing a connection: %s", why)
            self.transport.abort()

    def request_started(self) -> None:
        self.in_request = True
        self._waiting_head = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def request_done(self) -> None:
        self.in_request = False
        self._arm(self.limits.idle_timeout_s, f"idle for {self.limits.idle_timeout_s:.0f}s")

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        lim = self.limits
        self.transport = transport  # type: ignore[assignment]
        if len(lim.guards) >= lim.max_connections and not self._evict_one():
            lim.refused_connections += 1
            transport.abort()  # type: ignore[attr-defined]
            return
        self._admitted = True
        lim.guards[transport] = self
        self.inner.connection_made(transport)
        self._arm(lim.head_timeout_s, f"no request head within {lim.head_timeout_s:.0f}s")
        self._waiting_head = True

    def _evict_one(self) -> bool:
        for guard in self.limits.guards.values():  # insertion order: oldest first
            if not guard.in_request and guard.transport is not None:
                self.limits.refused_connections += 1
                guard.transport.abort()
                self.limits.guards.pop(guard.transport, None)
                return True
        return False

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self.in_request and not self._waiting_head:
            self._waiting_head = True
            self._arm(
                self.limits.head_timeout_s,
                f"request head not complete within {self.limits.head_timeout_s:.0f}s",
            )
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self._admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._admitted:
            return
        self.limits.guards.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def connection_middleware(limits: Limits) -> Any:
    """Outermost: marks the connection busy while its handler runs (the head and idle deadlines
    apply only between requests)."""

    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        guard = limits.guards.get(request.transport) if request.transport is not None else None
        if guard is not None:
            guard.request_started()
        try:
            return await handler(request)
        finally:
            if guard is not None:
                guard.request_done()

    return mw


def body_middleware(limits: Limits) -> Any:
    """Reads the body within the body deadline and budget before the handler sees it
    (``request.read()`` caches it). Placed after authentication, so an unauthenticated caller
    never gets a body buffered."""

    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.body_exists:
            return await handler(request)
        want = min(request.content_length or limits.max_body, limits.max_body)
        # Large bodies may not take the last ``small_reserve`` bytes, so a flood of large
        # PUTs never starves raft RPCs and ordinary small writes.
        cap = limits.body_budget - (limits.small_reserve if want > limits.small_body else 0)
        if limits.buffered + want > cap:
            limits.refused_bodies += 1
            raise KraftError(
                ErrorCode.UNAVAILABLE,
                f"server busy: {limits.buffered} bytes of request bodies already buffered "
                f"(budget {limits.body_budget}); retry",
            )
        limits.buffered += want
        try:
            try:
                if request.content.is_eof():  # all of it already arrived: no deadline needed
                    await request.read()
                else:
                    async with asyncio.timeout(limits.body_timeout_s):
                        await request.read()
            except TimeoutError:
                resp = web.json_response(
                    {
                        "error_code": ErrorCode.INVALID_REQUEST.value,
                        "message": f"request body not received within {limits.body_timeout_s:.0f}s",
                    },
                    status=408,
                )
                resp.force_close()
                return resp
            return await handler(request)
        finally:
            limits.buffered -= want

    return mw

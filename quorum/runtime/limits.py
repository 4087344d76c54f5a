"""Connection and memory limits of the node's HTTP server (no request may exhaust it).

aiohttp bounds one request's body (``client_max_size``) but not how many connections a client
may hold open, how long it may take to send a request head, or how many large bodies are read
at once. Tried on loopback, 500 half-sent connections were all kept open and 100 connections
each sending a 4 MiB body took the leader to 720 MiB. These rules fix that:

* **Connection cap** (:class:`Limits.max_connections`): ``GuardedProtocol`` wraps aiohttp's
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
* **Shared loop turns** (:class:`~quorum.runtime.turns.ReadTurns`): the connections reading a large body share
  ``turn_quota`` bytes per event-loop turn, so a flood of bodies cannot hold the loop for
  seconds while raft RPCs wait (the leader lost its leadership in the 4 MiB-body flood).
  :class:`~quorum.runtime.loopwatch.LoopWatch` measures the loop's lag (``/metrics``) and logs
  each stall with what the process did meanwhile.
* **Refused bodies are not read**: a request refused before its body was read (401, 403, 503
  budget, 413 by Content-Length) is answered with ``Connection: close``, then the connection
  stops reading and is closed as soon as the kernel has the answer acknowledged
  (``GuardedProtocol.answer_then_close``). aiohttp's own way, ``lingering_time``, reads and
  throws away what the client still sends, so a client refused at its first byte could make the
  node read (and decrypt) a slowly sent body for the whole lingering time.

TLS handshakes are bounded in time (``handshake_timeout_s``) and in how many start per loop
turn (``handshakes_per_turn``, :class:`~quorum.runtime.turns.StartTurns`): ``GuardedProtocol``
starts TLS itself, so a burst of new connections (about 1 ms of CPU per handshake) is spread over
many loop turns. ``GuardedProtocol`` is :mod:`quorum.runtime.guard`; this module holds the
numbers, the counters and the aiohttp middlewares.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from quorum.runtime.turns import ReadTurns, StartTurns
from quorum.security.auth import required_permission
from quorum.types import ErrorCode, KraftError

if TYPE_CHECKING:
    from quorum.runtime.guard import GuardedProtocol

__all__ = [
    "LIMITS_KEY",
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
    handshakes_per_turn: int = 4  # TLS handshakes started per loop turn (StartTurns)
    linger_s: float = 2.0  # the most a refused request's answer may take to be acknowledged
    small_body: int = 64 * 1024
    small_reserve: int = 8 * 1024 * 1024
    max_body: int = 4 * 1024 * 1024 + 64 * 1024  # set by build_app to its client_max_size
    turn_quota: int = 1024 * 1024  # bytes of large bodies read per event-loop turn (ReadTurns)
    # live state
    guards: dict[object, GuardedProtocol] = field(default_factory=dict)  # transport -> guard
    turns: ReadTurns = field(init=False)
    handshake_turns: StartTurns = field(init=False)
    handshaking: dict[GuardedProtocol, None] = field(default_factory=dict)  # oldest first
    # the open peer streams (WebSocket responses; their connections are in ``guards`` too)
    peer_streams: set[web.WebSocketResponse] = field(default_factory=set)
    buffered: int = 0
    refused_connections: int = 0
    refused_bodies: int = 0
    read_bytes: int = 0  # bytes handed to the HTTP protocol (after TLS), for LoopWatch
    read_calls: int = 0
    loop_stalls: int = 0
    loop_lag_max_ms: int = 0
    loop_busy_max_ms: int = 0
    loop_cpu_wait_ms: int = 0

    def __post_init__(self) -> None:
        self.turns = ReadTurns(self.turn_quota)
        self.handshake_turns = StartTurns(self.handshakes_per_turn)

    def stats(self) -> dict[str, int]:
        return {
            "connections": len(self.guards) + len(self.handshaking),
            "peer_streams": len(self.peer_streams),
            "buffered_body_bytes": self.buffered,
            "refused_connections": self.refused_connections,
            "refused_bodies": self.refused_bodies,
            "queued_handshakes": self.handshake_turns.queued,
            "loop_stalls": self.loop_stalls,
            "loop_lag_max_ms": self.loop_lag_max_ms,
            "loop_busy_max_ms": self.loop_busy_max_ms,
            "loop_cpu_wait_ms": self.loop_cpu_wait_ms,
            "held_reads": self.turns.held,
        }


_METRICS = {
    "connections": ("gauge", "Open client and peer connections (capped by max_connections)"),
    "peer_streams": ("gauge", "Open peer streams from other nodes (each also counted in connections)"),
    "buffered_body_bytes": ("gauge", "Request body bytes reserved from the body budget right now"),
    "refused_connections": ("counter", "Connections refused or evicted at the connection cap"),
    "refused_bodies": ("counter", "Requests answered 503 because their body did not fit the budget"),
    "queued_handshakes": ("counter", "TLS handshakes that waited for a later loop turn to start"),
    "loop_stalls": ("counter", "Times the event loop ran a timer more than 250 ms late"),
    "loop_lag_max_ms": ("gauge", "The largest event-loop lag seen since start, in milliseconds"),
    "loop_busy_max_ms": (
        "gauge",
        "The most CPU the event-loop thread used between two 50 ms lag checks, in milliseconds "
        "(far over 50: one loop turn did that much work)",
    ),
    "loop_cpu_wait_ms": (
        "counter",
        "Milliseconds the event-loop thread was ready to run but waited for a CPU (Linux)",
    ),
    "held_reads": ("counter", "Times a large body's connection was held to the next loop turn"),
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


def connection_middleware(limits: Limits) -> Any:
    """Outermost: marks the connection busy while its handler runs (the head and idle deadlines
    apply only between requests)."""

    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        guard = limits.guards.get(request.transport) if request.transport is not None else None
        if guard is not None:
            size = request.content_length
            guard.request_started(request.body_exists and (size is None or size > limits.small_body))
        try:
            resp = await handler(request)
            if guard is not None and request.body_exists and not request.content.is_eof():
                await _answer_then_close(request, resp, guard)
            return resp
        finally:
            if guard is not None:
                guard.request_done()

    return mw


async def _answer_then_close(request: web.Request, resp: web.StreamResponse, guard: GuardedProtocol) -> None:
    """``resp`` refuses a request whose body was not (all) read: send it with ``Connection:
    close`` and close without reading the rest (module docstring, "Refused bodies")."""
    resp.force_close()
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError:
        pass  # the client is gone: nothing to wait for
    await guard.answer_then_close()
    # aborted: aiohttp must neither linger (drain) nor keep the connection alive
    request.protocol.force_close()


def _refuse_unread(request: web.Request) -> web.Response | None:
    """The bodies no one is reserved budget for, refused before a byte of them is read:

    * a body sent to an open endpoint (``/healthz``, ``/readyz``, ``/metrics``): those take no
      credential, so anything they buffered would be budget a stranger holds (about 220
      connections announcing a large body to ``/healthz`` once held all 64 MiB and every write
      and peer Fetch got 503);
    * a ``Content-Encoding`` other than identity: the budget counts the bytes as sent, and a
      decoded body can be a thousand times larger (RFC 9110 15.5.16: 415). The server parses
      bodies with decompression off (:func:`quorum.runtime.server.start_server`), so nothing is
      inflated before this answer either."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        resp = web.json_response(
            {
                "error_code": ErrorCode.INVALID_REQUEST.value,
                "message": f"Content-Encoding {encoding[:40]!r} is not accepted: send the body unencoded",
            },
            status=415,
        )
    elif required_permission(request.method, request.path) is None:
        resp = web.json_response(
            {
                "error_code": ErrorCode.INVALID_REQUEST.value,
                "message": f"{request.method} {request.path} takes no request body",
            },
            status=400,
        )
    else:
        return None
    resp.force_close()
    return resp


def body_middleware(limits: Limits) -> Any:
    """Reads the body within the body deadline and budget before the handler sees it
    (``request.read()`` caches it). Placed after authentication, so an unauthenticated caller
    never gets a body buffered."""

    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.body_exists:
            return await handler(request)
        refusal = _refuse_unread(request)
        if refusal is not None:
            return refusal
        if (request.content_length or 0) > limits.max_body:  # refused unread: answer_then_close
            raise KraftError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"request body of {request.content_length} bytes is over the limit of {limits.max_body}",
            )
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
            except ConnectionResetError:
                # the client went away mid-body (a flood closing its sockets): nobody to answer,
                # and no traceback per connection in the log
                resp = web.Response(status=400)
                resp.force_close()
                return resp
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

"""Connection and memory limits of the node's HTTP server (no request may exhaust it).

aiohttp bounds one request's body (``client_max_size``) but not how many connections a client
may hold open, how long it may take to send a request head, or how many large bodies are read
at once. Tried on loopback, 500 half-sent connections were all kept open and 100 connections
each sending a 4 MiB body took the leader to 720 MiB. These rules fix that:

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
* **Shared loop turns** (:class:`~quorum.runtime.turns.ReadTurns`): the connections reading a large body share
  ``turn_quota`` bytes per event-loop turn, so a flood of bodies cannot hold the loop for
  seconds while raft RPCs wait (the leader lost its leadership in the 4 MiB-body flood).
  :class:`~quorum.runtime.loopwatch.LoopWatch` measures the loop's lag (``/metrics``) and logs
  each stall with what the process did meanwhile.
* **Refused bodies are not read**: a request refused before its body was read (401, 403, 503
  budget, 413 by Content-Length) is answered with ``Connection: close``, then the connection
  stops reading and is closed as soon as the kernel has the answer acknowledged
  (:meth:`GuardedProtocol.answer_then_close`). aiohttp's own way, ``lingering_time``, reads and
  throws away what the client still sends, so a client refused at its first byte could make the
  node read (and decrypt) a slowly sent body for the whole lingering time.

TLS handshakes are bounded in time (``handshake_timeout_s``) and in how many start per loop
turn (``handshakes_per_turn``, :class:`~quorum.runtime.turns.StartTurns`): :class:`GuardedProtocol`
starts TLS itself, so a burst of new connections (about 1 ms of CPU per handshake) is spread over
many loop turns.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import ssl
import struct
import termios
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from quorum.runtime.turns import FlowTransport, ReadTurns, StartTurns
from quorum.security.auth import required_permission
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


class GuardedProtocol(asyncio.Protocol):
    """Delegates to aiohttp's request handler; applies the connection cap and the head and idle
    deadlines; large bodies share loop turns (:class:`~quorum.runtime.turns.ReadTurns`).
    ``in_request`` and ``bulk`` are set by :func:`connection_middleware` when a request
    starts."""

    def __init__(self, inner: asyncio.Protocol, limits: Limits, tls: ssl.SSLContext | None = None) -> None:
        self.inner = inner
        self.limits = limits
        self.tls = tls
        self._raw: asyncio.Transport | None = None  # the TCP connection under a TLS one
        self._handshake_task: asyncio.Task[None] | None = None
        # what the TLS layer delivers between the end of the handshake and _admit (the client's
        # first request can arrive with its last handshake message)
        self._early: list[bytes] = []
        self._raw_early: list[bytes] = []
        self._tls_started = False
        self._lost = False
        self.transport: FlowTransport | None = None
        self.in_request = False
        # the current (or last, while aiohttp drains a refused body) request's body is large;
        # set from its head, so a body refused before it is read (401, 403, 503) counts too
        self.bulk = False
        self._waiting_head = False  # bytes of a request head arrived, the handler not yet run
        self._timer: asyncio.TimerHandle | None = None
        self._admitted = False
        self.refused = False  # a request was refused unread: nothing more is read (answer_then_close)

    # -- deadlines ---------------------------------------------------------------------------
    def _arm(self, seconds: float, why: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire, why)

    def _expire(self, why: str) -> None:
        self._timer = None
        t = self.transport if self.transport is not None else self._raw
        if not self.in_request and t is not None:
            log.info("closing a connection: %s", why)
            t.abort()

    def request_started(self, bulk: bool = False) -> None:
        self.in_request = True
        self.bulk = bulk
        self._waiting_head = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def request_done(self) -> None:
        self.in_request = False
        self._arm(self.limits.idle_timeout_s, f"idle for {self.limits.idle_timeout_s:.0f}s")

    async def answer_then_close(self) -> None:
        """After a refused request whose body was not read: read no more of it, wait until the
        answer has left (nothing in the write buffers, nothing unacknowledged in the socket's
        send queue; at most ``linger_s``), then abort. Closing with unread input sends a reset,
        which is why the answer must be acknowledged first (else the client may never see it)."""
        self.refused = True
        self._stop_reading()
        flow = self.transport
        # the kernel's send queue has no wake-up to wait on: look every 5 ms
        for _ in range(max(1, int(self.limits.linger_s / 0.005))):
            if flow is None or flow.closed or not self._unsent():
                break
            await asyncio.sleep(0.005)
        if flow is not None:
            flow.abort()

    def _stop_reading(self) -> None:
        for t in (self.transport.real if self.transport is not None else None, self._raw):
            try:
                if t is not None and not t.is_closing():
                    t.pause_reading()
            except (AttributeError, NotImplementedError, RuntimeError):
                pass  # a closing transport

    def _unsent(self) -> int:
        """Bytes of the answer not yet acknowledged by the client's kernel."""
        n = 0
        for t in (self.transport.real if self.transport is not None else None, self._raw):
            try:
                n += t.get_write_buffer_size() if t is not None else 0
            except (AttributeError, NotImplementedError, RuntimeError):
                pass
        sock = (self._raw or self.transport).get_extra_info("socket") if self.transport else None
        if sock is not None:
            try:  # Linux: SIOCOUTQ (= TIOCOUTQ), bytes sent but not acknowledged or not sent yet
                n += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
            except (OSError, ValueError):
                pass
        return n

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        lim = self.limits
        if self.tls is None or self._raw is not None:
            self._admit(transport)  # type: ignore[arg-type]
            return
        # TLS: the connection counts against the cap from its first byte, and its handshake
        # (about 1 ms of CPU) starts in a turn with room (StartTurns), so a burst of new
        # connections is spread over many loop turns instead of one.
        self._raw = transport  # type: ignore[assignment]
        if len(lim.guards) + len(lim.handshaking) >= lim.max_connections and not self._evict_one():
            lim.refused_connections += 1
            transport.abort()  # type: ignore[attr-defined]
            return
        transport.pause_reading()  # type: ignore[attr-defined]
        lim.handshaking[self] = None
        self._arm(lim.handshake_timeout_s, f"no TLS handshake within {lim.handshake_timeout_s:.0f}s")
        self._handshake_task = asyncio.get_running_loop().create_task(self._handshake())

    async def _handshake(self) -> None:
        lim, raw, ctx = self.limits, self._raw, self.tls
        assert raw is not None and ctx is not None
        loop = asyncio.get_running_loop()
        tls: asyncio.Transport | None = None
        try:
            await lim.handshake_turns.turn()
            if raw.is_closing() or self._lost:
                return
            started = asyncio.ensure_future(
                loop.start_tls(
                    raw, self, ctx, server_side=True, ssl_handshake_timeout=lim.handshake_timeout_s
                )
            )
            # start_tls swaps the connection's protocol for its TLS layer and schedules that
            # layer's connection_made; what uvloop read before (it starts reading after
            # connection_made, whatever the protocol asked) is handed to the layer after it.
            await asyncio.sleep(0)
            loop.call_soon(self._replay_raw, raw)
            tls = await started
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError) as e:
            log.debug("TLS handshake failed: %r", e)
        finally:
            lim.handshaking.pop(self, None)
        if tls is None or self._lost:  # (closed right after its handshake)
            raw.abort()
            return
        self._admit(tls)

    def _replay_raw(self, raw: asyncio.Transport) -> None:
        """Feed the bytes read before the TLS layer existed to it (a ``BufferedProtocol``)."""
        pending, self._raw_early = b"".join(self._raw_early), []
        self._tls_started = True
        proto = raw.get_protocol()
        while pending and not raw.is_closing() and hasattr(proto, "buffer_updated"):
            buf = memoryview(proto.get_buffer(len(pending)))  # type: ignore[attr-defined]
            n = min(len(buf), len(pending))
            buf[:n] = pending[:n]
            proto.buffer_updated(n)
            pending = pending[n:]

    def _admit(self, transport: asyncio.Transport) -> None:
        lim = self.limits
        flow = self.transport = FlowTransport(transport)
        if self._raw is None and len(lim.guards) >= lim.max_connections and not self._evict_one():
            lim.refused_connections += 1
            flow.abort()
            return
        self._admitted = True
        lim.guards[flow] = self
        self.inner.connection_made(flow)
        self._arm(lim.head_timeout_s, f"no request head within {lim.head_timeout_s:.0f}s")
        self._waiting_head = True
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

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
            if self._raw is not None and self.transport is None:
                if self._tls_started:
                    self._early.append(data)  # decrypted, before _admit
                else:  # raw TLS bytes before the handshake's turn: kept for _replay_raw
                    self._raw_early.append(data)
                    self._raw.pause_reading()
            return
        if self.refused:  # read while reading was being paused: dropped, and paused again
            self._stop_reading()
            return
        self.limits.read_bytes += len(data)
        self.limits.read_calls += 1
        if self.bulk and self.transport is not None:
            self.limits.turns.account(self.transport, len(data))
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
        self.limits.handshaking.pop(self, None)
        self._lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.closed = True
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

"""The connection guard of the node's HTTP server: :class:`GuardedProtocol` wraps aiohttp's
protocol on every connection and applies the connection cap, the head and idle deadlines, the
TLS handshake bounds, shared loop turns for large bodies, and "answer, then close without
reading" for refused requests. The rules and their numbers are :mod:`quorum.runtime.limits`."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import ssl
import struct
import termios

from quorum.runtime.limits import Limits
from quorum.runtime.turns import FlowTransport

__all__ = ["GuardedProtocol"]

log = logging.getLogger("quorum.runtime.limits")


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

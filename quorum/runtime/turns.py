"""Sharing the event loop's turns between large request bodies, TLS handshakes and everything
else (no request may monopolise the loop; used by :mod:`quorum.runtime.limits`).

:class:`FlowTransport` is the transport aiohttp's protocol sees, so reading can be paused for
two reasons at once (aiohttp's flow control, and :class:`ReadTurns` holding the connection).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any

__all__ = ["FlowTransport", "ReadTurns", "StartTurns"]


class FlowTransport(asyncio.Transport):
    """The transport aiohttp's protocol sees. Reading is paused while aiohttp asks for it (its
    own flow control) or while :class:`ReadTurns` holds the connection; everything else goes
    to the real transport."""

    def __init__(self, real: asyncio.Transport) -> None:
        super().__init__()
        self.real = real
        self.app_paused = False
        self.held = False
        self.closed = False
        self._paused = False

    def _apply(self) -> None:
        want = (self.app_paused or self.held) and not self.closed
        if want == self._paused:
            return
        self._paused = want
        try:
            if want:
                self.real.pause_reading()
            else:
                self.real.resume_reading()
        except (AttributeError, NotImplementedError, RuntimeError):
            pass  # a closing transport

    def pause_reading(self) -> None:
        self.app_paused = True
        self._apply()

    def resume_reading(self) -> None:
        self.app_paused = False
        self._apply()

    def is_reading(self) -> bool:
        return not self._paused and not self.real.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.real.get_extra_info(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.real.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.real.writelines(list_of_data)

    def write_eof(self) -> None:
        self.real.write_eof()

    def can_write_eof(self) -> bool:
        return self.real.can_write_eof()

    def is_closing(self) -> bool:
        return self.real.is_closing()

    def close(self) -> None:
        self.real.close()

    def abort(self) -> None:
        self.real.abort()

    def get_write_buffer_size(self) -> int:
        return self.real.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.real.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.real.set_write_buffer_limits(high, low)


class ReadTurns:
    """Shares each event-loop turn between large request bodies and everything else.

    Why: the event loop delivers every ready socket's bytes in one poll phase before it runs
    any task; uvloop reads up to 32 x 256 KiB per socket there, and TLS decrypts each read in
    the same callback. 100 connections streaming 4 MiB bodies made single turns of 40+ MiB
    (measured: 1.2 s turns with 0.25 s of CPU on the loaded test machine), during which the
    leader answered no Fetch, and the followers elected a new leader after their fetch timeout
    (KIP-595 ``fetch.timeout.ms``). Now the connections reading a large body (``bulk`` in
    ``quorum.runtime.limits.GuardedProtocol``) share ``quota`` bytes per turn: past it a
    connection is held (reading paused, TLS bytes stay encrypted in the kernel and the SSL
    buffer) and resumed at the end of a turn, oldest first, so a turn does a bounded amount of
    body work and raft RPCs, small requests and new connections are served every turn. Small
    requests are never held."""

    CHUNK = 256 * 1024  # what one resumed connection reads in a turn (one socket read)

    def __init__(self, quota: int) -> None:
        self.quota = quota
        self.used = 0
        self.held = 0
        self.waiting: deque[FlowTransport] = deque()
        self._turn_end_due = False

    def account(self, flow: FlowTransport, n: int) -> None:
        self.used += n
        if not self._turn_end_due:
            # runs after this turn's I/O callbacks, before the next poll
            self._turn_end_due = True
            asyncio.get_running_loop().call_soon(self._turn_end)
        if self.used >= self.quota and not flow.held:
            flow.held = True
            flow._apply()
            self.held += 1
            self.waiting.append(flow)

    def _turn_end(self) -> None:
        self._turn_end_due = False
        self.used = 0
        room = max(1, self.quota // self.CHUNK)
        while self.waiting and room > 0:
            flow = self.waiting.popleft()
            flow.held = False
            flow._apply()
            if not flow.closed:
                room -= 1
        if self.waiting:  # nothing may arrive to end the next turn: end it anyway
            self._turn_end_due = True
            asyncio.get_running_loop().call_soon(self._turn_end)


class StartTurns:
    """At most ``per_turn`` TLS handshakes start in one event-loop turn; later ones wait for
    the next turns, oldest first. A handshake costs about 1 ms of CPU on the server (key
    exchange and signature, when the ClientHello is processed), so a burst of 128 new
    connections started at once is a 0.1 s turn, several times that on a loaded machine. Unlike
    a cap on handshakes in progress, nothing is held while a handshake waits for its client:
    slow or silent clients cannot keep others from starting (the handshake deadline closes
    them)."""

    def __init__(self, per_turn: int) -> None:
        self.per_turn = per_turn
        self.started = 0
        self.queued = 0  # handshakes that had to wait for a later turn
        self.waiting: deque[asyncio.Future[None]] = deque()
        self._turn_end_due = False

    async def turn(self) -> None:
        """Return when this handshake may start."""
        self._schedule_turn_end()
        if self.started < self.per_turn and not self.waiting:
            self.started += 1
            return
        self.queued += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        await fut

    def _schedule_turn_end(self) -> None:
        if not self._turn_end_due:
            self._turn_end_due = True
            asyncio.get_running_loop().call_soon(self._turn_end)

    def _turn_end(self) -> None:
        self._turn_end_due = False
        self.started = 0
        while self.waiting and self.started < self.per_turn:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                self.started += 1
        if self.waiting or self.started:
            self._schedule_turn_end()

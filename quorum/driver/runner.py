"""The asyncio loop around :class:`~quorum.driver.driver.Driver` (pure asyncio, no HTTP).

``AsyncRunner.run(stop)`` owns the loop "wake -> ready -> begin -> await persist in an
executor -> finish" and a ticker. Inbound messages step the core at any time, also while a
persist is in flight (they land in the next Ready: see :mod:`quorum.core.ready`), except
what may leave without a persist: ``Driver.send_now`` sends that as it is stepped in.

It dies loudly: an exception from the driver, the core or a port is logged and re-raised
from ``run``, so the process exits non-zero instead of serving with a wedged core.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor

from quorum.core.messages import Message
from quorum.core.raft import RaftCore
from quorum.driver.driver import Driver, Pending

log = logging.getLogger("kraftkeeper.driver")


class AsyncRunner:
    def __init__(self, driver: Driver, tick_ms: int, executor: Executor | None = None) -> None:
        self.driver = driver
        self.tick_ms = tick_ms
        self.executor = executor
        self.busy_seconds = 0.0  # time spent carrying out Readies (KIP-595 poll-idle-ratio)
        self._wake = asyncio.Event()
        self._stopping = False
        self.turned_at = time.monotonic()  # last turn of the loop (/healthz bound)
        # While a persist that saves no quorum state runs, wake() also schedules one
        # Driver.send_now for what was stepped in (see _persist).
        self._persisting = False
        self._send_soon = False
        self._send_error: Exception | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None

    @property
    def core(self) -> RaftCore:
        return self.driver.core

    def now_ms(self) -> int:
        return self.driver.ports.clock.now_ms()

    def wake(self) -> None:
        """Something was stepped or proposed: take the next Ready soon (or, while a persist
        runs, send at once what needs no fsync)."""
        self._wake.set()
        if self._persisting and not self._send_soon and self._aloop is not None:
            self._send_soon = True  # one send_now for everything stepped in this loop turn
            self._aloop.call_soon(self._send_now)

    def _send_now(self) -> None:
        self._send_soon = False
        if not self._persisting:
            return
        try:
            self.driver.send_now()
        except Exception as e:  # re-raised by _persist: the runner dies loudly
            self._send_error = e

    def step(self, message: Message) -> None:
        """Step an inbound request or a response into the core (any time) and wake the loop."""
        self.driver.core.step(message, self.now_ms())
        self.wake()

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; then finish the Ready in flight and return. Re-raises
        (after logging) any exception of the loop or the ticker."""
        loop_task = asyncio.create_task(self._loop(), name="kraftkeeper-driver")
        tick_task = asyncio.create_task(self._ticker(), name="kraftkeeper-ticker")
        stop_task = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({loop_task, tick_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            for t in (loop_task, tick_task):
                if t.done() and not t.cancelled() and t.exception() is not None:
                    exc = t.exception()
                    log.critical("driver failed, stopping the node: %r", exc, exc_info=exc)
                    raise RuntimeError(f"driver failed: {exc!r}") from exc
            self._stopping = True
            self._wake.set()
            tick_task.cancel()
            await loop_task  # the Ready in flight completes (its persist cannot be undone)
        finally:
            self._stopping = True
            for task in (loop_task, tick_task, stop_task):
                if not task.done():
                    task.cancel()
            await asyncio.gather(loop_task, tick_task, stop_task, return_exceptions=True)

    async def _ticker(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.tick_ms / 1000)
            self.driver.core.tick(self.now_ms())
            self._wake.set()

    async def _persist(self, loop: asyncio.AbstractEventLoop, pending: Pending) -> None:
        """Run ``persist`` in the executor; meanwhile, whenever something is stepped in, send
        what needs no persist (``Driver.send_now``: a leader's commit and answers, Fetch
        responses) instead of holding it until this fsync completes. Not while the Ready
        saves quorum state (send_now would send nothing)."""
        persist = loop.run_in_executor(self.executor, self.driver.persist, pending)
        self._persisting = pending.quorum_state is None
        try:
            await persist
        finally:
            self._persisting = False
        if self._send_error is not None:
            raise self._send_error

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        self._aloop = loop
        driver = self.driver
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            self.turned_at = time.monotonic()
            while True:
                ready = driver.core.ready()
                if ready.is_empty():
                    break
                t0 = time.monotonic()
                pending = driver.begin(ready)
                if pending.needs_persist:
                    await self._persist(loop, pending)
                driver.finish(pending)
                self.turned_at = time.monotonic()
                self.busy_seconds += time.monotonic() - t0
                if not pending.needs_persist:
                    # Give request handlers a turn: a busy core must never starve the network.
                    # After a persist they had one (the executor await), and what the fsync
                    # enabled (a follower's next Fetch, a leader's commit) leaves at once.
                    await asyncio.sleep(0)

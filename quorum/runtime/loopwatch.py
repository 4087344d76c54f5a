"""The event loop's lag, measured for the node's HTTP server (no request may stall it):
:class:`LoopWatch` notes how late a 50 ms timer runs, exports the worst lag in
``/metrics`` (through :class:`~quorum.runtime.limits.Limits`) and logs each stall with what the
process did meanwhile. A raft leader stalled past the followers' fetch timeout loses its
leadership (KIP-595), so a stall must be explainable from the log.
"""

from __future__ import annotations

import asyncio
import logging
import time

from quorum.runtime.limits import Limits

log = logging.getLogger(__name__)


class LoopWatch:
    """Measures the event loop's lag: a timer due every ``interval_s`` notes how late it ran.
    A lag over ``stall_s`` is a stall: counted, and logged with what the process did meanwhile
    (CPU time, time spent runnable but waiting for a CPU where Linux reports it, and the bytes
    the HTTP protocol received), which tells a loop busy reading (CPU close to the lag, many
    bytes) from a process starved of CPU (long run-queue wait) or blocked (neither). A raft
    leader stalled past the followers' fetch timeout loses its leadership (KIP-595)."""

    def __init__(self, limits: Limits, interval_s: float = 0.05, stall_s: float = 0.25) -> None:
        self.limits = limits
        self.interval_s = interval_s
        self.stall_s = stall_s
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._cpu = 0.0
        self._thread_cpu = 0.0
        self._bytes = 0
        self._calls = 0
        self._wait_ns = 0

    @staticmethod
    def _runqueue_wait_ns() -> int:
        """Nanoseconds this thread has spent runnable but not running (Linux schedstat)."""
        try:
            with open("/proc/thread-self/schedstat", "rb") as f:
                return int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    def start(self) -> None:
        self._arm(asyncio.get_running_loop())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, loop: asyncio.AbstractEventLoop, wait_ns: int | None = None) -> None:
        lim = self.limits
        self._due = loop.time() + self.interval_s
        self._cpu = time.process_time()
        self._thread_cpu = time.thread_time()
        self._bytes, self._calls = lim.read_bytes, lim.read_calls
        self._wait_ns = self._runqueue_wait_ns() if wait_ns is None else wait_ns
        self._handle = loop.call_at(self._due, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        lim = self.limits
        lag = max(0.0, loop.time() - self._due)
        lim.loop_lag_max_ms = max(lim.loop_lag_max_ms, int(lag * 1000))
        busy = time.thread_time() - self._thread_cpu
        lim.loop_busy_max_ms = max(lim.loop_busy_max_ms, int(busy * 1000))
        wait_ns = self._runqueue_wait_ns()
        lim.loop_cpu_wait_ms += (wait_ns - self._wait_ns) // 1_000_000
        if lag > self.stall_s:
            lim.loop_stalls += 1
            log.warning(
                "event loop stalled %.0f ms: %.0f ms of CPU (%.0f ms on the loop's thread), "
                "%.0f ms waiting for a CPU, %d KiB received in %d reads, %d connections",
                lag * 1000,
                (time.process_time() - self._cpu) * 1000,
                busy * 1000,
                (wait_ns - self._wait_ns) / 1e6,
                (lim.read_bytes - self._bytes) >> 10,
                lim.read_calls - self._calls,
                len(lim.guards),
            )
        self._arm(loop, wait_ns)

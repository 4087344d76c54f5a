"""A node's health and metrics: the ``/healthz`` liveness rule and the Prometheus text of
``/metrics`` (KIP-595 / KIP-856 / KIP-704 raft metrics from the core, plus the node's own)."""

from __future__ import annotations

import time
from typing import Any

from quorum.core.raft import RaftCore
from quorum.driver import AsyncRunner, Driver, Pending
from quorum.runtime.metrics import Registry
from quorum.runtime.statemachine import Applier

__all__ = ["LOOP_S", "STALL_S", "Observer"]

STALL_S = 30.0  # a persist (quorum-state save + fsync) this long means the disk is wedged
# The ticker wakes the driver loop every tick; no turn for this long (outside a persist, which
# STALL_S covers) means the loop is wedged: liveness fails so the kubelet restarts the node.
LOOP_S = 30.0


class Observer:
    def __init__(
        self,
        node_id: int,
        core: RaftCore,
        driver: Driver,
        runner: AsyncRunner,
        applier: Applier,
        metrics: Registry,
    ) -> None:
        self.node_id = node_id
        self.core = core
        self.driver = driver
        self.runner = runner
        self.applier = applier
        self.metrics = metrics
        self._stall: tuple[Pending, float] | None = None  # (Ready in flight, first seen)
        self._busy_mark = 0.0
        self._idle_since = time.monotonic()

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Live unless a Ready has been in flight (its quorum-state save or fsync running) for
        more than ``STALL_S``, or the driver loop has not turned for ``LOOP_S`` (a
        wedged driver must fail the liveness probe; a dead one already stops the process). No
        storage UUID: nothing unauthenticated may reveal it (it helps impersonation)."""
        pending = self.driver.in_flight
        now = time.monotonic()
        if pending is None:
            self._stall = None
        elif self._stall is None or self._stall[0] is not pending:
            self._stall = (pending, now)
        stalled = self._stall is not None and now - self._stall[1] > STALL_S
        idle = now - self.runner.turned_at
        wedged = pending is None and idle > LOOP_S
        info: dict[str, Any] = {"status": "ok", "node_id": self.node_id}
        if stalled:
            info["status"] = "stalled"
            info["message"] = f"a storage write has been in flight for over {STALL_S:.0f}s"
        elif wedged:
            info["status"] = "wedged"
            info["message"] = f"the driver loop has not turned for {idle:.0f}s (bound {LOOP_S:.0f}s)"
        return not (stalled or wedged), info

    def metrics_text(self) -> str:
        r = self.metrics
        for name, value in self.core.metrics().items():
            if isinstance(value, str):
                r.set_state(name, value, help=f"raft {name} (KIP-595 / KIP-704)")
            elif isinstance(value, int | float):
                r.set(name, float(value), help=f"raft {name} (KIP-595 / KIP-856)")
        r.set("applied-offset", self.applier.applied_end, help="Exclusive end offset applied to the KV store")
        r.set("kv-keys", len(self.applier.kv.data), help="Keys in the KV store")
        elapsed = time.monotonic() - self._idle_since
        busy = self.runner.busy_seconds - self._busy_mark
        r.set(
            "poll-idle-ratio",
            max(0.0, 1.0 - busy / elapsed) if elapsed > 0 else 1.0,
            help="Share of time the driver loop waited for work since the last scrape (KIP-595)",
        )
        self._idle_since, self._busy_mark = time.monotonic(), self.runner.busy_seconds
        return r.render()

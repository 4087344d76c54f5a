"""The operator process's shared context: what both Kubernetes membership backends (our engine's,
quorums.py, and Kafka's, kafkaquorums.py) and the handlers use.

:class:`OperatorContext` is everything the operator process keeps: built once by kopf's startup
handler (environment in kopf_main.py) and handed to every handler through kopf's ``memo`` (no
module-level mutable state): the Kubernetes API client, the settings, the metrics, one pod watch
per namespace, each daemon's wake-up, and the per-resource state of our engine's backend
(quorums.py ``Managed``) and TLS work (quorumtls.py). :func:`event_sink` is where a quorum's steps
are reported, for either backend.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..telemetry import EventLogSink, EventSink, FanOut, OperatorMetrics, StdoutEventSink
from .kube import KubeApi, KubeEventSink
from .manifests import QuorumSpec
from .podwatch import PodWatch
from .quorumtls import QuorumTls

if TYPE_CHECKING:  # quorums.py builds the entries and imports this module
    from .quorums import Managed


@dataclass
class OperatorContext:
    """The operator process's state, built by the startup handler."""

    kube: KubeApi
    overrides: dict[str, str] = field(default_factory=dict)
    interval: float = 2.0  # seconds between daemon passes when no deadline is due
    quorum_timeout: float = 3.0
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    managed: dict[str, Managed] = field(default_factory=dict)
    tls: dict[str, QuorumTls] = field(default_factory=dict)
    metrics_runner: Any = None
    pod_watches: dict[str, PodWatch] = field(default_factory=dict)  # by namespace
    wakes: dict[str, asyncio.Event] = field(default_factory=dict)  # a daemon's early wake-up

    def pod_watch(self, namespace: str) -> PodWatch:
        """The pod watch of a namespace, started on first use (podwatch.py)."""
        w = self.pod_watches.get(namespace)
        if w is None:
            w = self.pod_watches[namespace] = PodWatch(
                self.kube, namespace, lambda inst: self.wake(f"{namespace}/{inst}")
            )
            w.start()
        return w

    def wake(self, key: str) -> None:
        """Run the resource's next daemon pass now (its pods changed)."""
        self.wakes.setdefault(key, asyncio.Event()).set()

    def wake_event(self, key: str) -> asyncio.Event:
        return self.wakes.setdefault(key, asyncio.Event())

    def quorum_tls(self, key: str) -> QuorumTls:
        return self.tls.setdefault(key, QuorumTls())

    @staticmethod
    def settings_from_env() -> tuple[float, float]:
        """(reconcile interval, quorum timeout) from ``KRAFTKEEPER_RECONCILE_INTERVAL`` and
        ``KRAFTKEEPER_QUORUM_TIMEOUT``; a bad value is refused naming the variable."""
        out = []
        for var, default in (("KRAFTKEEPER_RECONCILE_INTERVAL", "2"), ("KRAFTKEEPER_QUORUM_TIMEOUT", "3")):
            raw = os.environ.get(var, default) or default
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r}: must be a number of seconds") from None
            if not value > 0:
                raise ValueError(f"{var}={raw!r}: must be > 0")
            out.append(value)
        return out[0], out[1]

    async def forget(self, key: str) -> None:
        """Stop managing a resource (deleted, or its spec became invalid)."""
        m = self.managed.pop(key, None)
        if m is not None:
            await m.controller.api.close()
        t = self.tls.pop(key, None)
        if t is not None:
            t.close()
        self.wakes.pop(key, None)
        self.metrics.forget(key)

    async def close(self) -> None:
        for key in list(self.managed):
            await self.forget(key)
        for w in self.pod_watches.values():
            await w.close()
        self.pod_watches.clear()
        if self.metrics_runner is not None:
            await self.metrics_runner.cleanup()
            self.metrics_runner = None
        await self.kube.close()


def event_sink(q: QuorumSpec, kube: KubeApi) -> EventSink:
    """The event log (a directory, or stdout) plus Kubernetes Events (kube.py ``KubeEventSink``:
    posted through ``kube`` before each next step)."""
    log_sink: EventSink = (
        StdoutEventSink(q.cluster) if q.event_log == "stdout" else EventLogSink(q.event_log, q.cluster)
    )
    return FanOut(log_sink, KubeEventSink(kube, q))

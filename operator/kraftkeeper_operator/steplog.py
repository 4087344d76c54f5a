"""The recovery executor's step log: every step the decision book reports (core/records.py
``Event``) goes to the event sink once, with the step's metrics.

The once-per-recovery steps (:data:`ONCE_PER_RECOVERY`) are deduplicated by their idempotent key
(recovery id, event type). Within one process the book's ``*_ms`` markers keep a step from being
reported twice; across an operator restart the key does: the controller logs a step's event first
and persists its progress right after it, so an operator that died between the two observes the
step again in the quorum on restart. :meth:`StepLog.resume` therefore seeds the keys already
logged from the event log itself (telemetry.py ``logged_steps``). A sink with no history to read
back (``eventLog: stdout``) cannot be seeded: such a step may then appear twice, the second time
with ``detail.observed: true`` and the same key (``kraftkeeper_reports.vocabulary.step_key``),
and a reader keeps the first line of a key, as the report job does (docs/reference.md "Recovery
event log"); while such a recovery runs, the status says so
(:data:`BLIND_RESUME`).

Failpoints (failpoints.py ``before-event:<type>``) stop the process just before a step's event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kraftkeeper_reports.events import RecoveryEvent
from kraftkeeper_reports.vocabulary import ONCE_TYPES, RECOVERY_COMPLETED, RECOVERY_FAILED

from . import failpoints
from .core.records import Event, Recovery
from .core.view import QuorumView
from .telemetry import EventSink, OperatorMetrics, has_history, logged_steps

__all__ = ["BLIND_RESUME", "ONCE_PER_RECOVERY", "StepLog"]

log = logging.getLogger(__name__)

# Steps logged at most once per recovery (the event log's vocabulary defines them with their
# idempotent key, ``step_key``); replica_caught_up / replica_fell_behind / recovery_resumed may recur.
ONCE_PER_RECOVERY = frozenset(ONCE_TYPES)

BLIND_RESUME = (
    "resumed after an operator restart with no event log to read back (eventLog: stdout): "
    "a step logged just before the restart may appear twice, the second time with observed: true"
)


class StepLog:
    """Reports the steps of one quorum's recoveries to ``sink`` and ``metrics`` (module
    docstring). ``sink`` may be replaced (a changed ``spec.eventLog``)."""

    def __init__(self, cluster: str, sink: EventSink, metrics: OperatorMetrics | None) -> None:
        self.cluster = cluster
        self.sink = sink
        self.metrics = metrics
        # The keys (recovery id, type) of the once-per-recovery steps already logged; None until
        # resume() read the event log for the recoveries a previous run left active.
        self.logged: set[tuple[str, str]] | None = None
        # The recoveries resumed without a readable event log (eventLog: stdout).
        self.resumed_blind: set[str] = set()

    async def resume(self, active: Sequence[Recovery]) -> None:
        """Seed the logged keys of ``active`` (the recoveries in progress at start) from the sink's
        history; without one, remember them as resumed blind."""
        self.logged = set()
        if not active:
            return
        since = min(r.detected_ms for r in active)
        ids = {r.recovery_id for r in active}
        if not has_history(self.sink):
            self.resumed_blind = ids
            log.warning("%s: %s", self.cluster, BLIND_RESUME)
            return
        try:
            self.logged = await asyncio.to_thread(logged_steps, self.sink, ids, since)
        except OSError as e:  # an unreadable log costs at most a repeated line, never a step
            log.warning("could not read the event log to resume without repeating steps: %s", e)

    def blind(self, active: Sequence[Recovery]) -> bool:
        """Whether one of ``active`` was resumed without a readable event log."""
        return any(r.recovery_id in self.resumed_blind for r in active)

    def emit(self, events: list[Event], view: QuorumView) -> None:
        for ev in events:
            r = ev.recovery
            if ev.type in ONCE_PER_RECOVERY:
                key = (r.recovery_id, ev.type)
                if self.logged is not None and key in self.logged:
                    log.info("recovery %s: %s already logged (before a restart)", r.recovery_id, ev.type)
                    continue
                if self.logged is not None:
                    self.logged.add(key)
            failpoints.hit(failpoints.BEFORE_EVENT + ev.type)
            detail = dict(ev.detail)
            if ev.type == RECOVERY_FAILED:
                detail.setdefault("reason", r.reason or "unknown")
            self.sink.emit(
                RecoveryEvent(
                    ev.type,
                    r.recovery_id,
                    r.replica_id,
                    r.old_uuid,
                    r.new_uuid,
                    view.leader_id,
                    view.leader_epoch,
                    detail,
                )
            )
            log.info("recovery %s replica %s: %s %s", r.recovery_id, r.replica_id, ev.type, detail or "")
            self._count(ev)

    def _count(self, ev: Event) -> None:
        if self.metrics is None:
            return
        r = ev.recovery
        if ev.type == RECOVERY_COMPLETED:
            self.metrics.recoveries.labels(self.cluster, "completed").inc()
            if r.finished_ms is not None:
                seconds = (r.finished_ms - r.detected_ms) / 1000
                self.metrics.recovery_duration.labels(self.cluster).observe(seconds)
        elif ev.type == RECOVERY_FAILED:
            self.metrics.recoveries.labels(self.cluster, "failed").inc()

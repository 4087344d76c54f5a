"""Where recovery steps are reported: the event log (interfaces.md "Recovery event log"),
Kubernetes Events (through a callback the kopf layer supplies) and Prometheus metrics.

``EventSink`` is the narrow interface; :class:`MemorySink` is its in-memory twin for tests, and
:class:`EventLogSink` appends validated JSON lines through the reports package's
``EventLogWriter`` (which fsyncs each line, so a reported step survives an operator crash).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger(__name__)


class EventSink(Protocol):
    def emit(
        self,
        type: str,
        recovery_id: str,
        replica_id: int,
        old_uuid: str | None,
        new_uuid: str | None,
        leader_id: int | None,
        leader_epoch: int | None,
        detail: dict[str, Any] | None = None,
    ) -> None: ...


@dataclass
class MemorySink:
    """Keeps emitted events as dicts (tests, bench)."""

    events: list[dict[str, Any]] = field(default_factory=list)

    def emit(
        self,
        type: str,
        recovery_id: str,
        replica_id: int,
        old_uuid: str | None,
        new_uuid: str | None,
        leader_id: int | None,
        leader_epoch: int | None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self.events.append(
            {
                "type": type,
                "recovery_id": recovery_id,
                "replica_id": replica_id,
                "old_uuid": old_uuid,
                "new_uuid": new_uuid,
                "leader_id": leader_id,
                "leader_epoch": leader_epoch,
                "detail": dict(detail or {}),
            }
        )

    def types(self, recovery_id: str | None = None) -> list[str]:
        return [e["type"] for e in self.events if recovery_id is None or e["recovery_id"] == recovery_id]


class EventLogSink:
    """JSON-lines event log under ``directory`` (date-partitioned, see ``EventLogWriter``)."""

    def __init__(self, directory: str | Path, cluster: str) -> None:
        from kraftkeeper_reports.events import EventLogWriter

        self.writer = EventLogWriter(directory, cluster)

    def emit(
        self,
        type: str,
        recovery_id: str,
        replica_id: int,
        old_uuid: str | None,
        new_uuid: str | None,
        leader_id: int | None,
        leader_epoch: int | None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        # The log is the report's input: a negative leader (unknown) is written as null.
        self.writer.emit(
            type,
            recovery_id,
            replica_id,
            old_uuid,
            new_uuid,
            leader_id if leader_id is not None and leader_id >= 0 else None,
            leader_epoch if leader_epoch is not None and leader_epoch >= 0 else None,
            detail or {},
        )


class StdoutEventSink:
    """The event log as JSON lines on stdout (``spec.eventLog.path: stdout``), for log collectors."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster

    def emit(
        self,
        type: str,
        recovery_id: str,
        replica_id: int,
        old_uuid: str | None,
        new_uuid: str | None,
        leader_id: int | None,
        leader_epoch: int | None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        import json
        import sys

        from kraftkeeper_reports.events import make_event, validate_event

        event = make_event(
            type,
            self.cluster,
            recovery_id,
            replica_id,
            old_uuid,
            new_uuid,
            leader_id if leader_id is not None and leader_id >= 0 else None,
            leader_epoch if leader_epoch is not None and leader_epoch >= 0 else None,
            detail or {},
        )
        problems = validate_event(event)
        if problems:
            raise ValueError(f"invalid recovery event {type!r}: " + "; ".join(problems))
        sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
        sys.stdout.flush()


class FanOut:
    """Sends every event to several sinks; one failing sink does not stop the others."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = list(sinks)

    def emit(
        self,
        type: str,
        recovery_id: str,
        replica_id: int,
        old_uuid: str | None,
        new_uuid: str | None,
        leader_id: int | None,
        leader_epoch: int | None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        for s in self.sinks:
            try:
                s.emit(type, recovery_id, replica_id, old_uuid, new_uuid, leader_id, leader_epoch, detail)
            except Exception:  # a full disk must not stop the recovery itself
                log.exception("event sink %r failed for %s", s, type)


class CallbackSink:
    """Adapts a plain callable (e.g. one that posts a Kubernetes Event) to ``EventSink``."""

    def __init__(self, fn: Callable[[str, str, dict[str, Any]], None]) -> None:
        self.fn = fn

    def emit(
        self,
        type: str,
        recovery_id: str,
        replica_id: int,
        old_uuid: str | None,
        new_uuid: str | None,
        leader_id: int | None,
        leader_epoch: int | None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        msg = f"replica {replica_id}: {old_uuid} -> {new_uuid} (recovery {recovery_id}, leader {leader_id})"
        self.fn(type, msg, dict(detail or {}))


class OperatorMetrics:
    """Prometheus metrics of the operator, on their own registry (one per process or test)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.recoveries = Counter(
            "kraftkeeper_operator_recoveries",
            "Disk-failure recoveries finished, by result",
            ["quorum", "result"],
            registry=r,
        )
        buckets = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600, 1800)
        self.recovery_duration = Histogram(
            "kraftkeeper_operator_recovery_duration_seconds",
            "Detection of a replaced disk to recovery completed",
            ["quorum"],
            buckets=buckets,
            registry=r,
        )
        self.voter_change_duration = Histogram(
            "kraftkeeper_operator_voter_change_duration_seconds",
            "AddVoter / RemoveVoter issue to commit",
            ["quorum", "op"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.voters = Gauge("kraftkeeper_operator_voters", "Voters of the quorum", ["quorum"], registry=r)
        self.observers = Gauge(
            "kraftkeeper_operator_observers", "Observers of the quorum", ["quorum"], registry=r
        )
        self.live_voters = Gauge(
            "kraftkeeper_operator_live_voters", "Voters that fetched recently", ["quorum"], registry=r
        )
        self.quorum_lost = Gauge(
            "kraftkeeper_operator_quorum_lost", "1 while no live majority is seen", ["quorum"], registry=r
        )

        self.quorum_lost_seconds = Gauge(
            "kraftkeeper_operator_quorum_lost_seconds",
            "How long no live majority has been seen (0 while one is); unclean recovery waits for "
            "spec.uncleanRecovery.afterSeconds of it",
            ["quorum"],
            registry=r,
        )
        self.unclean_recoveries = Counter(
            "kraftkeeper_operator_unclean_recoveries",
            "KIP-704 style unclean recoveries requested (records only on lost replicas are lost)",
            ["quorum"],
            registry=r,
        )

    def forget(self, quorum: str) -> None:
        """Drop the per-quorum series of a deleted quorum."""
        for g in (
            self.voters,
            self.observers,
            self.live_voters,
            self.quorum_lost,
            self.quorum_lost_seconds,
            self.unclean_recoveries,
        ):
            try:
                g.remove(quorum)
            except KeyError:
                pass

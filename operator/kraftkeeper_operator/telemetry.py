"""Where recovery steps are reported: the event log (docs/reference.md "Recovery event log"),
Kubernetes Events (the kopf layer's sink posts :func:`step_notice` of each step) and Prometheus
metrics.

Every sink takes one :class:`kraftkeeper_reports.events.RecoveryEvent` (the event schema lives in
the reports package, which both the operator and the report job import). ``EventSink`` is the
narrow interface; :class:`MemorySink` is its in-memory twin for tests, and
:class:`EventLogSink` appends validated JSON lines through the reports package's
``EventLogWriter`` (which fsyncs each line, so a reported step survives an operator crash).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from kraftkeeper_reports.events import EventLogWriter, RecoveryEvent, validate_event
from kraftkeeper_reports.vocabulary import RECOVERY_FAILED, UNCLEAN_RECOVERY
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where a recovery step goes. ``event`` carries everything but the cluster and the time,
    which the sink adds (``RecoveryEvent.to_record``)."""

    def emit(self, event: RecoveryEvent) -> None: ...


def _for_log(event: RecoveryEvent) -> RecoveryEvent:
    """The log is the report's input: an unknown leader (negative, as the engine says it) is
    written as null (docs/reference.md, "Recovery event log")."""
    lid, lep = event.leader_id, event.leader_epoch
    if (lid is None or lid >= 0) and (lep is None or lep >= 0):
        return event
    return replace(
        event,
        leader_id=lid if lid is not None and lid >= 0 else None,
        leader_epoch=lep if lep is not None and lep >= 0 else None,
    )


@dataclass
class MemorySink:
    """Keeps emitted events (tests, bench)."""

    events: list[RecoveryEvent] = field(default_factory=list)

    def emit(self, event: RecoveryEvent) -> None:
        self.events.append(event)

    def types(self, recovery_id: str | None = None) -> list[str]:
        return [e.type for e in self.events if recovery_id is None or e.recovery_id == recovery_id]


class EventLogSink:
    """JSON-lines event log under ``directory`` (date-partitioned, see ``EventLogWriter``)."""

    def __init__(self, directory: str | Path, cluster: str) -> None:
        self.writer = EventLogWriter(directory, cluster)

    def emit(self, event: RecoveryEvent) -> None:
        self.writer.emit(_for_log(event))

    def logged(self, recovery_ids: Collection[str], since_ms: int) -> set[tuple[str, str]]:
        """(recovery id, type) of the events of ``recovery_ids`` already in the log, reading only
        the day partitions from ``since_ms``'s UTC day on (a recovery's events are never older
        than its detection). Lines that do not parse are skipped: the report job counts them."""
        day = datetime.fromtimestamp(since_ms / 1000, UTC).date()
        today = datetime.now(UTC).date()
        paths: list[Path] = []
        while day <= today:
            p = self.writer.path_for(day.isoformat())
            if p not in paths:
                paths.append(p)
            day += timedelta(days=1)
        out: set[tuple[str, str]] = set()
        for p in paths:
            try:
                text = p.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                try:
                    rec = json.loads(line)
                    rid, typ = rec["recovery_id"], rec["type"]
                except (ValueError, KeyError, TypeError):
                    continue
                if rid in recovery_ids and isinstance(typ, str):
                    out.add((str(rid), typ))
        return out


def logged_steps(sink: EventSink, recovery_ids: Collection[str], since_ms: int) -> set[tuple[str, str]]:
    """What :meth:`EventLogSink.logged` says, for any sink (a FanOut asks each of its sinks, a
    decorating sink the one in its ``sink`` attribute; sinks with no readable history, e.g. stdout
    or Kubernetes Events, know nothing)."""
    if isinstance(sink, EventLogSink):
        return sink.logged(recovery_ids, since_ms)
    if isinstance(sink, FanOut):
        out: set[tuple[str, str]] = set()
        for s in sink.sinks:
            out |= logged_steps(s, recovery_ids, since_ms)
        return out
    inner = getattr(sink, "sink", None)  # a decorating sink (e.g. watch.py's engine tags)
    if inner is not None and inner is not sink and callable(getattr(inner, "emit", None)):
        return logged_steps(inner, recovery_ids, since_ms)
    return set()


def has_history(sink: EventSink) -> bool:
    """Whether :func:`logged_steps` can read what ``sink`` logged (an event log on disk in it)."""
    if isinstance(sink, EventLogSink):
        return True
    if isinstance(sink, FanOut):
        return any(has_history(s) for s in sink.sinks)
    inner = getattr(sink, "sink", None)
    return inner is not None and inner is not sink and has_history(inner)


class StdoutEventSink:
    """The event log as JSON lines on stdout (``spec.eventLog.path: stdout``), for log collectors."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster

    def emit(self, event: RecoveryEvent) -> None:
        record = _for_log(event).to_record(self.cluster)
        problems = validate_event(record)
        if problems:
            raise ValueError(f"invalid recovery event {event.type!r}: " + "; ".join(problems))
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
        sys.stdout.flush()


class FanOut:
    """Sends every event to several sinks; one failing sink does not stop the others."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = list(sinks)

    def emit(self, event: RecoveryEvent) -> None:
        for s in self.sinks:
            try:
                s.emit(event)
            except Exception:  # a full disk must not stop the recovery itself
                log.exception("event sink %r failed for %s", s, event.type)


async def flush_sink(sink: EventSink) -> None:
    """Let a sink that posts its events later (kube.py ``KubeEventSink``) post them now: the
    controller calls it before the next step and before a failpoint. A FanOut flushes each of its
    sinks, a decorating sink the one in its ``sink`` attribute; others have nothing to flush."""
    if isinstance(sink, FanOut):
        for s in sink.sinks:
            await flush_sink(s)
        return
    flush = getattr(sink, "flush", None)
    if callable(flush):
        await flush()
        return
    inner = getattr(sink, "sink", None)
    if inner is not None and inner is not sink:
        await flush_sink(inner)


def step_notice(event: RecoveryEvent) -> tuple[bool, str, str]:
    """(warning, reason, message) of the Kubernetes Event that reports a recovery step: the reason
    is the type in CamelCase (``recovery_failed`` -> ``RecoveryFailed``); a failure and an unclean
    recovery are Warnings and carry their reason (and the unclean one its warning)."""
    e = event
    reason = "".join(p.capitalize() for p in e.type.split("_"))
    message = (
        f"replica {e.replica_id}: {e.old_uuid} -> {e.new_uuid} "
        f"(recovery {e.recovery_id}, leader {e.leader_id})"
    )
    if e.type == RECOVERY_FAILED:
        return True, reason, f"{message}: {e.detail.get('reason', '')}"
    if e.type == UNCLEAN_RECOVERY:
        why, warning = e.detail.get("reason", ""), e.detail.get("warning", "")
        return True, reason, f"UNCLEAN RECOVERY {message}: {why}; {warning}"
    return False, reason, message


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
        # A recovery's age is read by Prometheus as time() minus its start, so an alert on a
        # recovery outliving spec.recovery.timeoutSeconds fires even if the operator's own loop
        # (which fails a timed-out recovery) stopped turning.
        self.recoveries_in_progress = Gauge(
            "kraftkeeper_operator_recoveries_in_progress",
            "Disk-failure recoveries detected and not finished",
            ["quorum"],
            registry=r,
        )
        self.oldest_recovery_started = Gauge(
            "kraftkeeper_operator_oldest_recovery_started_timestamp_seconds",
            "Detection time (Unix seconds) of the oldest recovery in progress; 0 when none is",
            ["quorum"],
            registry=r,
        )
        self.recovery_timeout = Gauge(
            "kraftkeeper_operator_recovery_timeout_seconds",
            "spec.recovery.timeoutSeconds: a recovery unfinished after this is reported failed",
            ["quorum"],
            registry=r,
        )

    def track(self, quorum: str) -> None:
        """Create a quorum's counters at 0 when the operator starts following it: Prometheus'
        increase() cannot see the first event of a series that appears already at 1, so the
        alert on a failed or unclean recovery would miss the first one after a restart."""
        for result in ("completed", "failed"):
            self.recoveries.labels(quorum, result)
        self.unclean_recoveries.labels(quorum)

    def forget(self, quorum: str) -> None:
        """Drop the per-quorum series of a deleted quorum."""
        for g in (
            self.voters,
            self.observers,
            self.live_voters,
            self.quorum_lost,
            self.quorum_lost_seconds,
            self.unclean_recoveries,
            self.recoveries_in_progress,
            self.oldest_recovery_started,
            self.recovery_timeout,
        ):
            try:
                g.remove(quorum)
            except KeyError:
                pass
        for result in ("completed", "failed"):
            try:
                self.recoveries.remove(quorum, result)
            except KeyError:
                pass

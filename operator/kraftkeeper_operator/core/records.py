"""The recorded progress of a disk-failure recovery and the small values the decision core
(recovery.py) exchanges with its executor (controller.py): :class:`Phase`, :class:`Recovery` (with
its round trip through a KRaftQuorum's ``status.recoveries``), :class:`Event` (an event-log line to
emit) and :class:`Action` (the one voter change to issue); and how an issued change's outcome is
recorded (:func:`record_started`, :func:`record_finished`).

Errors from a voter change: an outcome-unknown or busy answer (timeouts, NOT_LEADER,
VOTER_CHANGE_IN_PROGRESS, ...) is retried with a back-off after the quorum has been looked at
again; a refusal (INVALID_REQUEST, ...) fails the recovery with the engine's message, and the same
(id, new UUID) is tried again only after ``timeoutSeconds`` (recovery.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kraftkeeper_reports.vocabulary import (
    ADD_VOTER_COMMITTED,
    ADD_VOTER_STARTED,
    RECOVERY_COMPLETED,
    RECOVERY_FAILED,
    REMOVE_VOTER_COMMITTED,
    REMOVE_VOTER_STARTED,
    REPLICA_FELL_BEHIND,
)

from quorum.timefmt import parse_rfc3339, rfc3339

from .policy import Order

# ---------------------------------------------------------------------------------------------
# Recorded progress


class Phase(enum.StrEnum):
    STABILIZING = "Stabilizing"  # new replica seen, waiting for it to stay caught up
    CAUGHT_UP = "CaughtUp"  # stable for stabilization_seconds, next step may start
    ADDING = "Adding"  # AddVoter(new) issued
    ADDED = "Added"  # (id, old) and (id, new) both voters
    REMOVING = "Removing"  # RemoveVoter(old) issued
    REMOVED = "Removed"  # RemoveThenAdd: old gone, new not yet a voter
    COMPLETED = "Completed"
    FAILED = "Failed"


TERMINAL = (Phase.COMPLETED, Phase.FAILED)


@dataclass
class Recovery:
    """One recovery, serialisable into ``status.recoveries`` (camelCase keys there)."""

    recovery_id: str
    replica_id: int
    old_uuid: str
    new_uuid: str
    phase: Phase
    detected_ms: int
    caught_up_since_ms: int | None = None
    caught_up_ms: int | None = None
    add_started_ms: int | None = None
    add_committed_ms: int | None = None
    remove_started_ms: int | None = None
    remove_committed_ms: int | None = None
    finished_ms: int | None = None
    reason: str | None = None
    attempts: int = 0  # failed voter-change calls with a retryable error, for the back-off
    retry_at_ms: int | None = None

    def finish(self, phase: Phase, now_ms: int, reason: str | None) -> None:
        """End the recovery (``phase``: Completed or Failed) at ``now_ms``, saying why it failed."""
        self.phase = phase
        self.finished_ms = now_ms
        self.reason = reason

    def durations(self) -> dict[str, Any]:
        """Seconds of each span (None if not reached), for ``recovery_completed``'s detail."""

        def span(a: int | None, b: int | None) -> float | None:
            return (b - a) / 1000 if a is not None and b is not None else None

        return {
            "total_seconds": span(self.detected_ms, self.finished_ms),
            "stabilization_seconds": span(self.detected_ms, self.caught_up_ms),
            "add_seconds": span(self.add_started_ms, self.add_committed_ms),
            "remove_seconds": span(self.remove_started_ms, self.remove_committed_ms),
        }

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in asdict(self).items():
            out[_camel(k)] = v.value if isinstance(v, Phase) else v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Recovery:
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if _camel(f.name) in d:
                kw[f.name] = d[_camel(f.name)]
        kw["phase"] = Phase(kw["phase"])
        return cls(**kw)

    # ``status.recoveries`` items follow the CRD schema (recoveryId, replicaId, oldUuid, newUuid,
    # startedAt, completedAt, phaseSeconds, result, reason). Our instants are kept in phaseSeconds
    # as "at<Step>" offsets from startedAt, so a restarted operator gets them back exactly.
    _AT = {
        "caught_up_since_ms": "atCaughtUpSince",
        "caught_up_ms": "atCaughtUp",
        "add_started_ms": "atAddStarted",
        "add_committed_ms": "atAddCommitted",
        "remove_started_ms": "atRemoveStarted",
        "remove_committed_ms": "atRemoveCommitted",
    }

    def to_crd_status(self) -> dict[str, Any]:
        def span(a: int | None, b: int | None) -> float | None:
            return round((b - a) / 1000, 3) if a is not None and b is not None else None

        phases: dict[str, float] = {}
        for key, value in (
            ("catchUp", span(self.detected_ms, self.caught_up_ms)),
            ("addVoter", span(self.add_started_ms, self.add_committed_ms)),
            ("removeVoter", span(self.remove_started_ms, self.remove_committed_ms)),
            ("total", span(self.detected_ms, self.finished_ms)),
        ):
            if value is not None:
                phases[key] = value
        for attr, key in self._AT.items():
            v = getattr(self, attr)
            if v is not None:
                phases[key] = round((v - self.detected_ms) / 1000, 3)
        result = {Phase.COMPLETED: "Succeeded", Phase.FAILED: "Failed"}.get(self.phase, "InProgress")
        return {
            "recoveryId": self.recovery_id,
            "replicaId": self.replica_id,
            "oldUuid": self.old_uuid,
            "newUuid": self.new_uuid,
            "startedAt": rfc3339(self.detected_ms, millis=True),
            "completedAt": rfc3339(self.finished_ms, millis=True) if self.finished_ms is not None else None,
            "phaseSeconds": phases,
            "result": result,
            "reason": self.reason if self.reason else (None if result != "InProgress" else self.phase.value),
        }

    @classmethod
    def from_crd_status(cls, d: Mapping[str, Any]) -> Recovery:
        """Inverse of :meth:`to_crd_status`. The phase is rebuilt from the recorded instants;
        the next observation corrects it from the quorum anyway."""
        detected = parse_rfc3339(str(d["startedAt"]))
        phases = d.get("phaseSeconds") or {}
        kw: dict[str, Any] = {}
        for attr, key in cls._AT.items():
            if key in phases:
                kw[attr] = detected + round(float(phases[key]) * 1000)
        result = d.get("result", "InProgress")
        finished = parse_rfc3339(str(d["completedAt"])) if d.get("completedAt") else None
        if result == "Succeeded":
            phase = Phase.COMPLETED
        elif result == "Failed":
            phase = Phase.FAILED
        elif "atRemoveCommitted" in phases:
            phase = Phase.REMOVED
        elif "atAddCommitted" in phases:
            phase = Phase.ADDED
        elif "atCaughtUp" in phases:
            phase = Phase.CAUGHT_UP
        else:
            phase = Phase.STABILIZING
        reason = d.get("reason") if phase in TERMINAL else None
        return cls(
            str(d["recoveryId"]),
            int(d["replicaId"]),
            str(d.get("oldUuid") or ""),
            str(d.get("newUuid") or ""),
            phase,
            detected,
            finished_ms=finished,
            reason=reason,
            **kw,
        )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


@dataclass(frozen=True)
class Event:
    """An event-log line to emit (``type``: a name of ``kraftkeeper_reports.vocabulary``, which
    lists every type with its fields)."""

    type: str
    recovery: Recovery
    detail: dict[str, Any] = field(default_factory=dict)


class ActionKind(enum.StrEnum):
    ADD_VOTER = "add_voter"
    REMOVE_VOTER = "remove_voter"


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    replica_id: int
    uuid: str
    recovery_id: str


# ---------------------------------------------------------------------------------------------
# The outcome of an issued change

# Error codes as strings, so this module does not depend on the engine's enum.
_DONE_ADD = frozenset({"VOTER_ALREADY_ADDED"})
_DONE_REMOVE = frozenset({"VOTER_ALREADY_REMOVED"})
# Outcome unknown or the quorum busy: try again later (the next observation shows what happened).
# Any other error (INVALID_REQUEST, UNSUPPORTED, ...) means the engine refuses the step as asked:
# retrying cannot help, so the recovery fails with the engine's message instead of looping.
_RETRYABLE = frozenset(
    {
        "UNAVAILABLE",
        "REQUEST_TIMED_OUT",
        "NOT_LEADER",
        "LEADERSHIP_LOST",
        "VOTER_CHANGE_IN_PROGRESS",
        "REASSIGNMENT_IN_PROGRESS",
        "LEADER_RECOVERING",
        "UNKNOWN_SERVER_ERROR",
    }
)
_BACKOFF_MAX_MS = 30_000
# The AddVoter of RemoveThenAdd, once the old voter is removed: the quorum runs one voter short
# until it commits, so it is retried every second instead of backing off. Its usual transient
# failure is Kafka's leader not reaching the new controller yet (REQUEST_TIMED_OUT: the
# ApiVersions request AddRaftVoter sends to the new voter, KIP-853), which clears by itself; the
# doubling back-off added up to 16 s of waiting after it had (seen on a kubelet: 39 s AddVoter).
_SHORT_VOTER_RETRY_MS = 1_000


def record_started(rec: Recovery, action: Action, now_ms: int) -> list[Event]:
    """A change of ``rec`` is about to be issued. A retry keeps the first start time and logs
    nothing new, so the event log has one ``*_started`` per step and durations include the
    retries."""
    if action.kind is ActionKind.ADD_VOTER:
        rec.phase = Phase.ADDING
        if rec.add_started_ms is not None:
            return []
        rec.add_started_ms = now_ms
        return [Event(ADD_VOTER_STARTED, rec)]
    rec.phase = Phase.REMOVING
    if rec.remove_started_ms is not None:
        return []
    rec.remove_started_ms = now_ms
    return [Event(REMOVE_VOTER_STARTED, rec)]


def record_finished(
    rec: Recovery, action: Action, error_code: str | None, now_ms: int, message: str, order: Order
) -> list[Event]:
    """Record the outcome of an issued change. ``error_code`` None = committed. A retryable
    error backs off (1 s doubling to 30 s; a flat 1 s for an AddVoter after its recovery removed
    the old voter) and leaves the phase for the next observation to
    settle from the quorum; a refusal fails the recovery with the engine's message."""
    events: list[Event] = []
    done = _DONE_ADD if action.kind is ActionKind.ADD_VOTER else _DONE_REMOVE
    if error_code is not None and error_code not in done and error_code != "REPLICA_NOT_CAUGHT_UP":
        if error_code in _RETRYABLE:
            rec.attempts += 1
            wait = min(_BACKOFF_MAX_MS, 1000 * 2 ** (rec.attempts - 1))
            if action.kind is ActionKind.ADD_VOTER and rec.remove_committed_ms is not None:
                wait = _SHORT_VOTER_RETRY_MS
            rec.retry_at_ms = now_ms + wait
            return events
        op = "AddVoter" if action.kind is ActionKind.ADD_VOTER else "RemoveVoter"
        rec.finish(
            Phase.FAILED,
            now_ms,
            f"{op}({action.replica_id}, {action.uuid}) refused: {error_code}: {message}".rstrip(": "),
        )
        events.append(Event(RECOVERY_FAILED, rec, {"reason": rec.reason, "error": error_code}))
        return events
    rec.attempts, rec.retry_at_ms = 0, None
    if action.kind is ActionKind.ADD_VOTER:
        if error_code is None or error_code in _DONE_ADD:
            rec.add_committed_ms = now_ms
            events.append(Event(ADD_VOTER_COMMITTED, rec))
            if order is Order.REMOVE_THEN_ADD:
                rec.finish(Phase.COMPLETED, now_ms, None)
                events.append(Event(RECOVERY_COMPLETED, rec, rec.durations()))
            else:
                rec.phase = Phase.ADDED
        elif error_code == "REPLICA_NOT_CAUGHT_UP":
            # The leader disagrees that it is caught up: start the clock again.
            rec.phase, rec.caught_up_since_ms = Phase.STABILIZING, None
            if rec.remove_committed_ms is not None:
                rec.phase = Phase.REMOVED
            events.append(Event(REPLICA_FELL_BEHIND, rec, {"error": error_code}))
        return events
    if error_code is None or error_code in _DONE_REMOVE:
        rec.remove_committed_ms = now_ms
        events.append(Event(REMOVE_VOTER_COMMITTED, rec))
        if order is Order.REMOVE_THEN_ADD and rec.add_committed_ms is None:
            rec.phase = Phase.REMOVED
        else:
            rec.finish(Phase.COMPLETED, now_ms, None)
            events.append(Event(RECOVERY_COMPLETED, rec, rec.durations()))
    return events

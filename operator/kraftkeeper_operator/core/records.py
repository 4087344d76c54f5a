"""The recorded progress of a disk-failure recovery and the small values the decision core
(recovery.py) exchanges with its executor (controller.py): :class:`Phase`, :class:`Recovery` (with
its round trip through a KRaftQuorum's ``status.recoveries``), :class:`Event` (an event-log line to
emit) and :class:`Action` (the one voter change to issue)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

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
            "startedAt": _rfc3339(self.detected_ms),
            "completedAt": _rfc3339(self.finished_ms) if self.finished_ms is not None else None,
            "phaseSeconds": phases,
            "result": result,
            "reason": self.reason if self.reason else (None if result != "InProgress" else self.phase.value),
        }

    @classmethod
    def from_crd_status(cls, d: Mapping[str, Any]) -> Recovery:
        """Inverse of :meth:`to_crd_status`. The phase is rebuilt from the recorded instants;
        the next observation corrects it from the quorum anyway."""
        detected = _parse_rfc3339(str(d["startedAt"]))
        phases = d.get("phaseSeconds") or {}
        kw: dict[str, Any] = {}
        for attr, key in cls._AT.items():
            if key in phases:
                kw[attr] = detected + round(float(phases[key]) * 1000)
        result = d.get("result", "InProgress")
        finished = _parse_rfc3339(str(d["completedAt"])) if d.get("completedAt") else None
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


def _rfc3339(ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _parse_rfc3339(s: str) -> int:
    dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    return round(dt.timestamp() * 1000)


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

"""What one controller pass publishes, and the pure decision behind its QuorumLost condition.

:class:`ControllerStatus` is what :meth:`~.controller.RecoveryController.reconcile` returns; its
``to_crd_status()`` is a KRaftQuorum's ``status`` and ``to_status()`` local mode's ``/status``.

:func:`quorum_health` decides, from the leader's describe (or its absence), whether the quorum has a
live majority, is lost, or is settling: a leader election in progress (no leader answers, or a
new leader whose followers have not fetched from it yet) gets a short grace before QuorumLost is
published, so a rolling restart of the leader's pod does not flap Available to False.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from quorum.timefmt import rfc3339

from .records import Action, Recovery
from .view import QuorumView, Replica

# The longest leader election the status waits out before it says QuorumLost (and never longer
# than the live window): after a leader resigns (a graceful pod stop, KIP-595 EndQuorumEpoch) a new
# one is elected within about one election timeout (1 s by default, ours and Kafka's KRaft); after
# a leader crashed, the followers first wait out their fetch timeout (2 s), then one or two
# election timeouts; a new leader learns its followers' fetch times within one fetch long-poll.
ELECTION_GRACE_MS = 5_000


def grace_s(window_ms: int) -> float:
    """The grace of a leader election, in seconds, for a live window of ``window_ms``."""
    return min(window_ms, ELECTION_GRACE_MS) / 1000


class Health(enum.Enum):
    LIVE = "live"  # the leader reports a live majority
    SETTLING = "settling"  # no answer or a new leader, within the grace: not reported as lost
    LOST = "lost"


def quorum_health(
    view: QuorumView | None,
    now_ms: int,
    window_ms: int,
    last_good: QuorumView | None,
    unhealthy_since_ms: int | None,
    already_lost: bool = False,
) -> Health:
    """Whether the quorum counts as having a live majority now.

    * the leader's describe shows a live majority -> LIVE;
    * it shows no live majority under the same leader epoch as the last healthy view -> LOST (its
      fetch times are the leader's own observations: the live window was the grace already);
    * no leader answers, or a leader of another epoch shows no live majority (just elected: its
      followers may not have fetched from it yet) -> SETTLING while the unhealthy episode (since
      ``unhealthy_since_ms``, None = starting now) is younger than ``min(window_ms,
      ELECTION_GRACE_MS)``, and only if a healthy view was seen before (a quorum never seen
      healthy has nothing to settle back to) -> else LOST.

    * once an episode was reported LOST (``already_lost``) it stays LOST until a LIVE view: a
      leader that reported a dead majority and then resigned is no election to wait for, and the
      status must not flap back to Available.

    Invariant: LIVE only on a describe from a leader with a live majority; SETTLING never lasts
    longer than the grace, so a lost quorum is reported at most that much later, and never
    follows LOST within one episode."""
    if view is not None and view.has_live_majority(now_ms, window_ms):
        return Health.LIVE
    if last_good is None or already_lost:
        return Health.LOST
    if view is not None and view.leader_id >= 0 and view.leader_epoch == last_good.leader_epoch:
        return Health.LOST
    since = now_ms if unhealthy_since_ms is None else unhealthy_since_ms
    return Health.SETTLING if now_ms - since < min(window_ms, ELECTION_GRACE_MS) else Health.LOST


@dataclass
class Condition:
    type: str  # Available | Degraded | Recovering | QuorumLost
    status: bool
    reason: str
    message: str = ""


@dataclass
class ControllerStatus:
    """What one reconcile saw and did; ``to_status()`` is the CR's ``status`` (camelCase)."""

    view: QuorumView | None
    conditions: list[Condition]
    recoveries: list[dict[str, Any]]
    action: Action | None = None
    committed: bool = False  # the action (if any) committed
    reassigned: list[int] | None = None
    error: str | None = None
    blocked: str | None = None
    live_voter_ids: list[int] = field(default_factory=list)
    records: list[Recovery] = field(default_factory=list)
    # The last voter set a leader reported, (id, uuid): published as status.voters while no
    # leader answers (voters cannot change without one), and what unclean recovery picks from.
    known_voters: list[tuple[int, str]] = field(default_factory=list)

    def condition(self, type_: str) -> Condition:
        return next(c for c in self.conditions if c.type == type_)

    def annotate_lost(self, reason: str | None, note: str) -> None:
        """Add ``note`` (e.g. the unclean-recovery step) to the QuorumLost condition."""
        c = self.condition("QuorumLost")
        if not c.status:
            return
        c.message = f"{c.message}; {note}" if c.message else note
        if reason:
            c.reason = reason

    def annotate_degraded(self, reason: str, note: str) -> None:
        """Mark Degraded with ``note`` first in its message (e.g. a crash-looping pod); the
        reason becomes ``reason`` unless the quorum is lost (that reason says more)."""
        c = self.condition("Degraded")
        c.status = True
        if not self.condition("QuorumLost").status:
            c.reason = reason
        c.message = f"{note}; {c.message}" if c.message else note

    @property
    def voter_ids(self) -> list[int]:
        return sorted({v.id for v in self.view.voters}) if self.view else []

    @property
    def phase(self) -> str:
        """``status.phase`` of the CRD."""
        if self.condition("QuorumLost").status:
            return "QuorumLost"
        if self.condition("Recovering").status:
            return "Recovering"
        if self.condition("Degraded").status:
            return "Degraded"
        return "Running"

    def to_crd_status(
        self, previous: dict[str, Any] | None = None, generation: int | None = None
    ) -> dict[str, Any]:
        """The KRaftQuorum ``status`` (fields of crds/kraftquorums.kraftkeeper.io.yaml). A
        condition keeps its ``lastTransitionTime`` while its status does not change."""
        v = self.view
        prev_conds = {c.get("type"): c for c in (previous or {}).get("conditions") or []}
        stamp = rfc3339()

        if v is not None:
            voters = crd_voters(v)
        else:
            # No leader answers: the last voter set one reported (it cannot have changed since),
            # without progress figures.
            voters = [
                {"id": i, "uuid": u, "lag": None, "logEndOffset": None, "endpoint": None}
                for i, u in self.known_voters
                if u
            ]
        conds = []
        for c in self.conditions:
            s = "True" if c.status else "False"
            old = prev_conds.get(c.type)
            since = (
                old["lastTransitionTime"]
                if old and old.get("status") == s and old.get("lastTransitionTime")
                else stamp
            )
            item: dict[str, Any] = {
                "type": c.type,
                "status": s,
                "reason": c.reason,
                "message": c.message[:32000],
                "lastTransitionTime": since,
            }
            if generation is not None:
                item["observedGeneration"] = generation
            conds.append(item)
        return {
            "phase": self.phase,
            "leaderId": v.leader_id if v else -1,
            "leaderEpoch": v.leader_epoch if v else -1,
            "highWatermark": v.high_watermark if v else -1,
            "voters": voters,
            "observers": [crd_replica(r) for r in v.observers] if v else [],
            "conditions": conds,
            "recoveries": [r.to_crd_status() for r in self.records][-20:],
        }

    def to_status(self, now_ms: int | None = None) -> dict[str, Any]:
        stamp = rfc3339(now_ms)
        v = self.view

        def rep(r: Any) -> dict[str, Any]:
            return {"id": r.id, "uuid": r.uuid or None, "lag": r.lag, "lastFetchTimestamp": r.last_fetch_ms}

        return {
            "phase": self.phase,
            "leaderId": v.leader_id if v else -1,
            "leaderEpoch": v.leader_epoch if v else -1,
            "highWatermark": v.high_watermark if v else -1,
            "voters": [rep(r) for r in v.voters] if v else [],
            "observers": [rep(r) for r in v.observers] if v else [],
            "targetVoters": list(v.target_voters) if v and v.target_voters is not None else None,
            "recoveries": self.recoveries,
            "conditions": [
                {
                    "type": c.type,
                    "status": "True" if c.status else "False",
                    "reason": c.reason,
                    "message": c.message,
                    "lastTransitionTime": stamp,
                }
                for c in self.conditions
            ],
        }


def crd_replica(r: Replica) -> dict[str, Any]:
    """One ``status.voters`` / ``status.observers`` item of the KRaftQuorum."""
    out: dict[str, Any] = {"id": r.id, "lag": r.lag, "logEndOffset": r.log_end_offset, "endpoint": r.endpoint}
    # Omitted, never "": a voter whose UUID the leader has not learned yet must not make the
    # status write fail (the CRD's pattern refuses ""). Not null either: a merge patch
    # drops null keys.
    if r.uuid:
        out["uuid"] = r.uuid
    return out


def crd_voters(view: QuorumView) -> list[dict[str, Any]]:
    """``status.voters`` from a leader's view."""
    return [crd_replica(r) for r in view.voters]


def progress_status(recoveries: list[dict[str, Any]], committed: QuorumView | None) -> dict[str, Any]:
    """What a ``persist`` hook writes to a KRaftQuorum's ``status`` around a voter change: the
    recoveries and, once this pass committed a change, the voter set that change made
    (``committed``, the controller's ``committed_view``). Invariant: no status shows a recovery's
    committed step next to the voter set from before it (a ``Succeeded`` record never sits next
    to the voter it removed, nor without the one it added)."""
    out: dict[str, Any] = {"recoveries": recoveries}
    if committed is not None:
        out["voters"] = crd_voters(committed)
    return out


def status_changed(prev: dict[str, Any], status: dict[str, Any]) -> bool:
    """Whether ``status`` differs from the last one written in anything but a condition's
    timestamp: writing on every pass would wake every watcher of the object for nothing."""
    comparable = {k: v for k, v in status.items() if k != "conditions"}
    before = {k: v for k, v in prev.items() if k in comparable}
    conds = [(c["type"], c["status"], c["reason"], c["message"]) for c in status["conditions"]]
    prev_conds = [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
        for c in prev.get("conditions") or []
    ]
    return comparable != before or conds != prev_conds

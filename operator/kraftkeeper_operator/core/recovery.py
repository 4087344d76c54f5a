"""Automatic disk-failure recovery: the pure decision core (KIP-856, "Disk Failure Recovery
Scenario").

No I/O, no clock, no Kubernetes: the caller hands in the leader's describe object (as
:class:`QuorumView`), the policy and the current time; :class:`RecoveryBook` keeps the recorded
progress of each recovery and answers "what is the next safe step?". The async executor lives in
``controller.py``; kopf and the local supervisor only call that.

How a replaced disk looks (KIP-856): the node restarts with the same replica id but a new storage
UUID, so the leader lists (id, old) among the voters and (id, new) among the observers. Recovery
promotes the new one and removes the old one, one voter change at a time.

Invariants, checked before *every* step (not only when a recovery starts):

* the quorum itself is the source of truth: the phase of a recovery is re-derived from the voter
  set on every observation, so an operator that restarts at any step (Strimzi proposal 132,
  scenarios 4.A-4.D) resumes from what the quorum shows, and recorded progress is only a hint
  (which UUID was the old one, when the clocks started);
* at most one voter change in flight: nothing is issued while ``pending_voter_change`` or a KIP-642
  reassignment (``target_voters``) is set, and recoveries run strictly one after the other;
* never a change that leaves fewer *live* voters than a majority of the resulting voter set
  (consul#4017, ZooKeeper operator #575). "Live" for a change is sharper than for status
  (view.py ``live_for_change``): a fetch within 1.5 s (three fetch long-polls) and, when reported,
  caught up within the policy's live window; the leader itself always counts; the voter being
  removed never does. Status and QuorumLost use the plain window (fetched within it);
* a new replica is promoted only after it has stayed caught up (lag <= maxLag and a recent fetch)
  for the whole stabilisation time (Consul's ServerStabilizationTime idea, consul#8118); falling
  behind before promotion restarts that clock;
* the old replica is removed only if it is gone: a live (id, old) with a second (id, new) means
  two processes claim one id, which is a misconfiguration, not a disk replacement
  (guards.py ``old_gone``);
* a recovery starts only when the voter with that id went quiet before the observer: never while
  it leads or fetched at or after the observer's last fetch (one clock, the leader's). A real
  replacement's old process dies before the new disk's first fetch; the reverse is a completed
  recovery's removed directory, which Kafka's leader lists as an observer until idle for minutes,
  live by the window for seconds after the kill: a controller with no record retiring it (a
  KRaftQuorum taking over from a deleted owner) took it for a new disk.

No idle waits: :meth:`RecoveryBook.wake_at_ms` (guards.py) names the next instant a decision can
change by itself (a stabilisation deadline, an old voter counting as gone, a back-off), so the
caller observes right then instead of on a polling tick.

Several replaced disks: each is detected and its stabilisation clock runs at once, but the voter
changes are serialised: the recovery that already changed the voter set goes first, then the
oldest detection. With 3 voters a second replaced disk means no live majority, so nothing happens
(QuorumLost) until a node comes back; with 5 voters the second recovery proceeds after the first
because the majority check passes at each step.

Order trade-off (``AddThenRemove``, KIP-856's, or ``RemoveThenAdd``, Kafka's KIP-853): see
docs/operator.md. (Our engine refuses to remove an id's only voter UUID, so with it RemoveThenAdd
ends in ``recovery_failed``, voters untouched.)

Errors from a voter change are recorded by records.py (``record_finished``): retried with a
back-off, or the recovery failed with the engine's message. A UUID retired by a completed recovery
is never taken for a new disk again, even if the leader still lists it as an observer (a removed
(id, UUID) stays removed, KAFKA-19850).
"""

from __future__ import annotations

import uuid as _uuid
from collections.abc import Iterable
from typing import Any

from kraftkeeper_reports.vocabulary import (
    ADD_VOTER_COMMITTED,
    DISK_REPLACEMENT_DETECTED,
    RECOVERY_COMPLETED,
    RECOVERY_FAILED,
    RECOVERY_RESUMED,
    REMOVE_VOTER_COMMITTED,
    REPLICA_CAUGHT_UP,
    REPLICA_FELL_BEHIND,
)

# Policy, view and records: own modules, re-exported here as part of the recovery vocabulary.
from .guards import caught_up, guard_add, guard_remove, wake_at_ms
from .policy import Order, PolicyError, RecoveryPolicy
from .records import TERMINAL, Action, ActionKind, Event, Phase, Recovery, record_finished, record_started
from .view import DescribeError, PendingChange, QuorumView, Replica, majority

__all__ = [
    "Action",
    "ActionKind",
    "DescribeError",
    "Event",
    "Order",
    "PendingChange",
    "Phase",
    "PolicyError",
    "QuorumView",
    "Recovery",
    "RecoveryBook",
    "RecoveryPolicy",
    "Replica",
    "majority",
]


class RecoveryBook:
    """The recorded progress of all recoveries of one quorum, and the decision logic.

    Use: ``events = book.observe(view, now_ms)`` on each describe, then
    ``action = book.next_action(view, now_ms)``; emit ``book.started(action, now_ms)``
    before issuing it and ``book.finished(action, error_code, now_ms)`` after.
    ``blocked`` explains why nothing was done (for status conditions)."""

    HISTORY = 20  # terminal recoveries kept (status.recoveries stays small)

    def __init__(self, policy: RecoveryPolicy, records: Iterable[Recovery] = ()) -> None:
        self.policy = policy
        self.records: list[Recovery] = list(records)
        self.blocked: str | None = None  # why next_action() did nothing
        self.note: str | None = None  # why observe() did not start a recovery it might have
        # Replicas whose pods crash-loop (podhealth.py, set by the caller before each pass): never
        # taken as a disk replacement, never promoted.
        self.suspect_ids: set[int] = set()
        # Disks the caller vouches for (Kubernetes with TLS: the storage UUID each replica's current
        # certificate names, None for one bound to no disk; set before each pass): an observer of a
        # listed id with another UUID is never taken as a new disk. None: no such rule.
        self.vouched: dict[int, str | None] | None = None
        self._window_ms = int(policy.live_window_seconds * 1000)

    # -- queries -----------------------------------------------------------------------------

    def active(self) -> list[Recovery]:
        return [r for r in self.records if r.phase not in TERMINAL]

    def active_for(self, replica_id: int) -> Recovery | None:
        for r in self.records:
            if r.replica_id == replica_id and r.phase not in TERMINAL:
                return r
        return None

    def to_status(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.records]

    def _caught_up(self, view: QuorumView, r: Replica | None, now_ms: int) -> bool:
        return caught_up(view, r, self.policy, now_ms)

    # -- observation ---------------------------------------------------------------------------

    def observe(self, view: QuorumView, now_ms: int) -> list[Event]:
        """Fold one describe into the records; returns the events this observation implies."""
        self.note = None
        events: list[Event] = []
        counts: dict[int, int] = {}
        for v in view.voters:
            counts[v.id] = counts.get(v.id, 0) + 1
        ids = {r.id for r in view.observers} | {r.replica_id for r in self.active()}
        ids |= {i for i, c in counts.items() if c > 1}
        for rid in sorted(ids):
            events.extend(self._observe_id(view, rid, now_ms))
        self._trim()
        return events

    def _new_observer(
        self, view: QuorumView, rid: int, voter_uuids: list[str], now_ms: int
    ) -> Replica | None:
        # A UUID this id had before a completed recovery stays retired (a removed (id, UUID) must
        # stay removed, KAFKA-19850): the leader may keep listing the dead disk as an observer.
        retired = {r.old_uuid for r in self.records if r.replica_id == rid and r.phase is Phase.COMPLETED}
        cands = [
            o
            for o in view.observers
            if o.id == rid and o.uuid and o.uuid not in voter_uuids and o.uuid not in retired
        ]
        if self.vouched is not None and cands:
            bad = [o.uuid for o in cands if not self.vouches(o)]
            if bad:
                self.note = f"replica {rid}: no certificate of the operator names storage {bad[0]} yet"
            cands = [o for o in cands if self.vouches(o)]
        if len(cands) > 1:
            live = [o for o in cands if view.is_live(o, now_ms, self._window_ms)]
            cands = live if live else cands
        # Most recently fetching one wins: an older leftover observer entry is a previous disk.
        return max(cands, key=lambda o: o.last_fetch_ms) if cands else None

    def vouches(self, r: Replica) -> bool:
        """``r`` may be taken as its id's disk (``vouched``)."""
        return self.vouched is None or (r.id in self.vouched and self.vouched[r.id] in (None, r.uuid))

    def _observe_id(self, view: QuorumView, rid: int, now_ms: int) -> list[Event]:
        voter_uuids = view.voter_uuids(rid)
        new_obs = self._new_observer(view, rid, voter_uuids, now_ms)
        rec = self.active_for(rid)
        if rec is None:
            return self._detect(view, rid, voter_uuids, new_obs, now_ms)
        return self._follow(view, rec, voter_uuids, new_obs, now_ms)

    def _detect(
        self, view: QuorumView, rid: int, voter_uuids: list[str], new_obs: Replica | None, now_ms: int
    ) -> list[Event]:
        """No active recovery for ``rid``: start one if the quorum shows a replaced disk (or a
        recovery a previous operator run left half done)."""
        events: list[Event] = []
        pending_here = view.pending is not None and view.pending.id == rid
        if not self.policy.enabled:
            return events
        if rid in self.suspect_ids:
            if new_obs is not None or len(voter_uuids) > 1:
                self.note = f"replica {rid}'s pod is crash-looping: not taken as a disk replacement"
            return events
        if len(voter_uuids) == 1 and new_obs is not None:
            if not voter_uuids[0]:
                # The leader has not learned the voter's UUID yet: we cannot name the old one.
                self.note = f"voter {rid} has no known storage UUID yet; waiting"
                return events
            if not view.is_live(new_obs, now_ms, self._window_ms):
                return events  # a stale observer entry, not a replica that is running now
            if busy := self._voter_active(view, rid, new_obs):
                self.note = busy
                return events
            if self._recently_failed(rid, new_obs.uuid, now_ms):
                return events
            rec = self._start(rid, voter_uuids[0], new_obs.uuid, Phase.STABILIZING, now_ms)
            events.append(Event(DISK_REPLACEMENT_DETECTED, rec, {"endpoint": new_obs.endpoint}))
            # Already caught up when first seen: the stabilisation clock starts now, not a pass later.
            events.extend(self._stabilise(view, rec, new_obs, now_ms))
        elif len(voter_uuids) == 2 and not pending_here:
            # Restarted operator, AddVoter already committed: the quorum tells us the state.
            old = self._guess_old(view, rid, voter_uuids, now_ms)
            if old is None:
                self.note = f"replica {rid} has two voters and neither is clearly the old one"
                return events
            new = next(u for u in voter_uuids if u != old)
            if self._recently_failed(rid, new, now_ms):
                return events
            rec = self._start(rid, old, new, Phase.ADDED, now_ms)
            events.append(Event(RECOVERY_RESUMED, rec, {"phase": Phase.ADDED.value}))
        return events

    def _voter_active(self, view: QuorumView, rid: int, obs: Replica) -> str:
        """Why voter ``rid`` is no replaced disk's leftover, or "" (the docstring's last invariant)."""
        v = next(v for v in view.voters if v.id == rid)
        lead = view.leader_id == rid and view.leader_uuid() == v.uuid
        if not lead and v.last_fetch_ms < obs.last_fetch_ms:
            return ""
        why = "leads" if lead else "fetched after it"
        return f"replica {rid}: voter ({rid}, {v.uuid}) {why}, still live: observer {obs.uuid} is no new disk"

    def _follow(
        self, view: QuorumView, rec: Recovery, voter_uuids: list[str], new_obs: Replica | None, now_ms: int
    ) -> list[Event]:
        """An active record exists: re-derive its phase from the quorum."""
        events: list[Event] = []
        rid = rec.replica_id
        pending_here = view.pending is not None and view.pending.id == rid
        if new_obs is not None and new_obs.uuid != rec.new_uuid and rec.new_uuid not in voter_uuids:
            # The new disk was itself replaced before promotion: that attempt is moot.
            rec.finish(Phase.FAILED, now_ms, f"superseded by a newer storage UUID {new_obs.uuid}")
            events.append(Event(RECOVERY_FAILED, rec, {"reason": rec.reason}))
            return events + self._observe_id(view, rid, now_ms)

        old_in = rec.old_uuid in voter_uuids
        new_in = rec.new_uuid in voter_uuids
        if pending_here:
            return events  # an uncommitted change for this id: wait for it to settle
        # The *_committed_ms fields double as "event already emitted" markers, so a change
        # first seen in the quorum (e.g. committed by a previous operator run) is logged once.
        if new_in and rec.add_committed_ms is None:
            rec.add_committed_ms = now_ms
            events.append(Event(ADD_VOTER_COMMITTED, rec, {"observed": True}))
        if not old_in and rec.remove_committed_ms is None:
            if not new_in and self.policy.order is Order.ADD_THEN_REMOVE:
                # Old removed although the new one was never added: not our doing. Give up and
                # leave the voter count to the scaling logic (reassignment).
                rec.finish(Phase.FAILED, now_ms, f"voter ({rid}, {rec.old_uuid}) removed externally")
                events.append(Event(RECOVERY_FAILED, rec, {"reason": rec.reason}))
                return events
            rec.remove_committed_ms = now_ms
            events.append(Event(REMOVE_VOTER_COMMITTED, rec, {"observed": True}))
        if new_in and not old_in:
            rec.finish(Phase.COMPLETED, now_ms, None)
            events.append(Event(RECOVERY_COMPLETED, rec, rec.durations()))
            return events
        if new_in and old_in:
            if rec.phase is not Phase.REMOVING:
                rec.phase = Phase.ADDED
            return events
        if not old_in:  # RemoveThenAdd between its steps
            rec.phase = Phase.REMOVED
        elif rec.phase in (Phase.ADDED, Phase.REMOVED):
            # We believed a change happened that the quorum does not show (an uncommitted
            # record truncated away): go back to checking catch-up.
            rec.phase, rec.caught_up_since_ms = Phase.STABILIZING, None
        elif rec.phase in (Phase.ADDING, Phase.REMOVING):
            rec.phase = Phase.CAUGHT_UP  # outcome unknown and not visible: retry after re-checking
        if rec.phase in (Phase.STABILIZING, Phase.CAUGHT_UP):
            if now_ms - rec.detected_ms > self.policy.timeout_seconds * 1000:
                rec.finish(
                    Phase.FAILED,
                    now_ms,
                    f"timeout: replica {rid} did not stay caught up for "
                    f"{self.policy.stabilization_seconds:g}s "
                    f"within {self.policy.timeout_seconds:g}s",
                )
                return [*events, Event(RECOVERY_FAILED, rec, {"reason": rec.reason})]
            events.extend(self._stabilise(view, rec, new_obs, now_ms))
        elif rec.phase is Phase.REMOVED and new_obs is not None and new_obs.uuid == rec.new_uuid:
            # RemoveThenAdd between the steps: keep tracking catch-up for the AddVoter.
            if not self._caught_up(view, new_obs, now_ms):
                rec.caught_up_since_ms = None
            elif rec.caught_up_since_ms is None:
                rec.caught_up_since_ms = now_ms
        return events

    def _stabilise(
        self, view: QuorumView, rec: Recovery, new_obs: Replica | None, now_ms: int
    ) -> list[Event]:
        obs = new_obs if new_obs is not None and new_obs.uuid == rec.new_uuid else None
        if not self._caught_up(view, obs, now_ms):
            if rec.caught_up_since_ms is not None:
                was = rec.phase
                rec.caught_up_since_ms = None
                rec.phase = Phase.STABILIZING
                detail = {"lag": obs.lag if obs else None, "phase": was.value}
                return [Event(REPLICA_FELL_BEHIND, rec, detail)]
            return []
        if rec.caught_up_since_ms is None:
            rec.caught_up_since_ms = now_ms
        if (
            rec.phase is Phase.STABILIZING
            and now_ms - rec.caught_up_since_ms >= self.policy.stabilization_seconds * 1000
        ):
            rec.phase = Phase.CAUGHT_UP
            rec.caught_up_ms = now_ms
            # When the stabilisation clock started: the bench measures from its deadline.
            detail = {"lag": obs.lag if obs else None, "stable_since_ms": rec.caught_up_since_ms}
            return [Event(REPLICA_CAUGHT_UP, rec, detail)]
        return []

    def _guess_old(self, view: QuorumView, rid: int, uuids: list[str], now_ms: int) -> str | None:
        for r in reversed(self.records):  # a finished record may still name the old UUID
            if r.replica_id == rid and r.old_uuid in uuids and r.new_uuid in uuids:
                return r.old_uuid
        entries = [v for v in view.voters if v.id == rid]
        dead = [v for v in entries if not view.is_live(v, now_ms, self._window_ms)]
        return dead[0].uuid if len(dead) == 1 else None

    def _recently_failed(self, rid: int, new_uuid: str, now_ms: int) -> bool:
        """A failed attempt is retried (as a new recovery) after one more timeout period."""
        for r in self.records:
            if r.replica_id == rid and r.new_uuid == new_uuid and r.phase is Phase.FAILED:
                if now_ms - (r.finished_ms or 0) < self.policy.timeout_seconds * 1000:
                    return True
        return False

    def _start(self, rid: int, old: str, new: str, phase: Phase, now_ms: int) -> Recovery:
        rec = Recovery(str(_uuid.uuid4()), rid, old, new, phase, now_ms)
        self.records.append(rec)
        return rec

    def _trim(self) -> None:
        done = [r for r in self.records if r.phase in TERMINAL]
        drop = {id(r) for r in done[: max(0, len(done) - self.HISTORY)]}
        self.records = [r for r in self.records if id(r) not in drop]

    # -- decision ------------------------------------------------------------------------------

    def next_action(self, view: QuorumView, now_ms: int) -> Action | None:
        """The one voter change that is safe now, or None (``self.blocked`` says why)."""
        self.blocked = None
        if not self.policy.enabled:
            self.blocked = "recovery disabled by policy" if self.active() else None
            return None
        if not view.has_live_majority(now_ms, self._window_ms):
            self.blocked = "QuorumLost: fewer live voters than a majority"
            return None
        if view.pending is not None:
            self.blocked = f"voter change in progress: {view.pending.op} {view.pending.id}"
            return None
        if view.target_voters is not None:
            self.blocked = f"reassignment to {list(view.target_voters)} in progress"
            return None
        active = self.active()
        if not active:
            return None
        # A recovery that already changed the voter set finishes first; then the oldest detection.
        in_flight = (Phase.ADDING, Phase.ADDED, Phase.REMOVING, Phase.REMOVED)
        active.sort(key=lambda r: (r.phase not in in_flight, r.detected_ms, r.replica_id))
        rec = active[0]
        if rec.retry_at_ms is not None and now_ms < rec.retry_at_ms:
            self.blocked = (
                f"recovery of replica {rec.replica_id}: retrying after an error (attempt {rec.attempts})"
            )
            return None
        uuids = view.voter_uuids(rec.replica_id)
        old_in, new_in = rec.old_uuid in uuids, rec.new_uuid in uuids
        if rec.replica_id in self.suspect_ids and not new_in:
            self.blocked = f"recovery of replica {rec.replica_id} waits: its pod is crash-looping"
            return None
        if old_in and new_in:
            return self._guard_remove(view, rec, now_ms)
        if rec.phase is Phase.REMOVED and not old_in:
            return self._guard_add(view, rec, now_ms, require_stable=False)
        if rec.phase in (Phase.CAUGHT_UP, Phase.ADDING, Phase.REMOVING) and old_in and not new_in:
            if self.policy.order is Order.ADD_THEN_REMOVE:
                return self._guard_add(view, rec, now_ms, require_stable=True)
            return self._guard_remove(view, rec, now_ms)
        self.blocked = f"recovery of replica {rec.replica_id} waiting: {rec.phase.value}"
        return None

    def _guard_add(
        self, view: QuorumView, rec: Recovery, now_ms: int, *, require_stable: bool
    ) -> Action | None:
        got = guard_add(view, rec, self.policy, now_ms, require_stable=require_stable)
        if isinstance(got, str):
            self.blocked = got
            return None
        return got

    def _guard_remove(self, view: QuorumView, rec: Recovery, now_ms: int) -> Action | None:
        got = guard_remove(view, rec, self.policy, now_ms)
        if isinstance(got, str):
            self.blocked = got
            return None
        return got

    def wake_at_ms(self, view: QuorumView | None, now_ms: int) -> int | None:
        """The next instant a decision can change by itself (guards.py); None: none known."""
        return wake_at_ms(self.active(), view, self.policy, now_ms)

    # -- execution bookkeeping -------------------------------------------------------------------

    def _rec(self, action: Action) -> Recovery:
        for r in self.records:
            if r.recovery_id == action.recovery_id:
                return r
        raise KeyError(action.recovery_id)

    def started(self, action: Action, now_ms: int) -> list[Event]:
        """A change is about to be issued (records.py ``record_started``)."""
        return record_started(self._rec(action), action, now_ms)

    def finished(self, action: Action, error_code: str | None, now_ms: int, message: str = "") -> list[Event]:
        """Record the outcome of an issued change (records.py ``record_finished``)."""
        return record_finished(self._rec(action), action, error_code, now_ms, message, self.policy.order)

"""The recovery controller: one observe -> decide -> act cycle per call, shared by the kopf
operator and the local supervisor.

``RecoveryController.reconcile()`` describes the quorum through a :class:`QuorumApi`, folds the
answer into the :class:`RecoveryBook` (recovery.py), issues the voter change that is safe now (and,
when it commits, looks again and issues the next one at once), or one KIP-642 reassignment when the
desired voter ids differ, reports every step (steplog.py: event log, Kubernetes Events,
metrics) and returns the status to publish. It never raises for an unreachable
or leaderless quorum: that is a status (QuorumLost), and the caller retries on its next pass.
``wake_in()`` says when that next pass is due: at the polling interval, or as soon as a recorded
deadline (stabilisation, an old voter counting as gone, a back-off) falls due.

Progress is persisted *before* a change is issued (``persist`` callback), so an operator that dies
mid-call knows on restart which UUID was the old one; the quorum still decides what is done.
After a change the outcome's event is logged first and the progress persisted right after it
(a step is never persisted without its event). An operator that dies between the two observes
the step again on restart; the step log (steplog.py) keeps it from being logged twice. Before
the next step and before a failpoint the sink is flushed (``flush_sink``: a step's Kubernetes
Event is stored by then). Failpoints (failpoints.py) stop the process at those instants.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from quorum.timefmt import rfc3339
from quorum.types import KraftError

from . import failpoints
from .api import QuorumApi
from .core.recovery import (
    Action,
    ActionKind,
    DescribeError,
    QuorumView,
    Recovery,
    RecoveryBook,
    RecoveryPolicy,
    majority,
)
from .core.status import Condition, ControllerStatus, Health, grace_s, quorum_health
from .steplog import BLIND_RESUME, ONCE_PER_RECOVERY, StepLog
from .telemetry import EventSink, OperatorMetrics, flush_sink

__all__ = ["BLIND_RESUME", "ONCE_PER_RECOVERY", "Condition", "ControllerStatus", "RecoveryController"]

log = logging.getLogger(__name__)

Persist = Callable[[list[dict[str, Any]]], Awaitable[None]]


class RecoveryController:
    def __init__(
        self,
        api: QuorumApi,
        policy: RecoveryPolicy,
        *,
        cluster: str,
        sink: EventSink,
        metrics: OperatorMetrics | None = None,
        clock: Callable[[], float] = time.time,
        records: Iterable[Recovery] = (),
        persist: Persist | None = None,
        desired_ids: list[int] | None = None,
    ) -> None:
        self.api = api
        self.cluster = cluster
        self.steps = StepLog(cluster, sink, metrics)  # each step to the event sink once
        self.metrics = metrics
        self.clock = clock
        self.persist = persist
        self.book = RecoveryBook(policy, records)
        self.desired_ids = desired_ids  # None: do not manage the voter count
        self.unreachable_since_ms: int | None = None
        self._lost_reported = False  # this unhealthy episode was published as QuorumLost
        self.last_good_view: QuorumView | None = None  # the last view with a live majority
        self.last_view: QuorumView | None = None  # what the last pass saw (for wake_in)
        # This pass's view with the changes it committed applied (None: nothing committed yet):
        # what a status written right after a commit shows (view.after_change).
        self.committed_view: QuorumView | None = None
        # (id, uuid) of the voters of the last healthy view; seeded from status after a restart.
        self.known_voters: list[tuple[int, str]] = []
        self._lock = asyncio.Lock()  # one reconcile at a time per quorum
        self._resumed = False  # the step log was seeded with what a previous run logged
        self._unreachable_errors: dict[str, str] | None = None  # each address's error, last logged
        if metrics is not None:
            metrics.track(cluster)

    @property
    def sink(self) -> EventSink:
        """Where the steps go (steplog.py); replaceable when ``spec.eventLog`` changes."""
        return self.steps.sink

    @sink.setter
    def sink(self, sink: EventSink) -> None:
        self.steps.sink = sink

    @property
    def policy(self) -> RecoveryPolicy:
        return self.book.policy

    def set_policy(self, policy: RecoveryPolicy) -> None:
        self.book.policy = policy

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------------------------------

    async def reconcile(self) -> ControllerStatus:
        """Observe, decide, act; when a voter change commits, observe and decide again at once
        (AddVoter returns after commit, so RemoveVoter starts right after it: no idle
        waits). At most :data:`MAX_STEPS` changes per call."""
        async with self._lock:
            st = await self._pass()
            for _ in range(self.MAX_STEPS - 1):
                if st.action is None or not st.committed:
                    break
                st = await self._pass()
            return st

    MAX_STEPS = 4

    def wake_in(self, interval: float) -> float:
        """Seconds until the next pass should run: the polling ``interval`` (which only serves to
        notice what the quorum does on its own, e.g. a new replica appearing), or earlier when a
        deadline of the recorded recoveries falls due (:meth:`RecoveryBook.wake_at_ms`)."""
        now = self.now_ms()
        at = self.book.wake_at_ms(self.last_view, now)
        if at is None:
            return interval
        return max(0.0, min(interval, (at - now + 1) / 1000))

    async def _pass(self) -> ControllerStatus:
        if not self._resumed:
            await self.steps.resume(self.book.active())
            self._resumed = True
        self.committed_view = None
        now = self.now_ms()
        try:
            view = QuorumView.from_describe(await self.api.describe())
        except (TimeoutError, KraftError, DescribeError, OSError) as e:
            self.last_view = None
            errors = e.extra.get("errors") if isinstance(e, KraftError) else None
            if not isinstance(errors, dict) or not errors:
                return self._unhealthy(now, f"{e}")
            # Every address unreachable: the status names them, the log says how each failed
            # (that changes from pass to pass: in status it would be a write on every pass).
            if errors != self._unreachable_errors:
                log.info("%s: describe failed: %s", self.cluster, e)
            self._unreachable_errors = errors
            return self._unhealthy(now, f"UNAVAILABLE: cannot reach any address of {', '.join(errors)}")
        self.last_view = view
        window = int(self.policy.live_window_seconds * 1000)
        if not view.has_live_majority(now, window):
            self._publish_gauges(view, now)
            return self._unhealthy(now, "the leader sees fewer live voters than a majority", view)
        self.unreachable_since_ms = None
        self._lost_reported = False
        self.last_good_view = view
        self.known_voters = [(v.id, v.uuid) for v in view.voters]

        self.steps.emit(self.book.observe(view, now), view)
        await flush_sink(self.sink)
        action = self.book.next_action(view, now)
        blocked = self.book.blocked
        reassigned: list[int] | None = None
        committed = False
        if action is not None:
            committed = await self._execute(action, view)
        elif not self.book.active():
            reassigned = await self._maybe_reassign(view, now)
        if self.persist is not None:
            await self.persist(self.book.to_status())
        self._publish_gauges(view, now)
        # With this pass's committed changes applied: the status that carries their records
        # shows the voter set they made, not the one read before them.
        shown = self.committed_view or view
        st = self._status(shown, now, action=action, blocked=blocked, reassigned=reassigned)
        st.committed = committed
        return st

    async def _execute(self, action: Action, view: QuorumView) -> bool:
        """Issue one voter change; True if it committed."""
        started = self.now_ms()
        self.steps.emit(self.book.started(action, started), view)
        await flush_sink(self.sink)  # each step's Kubernetes Event is posted before the step
        if self.persist is not None:
            await self.persist(self.book.to_status())  # before the call: crash-safe bookkeeping
        code: str | None = None
        message = ""
        try:
            if action.kind is ActionKind.ADD_VOTER:
                await self.api.add_voter(action.replica_id, action.uuid)
            else:
                await self.api.remove_voter(action.replica_id, action.uuid)
        except KraftError as e:
            code, message = e.code.value, e.message
            log.warning("%s %s:%s failed: %s", action.kind.value, action.replica_id, action.uuid, e)
        except (TimeoutError, OSError) as e:
            code = "UNAVAILABLE"
            log.warning("%s %s:%s failed: %s", action.kind.value, action.replica_id, action.uuid, e)
        done = self.now_ms()
        if code is None and self.metrics is not None:
            op = "add" if action.kind is ActionKind.ADD_VOTER else "remove"
            self.metrics.voter_change_duration.labels(self.cluster, op).observe((done - started) / 1000)
        self.steps.emit(self.book.finished(action, code, done, message), view)
        await flush_sink(self.sink)  # posted before the next step, and before a failpoint stops us
        if code is None:
            add = action.kind is ActionKind.ADD_VOTER
            seen = self.committed_view or view
            self.committed_view = seen.after_change(add, action.replica_id, action.uuid)
            self.known_voters = [(v.id, v.uuid) for v in self.committed_view.voters]
            # The crash window item: the commit is logged, its progress not yet persisted.
            failpoints.hit(failpoints.AFTER_ADD_COMMITTED if add else failpoints.AFTER_REMOVE_COMMITTED)
        if self.persist is not None:
            await self.persist(self.book.to_status())  # right after the outcome's event
        return code is None

    async def _maybe_reassign(self, view: QuorumView, now: int) -> list[int] | None:
        """KIP-642: move the voter ids to ``desired_ids`` once every new id is a caught-up live
        observer and the target set would have a live majority; the engine then performs the
        single changes one by one."""
        if self.desired_ids is None:
            return None
        desired = sorted(set(self.desired_ids))
        current = sorted({v.id for v in view.voters})
        if view.pending is not None:
            return None
        if view.target_voters is not None:
            if sorted(view.target_voters) == desired:
                return None  # already moving there
        elif current == desired:
            return None
        window = int(self.policy.live_window_seconds * 1000)
        # The sharper liveness of voter changes (view.live_for_change): the target set's majority
        # must be fetching now, not merely within the status window.
        ready = {v.id for v in view.change_live_voters(now, window)}
        ready |= {
            o.id
            for o in view.observers
            if view.live_for_change(o, now, window)
            and 0 <= o.lag <= self.policy.max_lag
            and self.book.vouches(o)
        }
        missing = [i for i in desired if i not in ready]
        if missing:
            self.book.blocked = f"scaling to voters {desired} waits for replicas {missing} to catch up"
            return None
        if len([i for i in desired if i in ready]) < majority(len(desired)):
            self.book.blocked = f"unsafe: voters {desired} would lack a live majority"
            return None
        try:
            await self.api.reassign(desired)
        except (TimeoutError, KraftError, OSError) as e:
            self.book.blocked = f"reassignment to {desired} failed: {e}"
            return None
        return desired

    # ------------------------------------------------------------------------------------------

    def _unhealthy(self, now: int, why: str, view: QuorumView | None = None) -> ControllerStatus:
        """No live majority seen in this pass: lost, or a leader election in progress within its
        grace (status.py ``quorum_health``). Either way nothing is changed in this pass."""
        window = int(self.policy.live_window_seconds * 1000)
        health = quorum_health(
            view, now, window, self.last_good_view, self.unreachable_since_ms, self._lost_reported
        )
        if self.unreachable_since_ms is None:
            self.unreachable_since_ms = now
        if health is not Health.SETTLING:
            self._lost_reported = True
            return self._lost(now, why, view)
        msg = f"{why}; a leader election may be in progress (QuorumLost if it lasts {grace_s(window):g}s)"
        return self._no_majority(view, why, True, ("LeaderElection",) * 3, msg)

    def _no_majority(
        self, view: QuorumView | None, why: str, available: bool, reasons: tuple[str, str, str], msg: str
    ) -> ControllerStatus:
        """The status of a pass without a live majority: ``available`` (a leader election within
        its grace) or lost; ``reasons`` of the Available, Degraded and QuorumLost conditions."""
        active = bool(self.book.active())
        conds = [
            Condition("Available", available, reasons[0], msg),
            Condition("Degraded", True, reasons[1], msg),
            Condition("Recovering", active, "Waiting" if active else "Idle"),
            Condition("QuorumLost", not available, reasons[2], msg),
        ]
        return ControllerStatus(
            view,
            conds,
            self.book.to_status(),
            error=why,
            blocked=msg,
            records=list(self.book.records),
            known_voters=list(self.known_voters),
        )

    def _lost(self, now: int, why: str, view: QuorumView | None = None) -> ControllerStatus:
        if self.unreachable_since_ms is None:
            self.unreachable_since_ms = now
        gone_s = (now - self.unreachable_since_ms) / 1000
        if self.metrics is not None:
            self.metrics.quorum_lost.labels(self.cluster).set(1)
            self.metrics.quorum_lost_seconds.labels(self.cluster).set(gone_s)
        # No running duration in the message: the status must not change on every pass. Unclean
        # recovery (KIP-704 style) is the caller's: local.py runs it on a stopped node directory,
        # the kopf daemon asks the survivor's pod (unclean.py); both annotate this status.
        since = rfc3339(int(self.unreachable_since_ms))
        msg = f"{why} (since {since})"
        return self._no_majority(view, why, False, ("QuorumLost", "QuorumLost", "NoLiveMajority"), msg)

    def _status(
        self,
        view: QuorumView,
        now: int,
        *,
        action: Action | None,
        blocked: str | None,
        reassigned: list[int] | None,
    ) -> ControllerStatus:
        window = int(self.policy.live_window_seconds * 1000)
        live = view.live_voters(now, window)
        dead = [v for v in view.voters if v not in live]
        active = self.book.active()
        blocked = self.book.blocked or blocked or self.book.note
        degraded_why = []
        if dead:
            degraded_why.append("voters not fetching: " + ", ".join(f"{v.id}:{v.uuid}" for v in dead))
        if blocked:
            degraded_why.append(blocked)
        rec_msg = ", ".join(f"replica {r.replica_id} {r.phase.value}" for r in active)
        if self.steps.blind(active):
            rec_msg = f"{rec_msg}; {BLIND_RESUME}"
        conds = [
            Condition(
                "Available", True, "LeaderElected", f"leader {view.leader_id} epoch {view.leader_epoch}"
            ),
            Condition(
                "Degraded",
                bool(dead or active),
                "VotersDown" if dead else ("Recovering" if active else "Healthy"),
                "; ".join(degraded_why),
            ),
            Condition("Recovering", bool(active), "DiskReplacement" if active else "Idle", rec_msg),
            Condition("QuorumLost", False, "LiveMajority", f"{len(live)} of {len(view.voters)} voters live"),
        ]
        if self.metrics is not None:
            self.metrics.quorum_lost.labels(self.cluster).set(0)
            self.metrics.quorum_lost_seconds.labels(self.cluster).set(0)
        return ControllerStatus(
            view,
            conds,
            self.book.to_status(),
            action=action,
            reassigned=reassigned,
            blocked=blocked,
            live_voter_ids=sorted({v.id for v in live}),
            records=list(self.book.records),
            known_voters=list(self.known_voters),
        )

    def _publish_gauges(self, view: QuorumView, now: int) -> None:
        if self.metrics is None:
            return
        window = int(self.policy.live_window_seconds * 1000)
        self.metrics.voters.labels(self.cluster).set(len(view.voters))
        self.metrics.observers.labels(self.cluster).set(len(view.observers))
        self.metrics.live_voters.labels(self.cluster).set(len(view.live_voters(now, window)))
        active = self.book.active()
        self.metrics.recoveries_in_progress.labels(self.cluster).set(len(active))
        oldest = min((r.detected_ms for r in active), default=0)
        self.metrics.oldest_recovery_started.labels(self.cluster).set(oldest / 1000)
        self.metrics.recovery_timeout.labels(self.cluster).set(self.policy.timeout_seconds)

"""KIP-704 style unclean recovery, the state machine both run modes share: the last resort when a
majority of voters is gone for good and the quorum cannot commit anything.

**Data loss, on purpose.** The survivor becomes the sole voter with whatever its log holds:
records committed only on the lost replicas (acknowledged to clients, but never replicated to
the survivor) are lost. That is why it is off by default and waits ``afterSeconds`` of no live
majority first (KIP-704 "unclean leader election" is likewise an explicit opt-in trading
durability for availability).

One :meth:`UncleanCoordinator.step` per pass, after the recovery controller's:

1. Due: the policy allows it and the controller has seen no live majority for ``afterSeconds``
   (``RecoveryController.unreachable_since_ms``; an operator restart starts that clock again,
   which only delays the step).
2. Survivor: every replica is asked for its log state; the survivor is decided by
   core/survivor.py ``decide_survivor``: only once every former voter answered or is known gone
   (the caller says which are gone: pods on Kubernetes, processes locally), the answer a Raft
   election would prefer. Otherwise nothing is chosen and the next pass asks again.
3. Request: the :class:`UncleanRequest` is persisted in the mode's :class:`RequestStore` *before*
   anything acts on it, reported (event ``unclean_recovery``), and the store restarts the
   survivor so that it runs ``kraftkeeper quorum recover-unclean`` on its stopped directory
   (Kubernetes: its pod is deleted and its init container does it; local mode: the supervisor
   runs it between a stop and a start).
4. Done: the first pass that sees a live majority again records ``completed_ms`` (event
   ``unclean_recovery_completed``).

Invariant "never twice for the same outage": a request without ``completed_ms`` blocks any new
request; a request whose restart was not recorded (operator crash in between) only gets its
restart, never a new token (the survivor's directory keeps a marker per token, so a repeated
restart does not repeat the recovery). A new request needs a live majority to have been seen
after the previous one (a new outage).

Known risk (inherent to unclean recovery): if the lost replicas come back between the request
and the survivor's restart, the survivor still turns itself into a sole voter at a newer epoch.
``afterSeconds`` is what makes "gone for good" likely.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid as _uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from kraftkeeper_reports.events import RecoveryEvent
from kraftkeeper_reports.vocabulary import UNCLEAN_RECOVERY, UNCLEAN_RECOVERY_COMPLETED

from quorum.timefmt import rfc3339

from .core.survivor import Probe, SurvivorDecision, decide_survivor
from .telemetry import EventSink, OperatorMetrics

log = logging.getLogger(__name__)

MARKER_PREFIX = "unclean-recovery."  # + token + ".done", in the survivor's data directory
STATUS_PREFIX = "unclean-"  # status.recoveries ids of unclean recoveries (not disk replacements)
LOSS_WARNING = "records committed only on the lost replicas are lost"

ProbeFn = Callable[[int, str], Awaitable[Probe]]


# ---------------------------------------------------------------------------------------------
# The request and where it is kept


@dataclass
class UncleanRequest:
    token: str
    replica_id: int
    ordinal: int
    uuids: tuple[str, ...]
    log_end_offset: int
    outage_since_ms: int
    requested_ms: int
    # replica id -> [last epoch, log end offset] of every answering former voter
    candidates: dict[str, list[int]] = field(default_factory=dict)
    last_epoch: int = -1  # of the survivor's log (-1 in requests written before it was recorded)
    pod_deleted_ms: int | None = None
    completed_ms: int | None = None
    outcome: str | None = None  # what the first healthy view showed

    def pod_line(self) -> str:
        """The ``unclean-recovery`` key as the init container reads it (``read RID RTOKEN RUUIDS``)."""
        return f"{self.replica_id} {self.token} {' '.join(self.uuids)}\n"

    def to_json(self) -> str:
        d = asdict(self)
        d["uuids"] = list(self.uuids)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> UncleanRequest:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        d["uuids"] = tuple(str(u) for u in d["uuids"])
        d["candidates"] = {str(k): _candidate(v) for k, v in (d.get("candidates") or {}).items()}
        return cls(**d)

    def to_crd_status(self) -> dict[str, Any]:
        """A ``status.recoveries`` item (CRD schema); the id prefix keeps it apart from disk
        replacements when the operator reads status back."""
        phases: dict[str, float] = {"quorumLost": round((self.requested_ms - self.outage_since_ms) / 1000, 3)}
        if self.completed_ms is not None:
            phases["restart"] = round((self.completed_ms - self.requested_ms) / 1000, 3)
        done = self.completed_ms is not None
        reason = (
            f"UncleanRecovery: replica {self.replica_id} ({', '.join(self.uuids)}) made sole voter, "
            f"the most up-to-date log (last epoch {self.last_epoch}, end offset {self.log_end_offset}); "
            f"{LOSS_WARNING}"
        )
        if self.outcome:
            reason += f"; {self.outcome}"
        return {
            "recoveryId": STATUS_PREFIX + self.token,
            "replicaId": self.replica_id,
            "oldUuid": None,
            "newUuid": self.uuids[0] if self.uuids else None,
            "startedAt": rfc3339(self.requested_ms),
            "completedAt": None if self.completed_ms is None else rfc3339(self.completed_ms),
            "phaseSeconds": phases,
            "result": "Succeeded" if done else "InProgress",
            "reason": reason,
        }


def _candidate(v: Any) -> list[int]:
    """[last epoch, end offset]; a bare offset is from a request written before epochs were."""
    if isinstance(v, list):
        return [int(x) for x in v]
    return [-1, int(v)]


class RequestStore(Protocol):
    """Where the request lives (the ``NAME-bootstrap`` ConfigMap in Kubernetes, a file of the
    cluster directory locally) and how the survivor is restarted so that it recovers (its pod
    deleted; locally, the supervisor runs the recovery between a stop and a start). ``where``
    names the stored request in messages."""

    where: str

    async def load(self) -> UncleanRequest | None: ...

    async def save(self, request: UncleanRequest) -> None: ...

    async def restart(self, ordinal: int) -> None: ...


# ---------------------------------------------------------------------------------------------
# The coordinator


class ControllerLike(Protocol):
    """The parts of :class:`~.controller.RecoveryController` the coordinator reads."""

    unreachable_since_ms: int | None
    known_voters: list[tuple[int, str]]

    @property
    def policy(self) -> Any: ...


class UncleanCoordinator:
    """One quorum's unclean-recovery state machine (module docstring)."""

    def __init__(
        self,
        store: RequestStore,
        sink: EventSink,
        *,
        cluster: str,
        probe: ProbeFn,
        metrics: OperatorMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.sink = sink
        self.cluster = cluster
        self.probe = probe
        self.metrics = metrics
        self.clock = clock
        self.request: UncleanRequest | None = None
        self._loaded = False
        self._unreadable: str | None = None  # logged once per distinct error

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def outstanding(self) -> UncleanRequest | None:
        r = self.request
        return r if r is not None and r.completed_ms is None else None

    async def step(
        self,
        ctl: ControllerLike,
        lost: bool,
        endpoints: Sequence[str],
        gone: Collection[int] | None = None,
    ) -> str | None:
        """One pass; returns a note for the QuorumLost condition (None: nothing to say).
        ``gone``: the replica ids known not to be able to answer (:func:`gone_replicas`); every
        other former voter must answer before a survivor is chosen (None: all of them)."""
        if not self._loaded:
            unreadable = await self._load()
            if unreadable is not None:
                return unreadable
        now = self.now_ms()
        req = self.outstanding()
        if not lost:
            if req is not None:
                await self._complete(req, ctl, now)
            return None
        if req is not None:
            # An administrator may withdraw the request (delete both keys) to give up or retry;
            # re-read it while it is outstanding. Same token: keep ours (it may know more).
            stored = await self.store.load()
            if stored is None or stored.token != req.token:
                log.warning("%s: unclean recovery %s withdrawn from the ConfigMap", self.cluster, req.token)
                self.request = stored
                return await self.step(ctl, lost, endpoints, gone) if stored is None else None
            if req.pod_deleted_ms is None:  # the operator died between the two writes
                await self._restart(req, now)
            return self._waiting(req)
        policy = ctl.policy
        if not policy.unclean_allowed or ctl.unreachable_since_ms is None:
            return None
        due_ms = ctl.unreachable_since_ms + int(policy.unclean_after_seconds * 1000)
        if now < due_ms:
            return f"unclean recovery allowed, due at {rfc3339(int(due_ms))} if no majority returns"
        if not ctl.known_voters:
            return "unclean recovery due, but no voter set was ever seen: not guessing"
        probes = await asyncio.gather(*(self.probe(k, ep) for k, ep in enumerate(endpoints)))
        decision = decide_survivor(ctl.known_voters, probes, gone)
        if decision.survivor is None:
            # The errors go to the log, not the status: they differ on every pass.
            log.warning(
                "%s: unclean recovery due, %s: %s",
                self.cluster,
                decision.note(),
                "; ".join(decision.errors) or "no error",
            )
            return f"unclean recovery due, but {decision.note()}"
        req = await self._request(decision, ctl.unreachable_since_ms, now)
        await self._restart(req, now)
        return self._waiting(req)

    async def _load(self) -> str | None:
        """Read the stored request once; a note if it is unreadable (then treated as outstanding,
        so nothing is ever done twice)."""
        try:
            self.request = await self.store.load()
        except (ValueError, TypeError, KeyError) as e:
            if self._unreadable != str(e):
                self._unreadable = str(e)
                log.error(
                    "%s: unreadable %s (%s): no unclean recovery until fixed",
                    self.cluster,
                    self.store.where,
                    e,
                )
            return f"unreadable {self.store.where} ({e}): fix or delete it"
        self._loaded = True
        return None

    @staticmethod
    def _waiting(req: UncleanRequest) -> str:
        return (
            f"unclean recovery {req.token} of replica {req.replica_id} requested at "
            f"{rfc3339(req.requested_ms)}; waiting for its pod to restart and lead ({LOSS_WARNING})"
        )

    async def _request(self, decision: SurvivorDecision, outage_since_ms: int, now: int) -> UncleanRequest:
        """Persist the request for the chosen survivor (before anything acts on it) and report it."""
        survivor, uuids = decision.survivor, decision.uuids
        assert survivor is not None and survivor.state is not None
        req = UncleanRequest(
            token=_uuid.uuid4().hex[:16],
            replica_id=survivor.state.node_id,
            ordinal=survivor.ordinal,
            uuids=uuids,
            log_end_offset=survivor.state.end_offset,
            last_epoch=survivor.state.last_epoch,
            outage_since_ms=outage_since_ms,
            requested_ms=now,
            candidates={str(c.node_id): [c.last_epoch, c.end_offset] for c in decision.candidates},
        )
        await self.store.save(req)
        self.request = req
        detail = {
            "reason": f"no live majority for {(now - outage_since_ms) / 1000:.0f}s",
            "log_end_offset": req.log_end_offset,
            "last_epoch": req.last_epoch,
            "candidates": req.candidates,
            "uuids": list(uuids),
            "warning": LOSS_WARNING,
        }
        self.sink.emit(
            RecoveryEvent(UNCLEAN_RECOVERY, req.token, req.replica_id, None, uuids[0], detail=detail)
        )
        log.warning(
            "%s: UNCLEAN RECOVERY requested: replica %d (%s), last epoch %d, log end offset %d, "
            "becomes the sole voter; %s",
            self.cluster,
            req.replica_id,
            ", ".join(uuids),
            req.last_epoch,
            req.log_end_offset,
            LOSS_WARNING,
        )
        if self.metrics is not None:
            self.metrics.unclean_recoveries.labels(self.cluster).inc()
        return req

    async def _restart(self, req: UncleanRequest, now: int) -> None:
        try:
            await self.store.restart(req.ordinal)
        except Exception as e:  # retried on the next pass (pod_deleted_ms stays None)
            log.warning(
                "%s: restarting replica %d for unclean recovery failed: %s", self.cluster, req.replica_id, e
            )
            return
        req.pod_deleted_ms = now  # in memory first: a failed save below must not delete it again
        try:
            await self.store.save(req)
        except Exception as e:  # only an operator restart would delete the pod once more (harmless)
            log.warning("%s: recording the pod restart of %s failed: %s", self.cluster, req.token, e)

    async def _complete(self, req: UncleanRequest, ctl: ControllerLike, now: int) -> None:
        voters = sorted({i for i, _ in ctl.known_voters})
        done = replace(req, completed_ms=now, outcome=f"quorum back with voters {voters}")
        await self.store.save(done)  # on failure the next healthy pass tries again
        self.request = req = done
        self.sink.emit(
            RecoveryEvent(
                UNCLEAN_RECOVERY_COMPLETED,
                req.token,
                req.replica_id,
                None,
                req.uuids[0] if req.uuids else None,
                detail={"voters": voters, "seconds": (now - req.requested_ms) / 1000},
            )
        )
        log.warning("%s: unclean recovery %s done: %s", self.cluster, req.token, req.outcome)

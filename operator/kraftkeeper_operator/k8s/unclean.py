"""KIP-704 style unclean recovery in Kubernetes mode: the last resort when a majority of voters is
gone for good and the quorum cannot commit anything.

**Data loss, on purpose.** The survivor becomes the sole voter with whatever its log holds:
records committed only on the lost replicas (acknowledged to clients, but never replicated to
the survivor) are lost. That is why it is off by default (``spec.uncleanRecovery.enabled``) and
waits ``afterSeconds`` of QuorumLost first (KIP-704 "unclean leader election" is likewise an
explicit opt-in trading durability for availability).

The flow (one :meth:`UncleanCoordinator.step` per daemon pass, after the recovery controller's):

1. Due: the policy allows it and the controller has seen no live majority for ``afterSeconds``
   (``RecoveryController.unreachable_since_ms``; an operator restart starts that clock again,
   which only delays the step).
2. Survivor: without a leader there is no describe, so every replica is asked for its log state
   (``GET /v1/node/log-state``: node id, last epoch, end offset). Every replica whose id was a
   voter in the last voter set a leader reported (``RecoveryController.known_voters``) must have
   answered or be gone by its pod (:func:`gone_replicas`); while one is neither (a Running pod
   whose probe failed or timed out, a pod still starting) nothing is chosen and the next pass asks
   again: it may hold the newest epoch. Among the answers, the one a Raft election would prefer
   wins: highest (last epoch, end offset), then the lower id (core/survivor.py
   ``decide_survivor``, the same rule as local mode). Its storage UUID(s) come from that voter
   set: the operator cannot read a disk.
3. Request: the operator writes two keys into the ``NAME-bootstrap`` ConfigMap (its own field
   manager, like the bootstrap flag): ``unclean-recovery`` = ``"<id> <token> <uuid>..."`` for the
   pod's init container, and ``unclean-recovery.json`` (the full record, read back after an
   operator restart), then reports the step (event log and Kubernetes Event ``unclean_recovery``,
   a Warning) and deletes the survivor's pod so that it restarts with the new ConfigMap content.
4. The pod (manifests.py ``format_command``): when the key names its own replica id and the
   storage UUID in its ``meta.properties``, and its volume holds no marker for the token, the init
   container runs ``kraftkeeper quorum recover-unclean`` on the stopped directory and then writes
   the marker ``unclean-recovery.<token>.done`` next to ``meta.properties``: a pod restart never
   repeats it, and a replaced (re-formatted) volume has another UUID, so it never matches.
5. Done: the first pass that sees a live majority again records ``completedAt`` (event
   ``unclean_recovery_completed``); status shows the step in ``recoveries`` (id ``unclean-<token>``)
   and, meanwhile, in the QuorumLost condition.

Invariant "never twice for the same outage": a request without ``completedAt`` blocks any new
request; it is persisted in the ConfigMap *before* the pod is deleted, and a request whose pod
deletion was not recorded (operator crash in between) only gets its pod deleted, never a new
token. A new request needs a live majority to have been seen after the previous one (a new outage).

Known risk (inherent to unclean recovery): if the lost replicas come back between the request
and the survivor's restart, the survivor still turns itself into a sole voter at a newer epoch.
``afterSeconds`` (minimum 30 in the CRD) is what makes "gone for good" likely.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..unclean import (
    LOSS_WARNING,
    MARKER_PREFIX,
    STATUS_PREFIX,
    ControllerLike,
    ProbeFn,
    RequestStore,
    UncleanCoordinator,
    UncleanRequest,
)
from .podhealth import NODE_CONTAINER, replica_of

__all__ = [
    "LOSS_WARNING",
    "MARKER_PREFIX",
    "STATUS_PREFIX",
    "UNCLEAN_DETAIL_KEY",
    "UNCLEAN_KEY",
    "ControllerLike",
    "MemoryRequestStore",
    "ProbeFn",
    "RequestStore",
    "UncleanCoordinator",
    "UncleanRequest",
    "gone_replicas",
    "request_from_configmap",
]

log = logging.getLogger(__name__)

UNCLEAN_KEY = "unclean-recovery"  # "<id> <token> <uuid> [<uuid>...]\n", read by the init container
UNCLEAN_DETAIL_KEY = "unclean-recovery.json"  # the full UncleanRequest, read by the operator


# ---------------------------------------------------------------------------------------------
# Which replicas cannot answer

# A container waiting for one of these is on its way up (its disk may hold the newest epoch);
# any other waiting reason (CrashLoopBackOff, ImagePullBackOff, ...) does not end by itself.
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})


def gone_replicas(pods: Sequence[Mapping[str, Any]] | None, quorum: str, replicas: int) -> set[int] | None:
    """The replica ids (pod ordinal + 1) whose node cannot answer a probe, from the pods as
    listed: no pod, a pod being deleted (a lost Kubernetes node's pods are, once evicted), a pod
    that cannot be scheduled, one that ended, or whose ``node`` container neither runs nor is on
    its way up. A Running pod, or one scheduled and starting, is not gone: unclean recovery waits
    for its answer (core/survivor.py ``decide_survivor``). None when the pods are not known."""
    if pods is None:
        return None
    seen: dict[int, bool] = {}
    for pod in pods:
        rid = replica_of(str((pod.get("metadata") or {}).get("name") or ""), quorum)
        if rid is not None:
            seen[rid] = _pod_gone(pod)
    return {rid for rid in range(1, replicas + 1) if seen.get(rid, True)}


def _pod_gone(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    st = pod.get("status") or {}
    phase = st.get("phase")
    if phase in ("Succeeded", "Failed"):
        return True
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return True
    if phase == "Pending":
        # scheduled: init containers or the image pull under way; a crash-looping init container
        # (CrashLoopBackOff) does not end by itself
        for cs in st.get("initContainerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] not in _STARTING:
                return True
        return False
    for cs in st.get("containerStatuses") or []:
        if cs.get("name") != NODE_CONTAINER:
            continue
        state = cs.get("state") or {}
        if "running" in state:
            return False
        waiting = state.get("waiting") or {}
        return not (waiting and waiting.get("reason") in _STARTING)
    # no container status: Running without it does not happen; no phase at all means no
    # scheduler or kubelet ever saw the pod (the API server itself sets Pending on creation)
    return phase != "Running"


@dataclass
class MemoryRequestStore:
    """In-memory twin of the ConfigMap store (tests)."""

    where: str = f"{UNCLEAN_DETAIL_KEY} in the bootstrap ConfigMap"

    data: dict[str, str] = field(default_factory=dict)
    restarts: list[int] = field(default_factory=list)
    fail_restart: bool = False

    async def load(self) -> UncleanRequest | None:
        raw = self.data.get(UNCLEAN_DETAIL_KEY)
        return UncleanRequest.from_json(raw) if raw else None

    async def save(self, request: UncleanRequest) -> None:
        self.data[UNCLEAN_KEY] = request.pod_line()
        self.data[UNCLEAN_DETAIL_KEY] = request.to_json()

    async def restart(self, ordinal: int) -> None:
        if self.fail_restart:
            raise OSError("API unreachable")
        self.restarts.append(ordinal)


def request_from_configmap(data: Mapping[str, str] | None) -> UncleanRequest | None:
    raw = (data or {}).get(UNCLEAN_DETAIL_KEY)
    if not raw:
        return None
    return UncleanRequest.from_json(raw)

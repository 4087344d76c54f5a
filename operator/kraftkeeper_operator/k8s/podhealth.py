"""Crash-looping quorum pods: which pods of a KRaftQuorum crash-loop, and when an
episode starts and ends, as pure functions of the pods' ``status`` (the Kubernetes API's Pod
objects as plain dicts); quorums.py lists the pods, reports and posts the Events.

A pod crash-loops when one of its containers (init containers included; the node container
fails before its node starts when its volume is formatted for another cluster) waits with reason
``CrashLoopBackOff``. The episode then lasts until the pod is Ready or is gone (a new pod, a new
uid, is a new story), so the brief Running spells between two crashes do not end it and the
Warning Event is posted once per episode, not once per pass.

While its pod crash-loops, a replica is never taken as a disk replacement (recovery.py
``RecoveryBook.suspect_ids``): a process that starts, fetches for a moment and dies is no disk to
promote, and a volume of another cluster must never join this quorum.

A node coming up (:func:`node_starting`: its container running, the pod not Ready yet) makes the
quorum's daemon describe the leader more often for a while, so a replaced disk's new replica is
seen right after its first fetch.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quorum.timefmt import parse_rfc3339

CRASH_LOOP = "CrashLoopBackOff"
NODE_CONTAINER = "node"
# What a node prints when it refuses a certificate bound to another disk (nodetls.py).
_DISK_MISMATCH = re.compile(
    r"is bound to storage [0-9a-f-]{36}, but this node's disk is "
    r"([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})"
)
MESSAGE_CHARS = 200  # of a container's last termination message, in status and Events
# While a quorum pod's node has started but is not Ready (node_starting; at most STARTING_FOR_S
# after its start) quorums.py describes the leader every STARTING_POLL_S instead of every interval:
# a replaced disk's new replica is seen within that of its first fetch, not up to an interval (2 s)
# later. The pod's own events come too early (container started) or late (Ready, a readiness
# probe period on), so only a describe shows the moment.
STARTING_POLL_S = 0.2
STARTING_FOR_S = 30.0


@dataclass(frozen=True)
class PodTrouble:
    """One crash-looping pod: what a person needs to start looking (the container, why it last
    ended, how often)."""

    pod: str
    uid: str
    replica_id: int | None  # pod ordinal + 1 (manifests.py); None if the name is not ours
    container: str
    reason: str
    exit_code: int | None
    restarts: int
    message: str

    def describe(self) -> str:
        rid = f" (replica {self.replica_id})" if self.replica_id is not None else ""
        parts = [f"pod {self.pod}{rid} crash-looping: container {self.container} {self.reason}"]
        if self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        parts.append(f"restarts {self.restarts}")
        text = ", ".join(parts)
        return f"{text}: {self.message}" if self.message else text


def replica_of(pod: str, quorum: str) -> int | None:
    """Replica id of pod ``NAME-<ordinal>`` of the StatefulSet ``quorum`` (ordinal + 1)."""
    prefix = f"{quorum}-"
    tail = pod[len(prefix) :] if pod.startswith(prefix) else ""
    return int(tail) + 1 if tail.isdigit() else None


def _statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    st = pod.get("status") or {}
    return [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]


def pod_trouble(pod: Mapping[str, Any], quorum: str) -> PodTrouble | None:
    """The pod's crash loop, or None if no container of it waits in ``CrashLoopBackOff``."""
    meta = pod.get("metadata") or {}
    name = str(meta.get("name") or "")
    for cs in _statuses(pod):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") != CRASH_LOOP:
            continue
        last = (cs.get("lastState") or {}).get("terminated") or {}
        msg = str(last.get("message") or last.get("reason") or waiting.get("message") or "").strip()
        code = last.get("exitCode")
        return PodTrouble(
            pod=name,
            uid=str(meta.get("uid") or ""),
            replica_id=replica_of(name, quorum),
            container=str(cs.get("name") or "?"),
            reason=CRASH_LOOP,
            exit_code=int(code) if isinstance(code, int) else None,
            restarts=int(cs.get("restartCount") or 0),
            message=" ".join(msg.split())[:MESSAGE_CHARS],
        )
    return None


def disk_of_pod(pod: Mapping[str, Any], quorum: str) -> tuple[int, str] | None:
    """(replica id, storage UUID of its volume) when the pod's node refused to start because its
    certificate names another disk (its termination message, ``FallbackToLogsOnError``): the
    volume is new (a replaced disk, a scale-up) and needs its own certificate (kubetls.py)."""
    rid = replica_of(str((pod.get("metadata") or {}).get("name") or ""), quorum)
    if rid is None:
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != NODE_CONTAINER:
            continue
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            found = _DISK_MISMATCH.search(str((state.get("terminated") or {}).get("message") or ""))
            if found:
                return rid, found.group(1)
    return None


def corrupt_log_of_pod(pod: Mapping[str, Any]) -> str | None:
    """The node's ``CORRUPT_LOG: FILE: ... at position P (offset O)`` line when its last run
    stopped on a damaged log (its termination message, ``FallbackToLogsOnError``)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != NODE_CONTAINER:
            continue
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            text = str((state.get("terminated") or {}).get("message") or "")
            lines = [ln.strip() for ln in text.splitlines() if "CORRUPT_LOG" in ln]
            if lines:
                return lines[-1][:500]
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def node_starting(pods: Iterable[Mapping[str, Any]], now_ms: int, within_s: float) -> bool:
    """A pod's node container started less than ``within_s`` ago and the pod is not Ready yet:
    a node is coming up (a replaced disk's first fetch is a second or so away), which only a
    describe of the leader shows; its readiness probe says so seconds later, its next pod event
    maybe never. Pods being deleted do not count."""
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp") or pod_ready(pod):
            continue
        for c in _statuses(pod):
            if c.get("name") != NODE_CONTAINER:
                continue
            started = ((c.get("state") or {}).get("running") or {}).get("startedAt")
            with contextlib.suppress(ValueError, TypeError):
                if started and 0 <= now_ms - parse_rfc3339(str(started)) < within_s * 1000:
                    return True
    return False


class CrashLoops:
    """The crash-loop episodes of one quorum's pods, keyed by pod uid.

    ``update(pods)`` returns (episodes that started, episodes that ended) in this pass; ``current``
    is every open episode, refreshed with the latest restart count and message."""

    def __init__(self, quorum: str) -> None:
        self.quorum = quorum
        self.current: dict[str, PodTrouble] = {}

    def update(self, pods: Iterable[Mapping[str, Any]]) -> tuple[list[PodTrouble], list[PodTrouble]]:
        started: list[PodTrouble] = []
        seen: set[str] = set()
        for pod in pods:
            uid = str((pod.get("metadata") or {}).get("uid") or "")
            seen.add(uid)
            trouble = pod_trouble(pod, self.quorum)
            if trouble is not None:
                if uid not in self.current:
                    started.append(trouble)
                self.current[uid] = trouble
            elif uid in self.current and pod_ready(pod):
                seen.discard(uid)  # over: Ready again
        ended = [t for uid, t in self.current.items() if uid not in seen]
        for t in ended:
            del self.current[t.uid]
        return started, ended

    def replica_ids(self) -> set[int]:
        return {t.replica_id for t in self.current.values() if t.replica_id is not None}

    def summary(self) -> str:
        return "; ".join(t.describe() for t in sorted(self.current.values(), key=lambda t: t.pod))

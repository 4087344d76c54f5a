"""Which Kubernetes objects a KRaftQuorum may touch: its names, and its ownership.

A KRaftQuorum ``X`` makes objects named after it (manifests.py, kubetls.py, quorumtls.py):
Services ``X`` and ``X-headless``, Secrets ``X-tls``, ``X-node-<i>-tls`` ... A second quorum
whose name makes one of those names in the same namespace (``X-headless`` makes the Service
``X-headless`` too) would fight the first over that object, or take it over: such a quorum is
refused with a clear error (:func:`name_conflict`), before anything is applied.

And whatever the names, the operator patches or deletes an object only if it has none yet or it
is owned by the KRaftQuorum at hand (its ``ownerReferences`` name that resource's uid):
:func:`check_owned` before every server-side apply, :func:`owned_by` before every delete. An
object someone else made, or another resource owns, is never changed; the reconcile fails with
an error naming it (kopf PermanentError, ``status.phase=Failed``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kopf

__all__ = ["check_owned", "name_conflict", "object_names", "older_quorums", "owned_by"]

# The most replicas whose per-replica objects are considered (voters are at most 9 in the CRD).
MAX_REPLICAS = 9


def object_names(name: str) -> dict[str, set[str]]:
    """Per kind, the names of the objects KRaftQuorum ``name`` makes (PVCs and pods included,
    for replicas 1..MAX_REPLICAS)."""
    nodes = range(1, MAX_REPLICAS + 1)
    return {
        "StatefulSet": {name},
        "Service": {name, f"{name}-headless"},
        "PodDisruptionBudget": {name},
        "NetworkPolicy": {name},
        "ConfigMap": {f"{name}-bootstrap"},
        "Secret": {f"{name}-tls", f"{name}-client", f"{name}-ca", f"{name}-operator-tls"}
        | {f"{name}-node-{i}-tls" for i in nodes}
        | {f"{name}-node-{i}-spare-tls" for i in nodes},
        "Certificate": {f"{name}-operator", f"{name}-client"}
        | {f"{name}-node-{i}" for i in nodes}
        | {f"{name}-node-{i}-spare" for i in nodes},
        "Pod": {f"{name}-{i - 1}" for i in nodes},
        "PersistentVolumeClaim": {f"data-{name}-{i - 1}" for i in nodes},
    }


def name_conflict(name: str, others: Iterable[str]) -> str | None:
    """Why KRaftQuorum ``name`` cannot live beside the quorums ``others`` of its namespace (None
    if it can): the first object name both would make."""
    mine = object_names(name)
    for other in sorted(set(others) - {name}):
        theirs = object_names(other)
        for kind, names in mine.items():
            clash = sorted(names & theirs[kind])
            if clash:
                return (
                    f"KRaftQuorum {name!r} would make the {kind} {clash[0]!r}, which KRaftQuorum "
                    f"{other!r} in the same namespace makes too; choose a name that does not extend "
                    f"another quorum's name with a suffix such as -headless, -tls or -node-N"
                )
    return None


def older_quorums(body: Mapping[str, Any], items: Iterable[Mapping[str, Any]]) -> list[str]:
    """The names of the quorums among ``items`` (the namespace's KRaftQuorums) that make
    objects and came before ``body``: a conflict refuses the newer of two quorums, never one
    that already runs. Kafka-kind quorums make no objects (kafka/kube.py)."""
    from .kafkaspec import is_kafka

    def key(meta: Mapping[str, Any]) -> tuple[str, str]:
        return (str(meta.get("creationTimestamp") or ""), str(meta.get("name")))

    mine = key(body.get("metadata") or {})
    out = []
    for item in items:
        meta = item.get("metadata") or {}
        if meta.get("uid") != (body.get("metadata") or {}).get("uid") and not is_kafka(item):
            if key(meta) < mine:
                out.append(str(meta.get("name")))
    return out


def owned_by(meta: Mapping[str, Any] | None, uid: str) -> bool:
    """True if the object's metadata (None: no such object) names ``uid`` as an owner."""
    refs = (meta or {}).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("uid") == uid for r in refs)


def check_owned(what: str, existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> None:
    """Refuse (kopf PermanentError naming the object and its owner) to apply ``desired`` over
    an ``existing`` object (its metadata; None if absent) the same owner does not own."""
    if existing is None:
        return
    refs = desired.get("ownerReferences") or []
    uid = refs[0].get("uid") if refs and isinstance(refs[0], Mapping) else None
    if uid is not None and owned_by(existing, uid):
        return
    owners = [f"{r.get('kind')} {r.get('name')}" for r in existing.get("ownerReferences") or []]
    by = f"owned by {', '.join(owners)}" if owners else "not made by the operator"
    raise kopf.PermanentError(
        f"{what} already exists and is {by}; refusing to change it (rename the KRaftQuorum or "
        "remove that object)"
    )

"""A damaged log on Kubernetes: a quorum pod whose node stopped with ``CORRUPT_LOG`` (its
termination message, podhealth.py ``corrupt_log_of_pod``) holds a disk that can no longer prove
what it acknowledged (docs/design.md "Torn writes and damage"). It is treated as a lost disk:

* when ``spec.recovery.enabled`` (the default) and a majority of the voter set is healthy without
  that replica (rotation.py ``healthy_majority_without``), the operator deletes the pod's claim
  ``data-NAME-<ordinal>`` (only if it carries the quorum's labels) and then the pod: the
  StatefulSet makes a new, empty volume, the node joins under a new storage UUID with a certificate
  for it (kubetls.py), and the KIP-856 recovery adds it and removes the old (id, UUID). A Warning
  Event ``DamagedDiskReplaced`` names the file and offset. What happens to the damaged volume
  itself follows its PersistentVolume's reclaim policy (``Retain`` keeps it for inspection);
* otherwise nothing is deleted: a Warning Event ``DamagedLogNeedsAction`` names the file and
  offset, the replicas whose logs are not known to be damaged, and the way out (KIP-704 unclean
  recovery from the undamaged replica with the highest last epoch and end offset,
  ``spec.uncleanRecovery``, docs/operator.md "A damaged log").

A damaged pod is reconsidered on every pass until its claim and pod are deleted: a quorum that
had no healthy majority without it when it stopped may heal later (the other voters come back),
and the damaged disk is then replaced as above. Its Event is posted once per change of what is
done or why not (a pod uid maps to its last outcome), not on every pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.rotation import healthy_majority_without
from ..core.view import QuorumView
from .kube import KubeApi
from .manifests import QuorumSpec
from .podhealth import corrupt_log_of_pod, replica_of

log = logging.getLogger("kraftkeeper.operator")

FRESH_MS = 5000  # a voter that fetched within this is healthy (with its lag within maxLagRecords)


def damaged_pods(pods: Sequence[Mapping[str, Any]], quorum: str) -> dict[int, tuple[str, str, str]]:
    """replica id -> (pod name, pod uid, CORRUPT_LOG line) for the pods that stopped on a
    damaged log."""
    out = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        rid = replica_of(str(meta.get("name") or ""), quorum)
        line = corrupt_log_of_pod(pod)
        if rid is not None and line is not None:
            out[rid] = (str(meta.get("name")), str(meta.get("uid") or ""), line)
    return out


REPLACED = "replaced"  # the outcome of a pod uid whose claim and pod were deleted


async def handle_damaged_logs(
    kube: KubeApi,
    q: QuorumSpec,
    pods: Sequence[Mapping[str, Any]],
    view: QuorumView | None,
    replicas: int,
    done: dict[str, str],
) -> list[int]:
    """One pass (module docstring); ``done`` maps the damaged pod uids seen to their last
    outcome (:data:`REPLACED`, or why nothing was deleted). Returns the replica ids whose claim
    and pod were deleted."""
    found = damaged_pods(pods, q.name)
    for uid in [u for u in done if u not in {f[1] for f in found.values()}]:
        del done[uid]  # that pod is gone (replaced, or healed by a person): forget it
    out = []
    now_ms = int(time.time() * 1000)
    for rid, (pod, uid, line) in sorted(found.items()):
        if done.get(uid) == REPLACED:
            continue
        claim = f"data-{q.name}-{rid - 1}"
        if q.policy.enabled and healthy_majority_without(view, rid, q.policy.max_lag, now_ms, FRESH_MS):
            deleted = await kube.delete_claim(q.namespace, claim, q.selector())
            await kube.delete_pod(q.namespace, pod)
            msg = (
                f"replica {rid} stopped on a damaged log ({line}); the other voters commit without it: "
                f"{'PersistentVolumeClaim ' + claim + ' and ' if deleted else ''}pod {pod} deleted, it comes "
                "back on a new volume under a new storage UUID (KIP-856)"
            )
            await kube.notify(q, warning=True, reason="DamagedDiskReplaced", message=msg)
            log.warning("%s: %s", q.cluster, msg)
            # Marked done only once the deletes went through: an API error above leaves the pod
            # to the next pass instead of forgetting it.
            done[uid] = REPLACED
            out.append(rid)
            continue
        why = "spec.recovery.enabled is false" if not q.policy.enabled else "no healthy majority without it"
        if done.get(uid) == why:
            continue  # said already; reconsidered again on the next pass
        intact = [i for i in range(1, replicas + 1) if i not in found]
        msg = (
            f"replica {rid} stopped on a damaged log ({line}); {why}: nothing deleted. Logs not known "
            f"to be damaged: replica(s) {intact or 'none'}. If a majority is damaged, recover from the "
            "undamaged replica with the highest last epoch and end offset (spec.uncleanRecovery, "
            "KIP-704: records only the damaged replicas held are lost), then replace the damaged volumes; "
            "if the other voters come back, the damaged volume is replaced then"
        )
        log.error("%s: %s", q.cluster, msg)
        if await kube.notify(q, warning=True, reason="DamagedLogNeedsAction", message=msg):
            done[uid] = why  # an Event the API server refused is posted again on the next pass
    return out

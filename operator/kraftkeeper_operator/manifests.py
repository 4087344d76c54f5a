"""Kubernetes objects of one KRaftQuorum, as plain dicts (no API calls, no kopf).

For a KRaftQuorum ``NAME`` in namespace ``NS``:

* StatefulSet ``NAME``: one pod per replica; pod ordinal ``k`` runs replica id ``k + 1``. An init
  container runs ``kraftkeeper format --ignore-formatted`` on the pod's volume (a new, empty volume
  gets a fresh storage UUID, KIP-856; a formatted one keeps its identity), then the node runs
  ``kraftkeeper start --advertise $(POD_NAME).NAME-headless.NS.svc:PORT``. Readiness is
  ``GET /readyz`` (the node knows a leader: Strimzi #12760 is why it is not just "process up"),
  liveness ``GET /healthz``.
* Service ``NAME-headless`` (stable pod DNS, publishes not-ready addresses so replicas can find a
  leader before they are ready) and Service ``NAME`` (clients, metrics).
* PodDisruptionBudget ``NAME`` with ``maxUnavailable = (voters - 1) // 2``: a voluntary disruption
  never takes a majority down (a quorum of 1 allows none).

Identity: the cluster id is derived from ``NS/NAME`` (not the object's uid), so deleting and
re-creating a KRaftQuorum over retained volumes brings the same quorum back.

PVC policy (ZooKeeper operator #94/#448/#513): ``whenScaled: Delete`` - a replica is removed from
the voter set (KIP-642 reassignment) *before* the StatefulSet shrinks, so its volume holds nothing
the quorum needs, and a later scale-up must not find stale clutter (a stale volume would even be
harmless: its storage UUID is no longer a voter, so it could only rejoin as an observer).
``whenDeleted: Retain`` - deleting the custom resource never destroys data; the claims
(label ``app.kubernetes.io/instance=NAME``) are left for an administrator, and re-creating the
resource with the same name reuses them.

The bootstrap voter list (``--voters``) is fixed when the StatefulSet is first created (annotation
``kraftkeeper.io/bootstrap-voters``) so that scaling does not roll every pod; the current voter set
lives in the quorum's log (KIP-856) and changes only through AddVoter / RemoveVoter / reassignment.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .recovery import PolicyError, RecoveryPolicy

GROUP = "kraftkeeper.io"
VERSION = "v1alpha1"
PLURAL = "kraftquorums"
KIND = "KRaftQuorum"
DATA_DIR = "/data/kraft"  # a sub-directory: a fresh ext4 volume has lost+found at its root
BOOTSTRAP_ANNOTATION = "kraftkeeper.io/bootstrap-voters"
DEFAULT_IMAGE = "kraftkeeper:latest"


class SpecError(ValueError):
    """An invalid KRaftQuorum spec; the message names the field."""


@dataclass(frozen=True)
class QuorumSpec:
    namespace: str
    name: str
    uid: str
    voters: int
    image: str
    image_pull_policy: str
    port: int
    metrics_port: int
    storage_size: str
    storage_class: str | None
    resources: Mapping[str, Any]
    scheduling: Mapping[str, Any]
    policy: RecoveryPolicy
    event_log: str  # "stdout" or an absolute path
    generation: int

    @property
    def headless(self) -> str:
        return f"{self.name}-headless"

    @property
    def cluster(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def cluster_id(self) -> str:
        return hashlib.sha256(self.cluster.encode()).hexdigest()[:22]

    def labels(self) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "kraftkeeper",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/component": "quorum",
            "app.kubernetes.io/managed-by": "kraftkeeper-operator",
        }

    def selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": "kraftkeeper", "app.kubernetes.io/instance": self.name}

    def pod_endpoint(self, ordinal: int) -> str:
        return f"{self.name}-{ordinal}.{self.headless}.{self.namespace}.svc:{self.port}"

    def voters_arg(self, n: int) -> str:
        return ",".join(f"{k + 1}@{self.pod_endpoint(k)}" for k in range(n))


def parse_spec(body: Mapping[str, Any]) -> QuorumSpec:
    """Validate a KRaftQuorum object; raises :class:`SpecError` naming the field."""
    meta = body.get("metadata") or {}
    spec = body.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("spec: missing or not an object")
    voters = spec.get("voters", 3)
    if isinstance(voters, bool) or not isinstance(voters, int) or not 1 <= voters <= 9 or voters % 2 == 0:
        raise SpecError(f"spec.voters: must be an odd integer from 1 to 9, got {voters!r}")
    image = spec.get("image") or os.environ.get("KRAFTKEEPER_DEFAULT_IMAGE") or DEFAULT_IMAGE
    if not isinstance(image, str) or any(c.isspace() for c in image):
        raise SpecError(f"spec.image: must be an image reference without spaces, got {image!r}")
    pull = spec.get("imagePullPolicy", "IfNotPresent")
    if pull not in ("Always", "IfNotPresent", "Never"):
        raise SpecError(f"spec.imagePullPolicy: {pull!r} is not Always, IfNotPresent or Never")
    ports = spec.get("ports") or {}
    port = ports.get("client", 9093)
    metrics_port = ports.get("metrics", port)
    for field_name, value in (("client", port), ("metrics", metrics_port)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1024 <= value <= 65535:
            raise SpecError(f"spec.ports.{field_name}: must be a port from 1024 to 65535, got {value!r}")
    storage = spec.get("storage") or {}
    size = storage.get("size", "1Gi")
    if not isinstance(size, str) or not size or size[0] in "-0":
        raise SpecError(f"spec.storage.size: must be a positive quantity such as 1Gi, got {size!r}")
    log_path = (spec.get("eventLog") or {}).get("path", "stdout")
    if not isinstance(log_path, str) or not (log_path == "stdout" or log_path.startswith("/")):
        raise SpecError(f"spec.eventLog.path: must be 'stdout' or an absolute path, got {log_path!r}")
    # The operator writes where a resource tells it to: keep that inside its event-log volume
    # (KRAFTKEEPER_EVENT_LOG_DIR, set by the Helm chart) so a spec cannot overwrite other files.
    root = os.environ.get("KRAFTKEEPER_EVENT_LOG_DIR")
    if root and log_path != "stdout":
        norm, base = os.path.normpath(log_path), os.path.normpath(root)
        if norm != base and not norm.startswith(base + os.sep):
            raise SpecError(
                f"spec.eventLog.path: {log_path!r} is outside the operator's event-log directory {root}"
            )
    try:
        policy = RecoveryPolicy.from_spec(spec.get("recovery"), spec.get("uncleanRecovery"))
    except PolicyError as e:
        raise SpecError(str(e)) from None
    return QuorumSpec(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        voters=voters,
        image=image,
        image_pull_policy=pull,
        port=port,
        metrics_port=metrics_port,
        storage_size=size,
        storage_class=storage.get("storageClassName"),
        resources=spec.get("resources") or {},
        scheduling=spec.get("scheduling") or {},
        policy=policy,
        event_log=log_path,
        generation=int(meta.get("generation") or 0),
    )


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(q: QuorumSpec, name: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": q.namespace, "labels": q.labels(), "ownerReferences": [dict(owner)]}


def statefulset(
    q: QuorumSpec, owner: Mapping[str, Any], *, replicas: int, bootstrap_voters: int
) -> dict[str, Any]:
    start = (
        f"exec kraftkeeper start --dir {DATA_DIR} --listen 0.0.0.0:{q.port} "
        f'--advertise "$(POD_NAME).{q.headless}.{q.namespace}.svc:{q.port}" '
        f'--voters "{q.voters_arg(bootstrap_voters)}"'
    )
    # Replica id = pod ordinal + 1 (ids start at 1 in interfaces.md).
    fmt = (
        "ID=$(( ${POD_NAME##*-} + 1 )) && "
        f"exec kraftkeeper format --dir {DATA_DIR} --cluster-id {q.cluster_id} "
        '--node-id "$ID" --ignore-formatted'
    )
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    mounts = [{"name": "data", "mountPath": "/data"}]
    container: dict[str, Any] = {
        "name": "node",
        "image": q.image,
        "imagePullPolicy": q.image_pull_policy,
        "command": ["sh", "-c", start],
        "env": env,
        "ports": [{"name": "client", "containerPort": q.port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "client"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "client"},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "volumeMounts": mounts,
    }
    if q.resources:
        container["resources"] = dict(q.resources)
    pod_spec: dict[str, Any] = {
        "initContainers": [
            {
                "name": "format",
                "image": q.image,
                "imagePullPolicy": q.image_pull_policy,
                "command": ["sh", "-c", fmt],
                "env": env,
                "volumeMounts": mounts,
            }
        ],
        "containers": [container],
        "terminationGracePeriodSeconds": 30,
    }
    sched = q.scheduling
    for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints", "priorityClassName"):
        if sched.get(key):
            pod_spec[key] = sched[key]
    claim: dict[str, Any] = {
        "metadata": {"name": "data", "labels": q.selector()},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": q.storage_size}}},
    }
    if q.storage_class:
        claim["spec"]["storageClassName"] = q.storage_class
    meta = _meta(q, q.name, owner)
    meta["annotations"] = {BOOTSTRAP_ANNOTATION: str(bootstrap_voters)}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "serviceName": q.headless,
            "podManagementPolicy": "Parallel",  # a quorum needs its peers to become ready at all
            "selector": {"matchLabels": q.selector()},
            "updateStrategy": {"type": "RollingUpdate"},
            "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Retain"},
            "template": {"metadata": {"labels": q.labels()}, "spec": pod_spec},
            "volumeClaimTemplates": [claim],
        },
    }


def headless_service(q: QuorumSpec, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(q, q.headless, owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": q.selector(),
            "ports": [{"name": "client", "port": q.port, "targetPort": "client"}],
        },
    }


def client_service(q: QuorumSpec, owner: Mapping[str, Any]) -> dict[str, Any]:
    ports = [{"name": "client", "port": q.port, "targetPort": "client"}]
    if q.metrics_port != q.port:
        ports.append({"name": "metrics", "port": q.metrics_port, "targetPort": "client"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(q, q.name, owner),
        "spec": {"type": "ClusterIP", "selector": q.selector(), "ports": ports},
    }


def pod_disruption_budget(q: QuorumSpec, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(q, q.name, owner),
        "spec": {"maxUnavailable": (q.voters - 1) // 2, "selector": {"matchLabels": q.selector()}},
    }


def parse_overrides(text: str | None) -> dict[str, str]:
    """Test hook ``KRAFTKEEPER_ENDPOINT_OVERRIDES``: ``ns/name/ordinal=HOST:PORT`` pairs separated by
    commas (or a JSON object of the same). With no kubelet, tests run real node processes on
    loopback and point the controller at them instead of the pods' DNS names."""
    if not text or not text.strip():
        return {}
    text = text.strip()
    if text.startswith("{"):
        import json

        obj = json.loads(text)
        if not isinstance(obj, dict):
            raise ValueError("KRAFTKEEPER_ENDPOINT_OVERRIDES: JSON must be an object")
        return {str(k): str(v) for k, v in obj.items()}
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key.count("/") != 2 or ":" not in value:
            raise ValueError(f"KRAFTKEEPER_ENDPOINT_OVERRIDES: {part!r} is not ns/name/ordinal=HOST:PORT")
        out[key] = value
    return out


def endpoints(q: QuorumSpec, replicas: int, overrides: Mapping[str, str]) -> list[str]:
    """The addresses the controller uses to reach replicas 0..replicas-1."""
    return [overrides.get(f"{q.namespace}/{q.name}/{k}", q.pod_endpoint(k)) for k in range(replicas)]

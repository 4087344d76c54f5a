"""Kubernetes objects of one KRaftQuorum, as plain dicts (no API calls, no kopf).

For a KRaftQuorum ``NAME`` in namespace ``NS``:

* StatefulSet ``NAME``: one pod per replica; pod ordinal ``k`` runs replica id ``k + 1``. The node
  container's shell execs ``kraftkeeper start --format-cluster-id ... --advertise
  $(POD_NAME).NAME-headless.NS.svc:PORT``, whose process first formats the pod's volume as
  ``kraftkeeper format --ignore-formatted`` would (a new, empty volume gets a fresh storage UUID,
  KIP-856; a formatted one keeps its identity, if it names this cluster and node). Readiness is
  ``GET /readyz`` (the node knows a leader: Strimzi #12760 is why it is not just "process up"),
  liveness ``GET /healthz``.
* Service ``NAME-headless`` (stable pod DNS, publishes not-ready addresses so replicas can find a
  leader before they are ready) and Service ``NAME`` (clients, metrics).
* PodDisruptionBudget ``NAME`` with ``maxUnavailable = (voters - 1) // 2``: a voluntary disruption
  never takes a majority down (a quorum of 1 allows none).
* ConfigMap ``NAME-bootstrap``, mounted read-only into the node container at
  ``/etc/kraftkeeper/bootstrap`` (a volume, so an update reaches new pods without rolling the
  StatefulSet). The operator sets its key ``bootstrapped: "true"`` once the quorum has bootstrapped
  (the leader's describe shows every voter with a storage UUID) and never unsets it; the key is
  written by a field manager of its own (``kraftkeeper-operator-bootstrap``), so re-applying the
  object on a spec change can never remove it. From then on a fresh, empty volume can only be a
  replacement disk (or a scale-up replica), and the node container's preparation formats it with
  ``--no-initial-controllers`` (meta.properties ``bootstrap.initial=false``): such a node never
  counts itself one of the uuid-less bootstrap voters, so two replaced disks with empty logs cannot
  elect each other and overwrite committed records (KIP-856 storage UUIDs; Kafka KIP-853 has the
  same format flag). The ConfigMap volume is not optional: without it a pod does not start, rather
  than risk an initial format. Limitation: a volume replaced after the bootstrap but before the
  operator's next pass (a few seconds) still gets an initial format.
  The same ConfigMap carries the KIP-704 style unclean-recovery request (keys ``unclean-recovery``
  and ``unclean-recovery.json``, field manager ``kraftkeeper-operator-unclean``, see unclean.py);
  the same preparation acts on it (``format_command``), so the pods need no other mount.

Pod security: the pods pass the ``restricted`` Pod Security level and run as the image's user
(uid/gid 10001): ``runAsNonRoot``, ``fsGroup`` 10001 (so a fresh, root-owned volume is writable;
``fsGroupChangePolicy: OnRootMismatch`` keeps large volumes from being re-chowned on every start),
``seccompProfile: RuntimeDefault``; every container drops ALL capabilities, forbids privilege
escalation and has a read-only root filesystem, with an emptyDir at ``/tmp`` (``HOME=/tmp``).

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

import json
from collections.abc import Mapping
from typing import Any

# The spec's parser and the operator's resolved view of it, re-exported for the callers of old.
from .quorumspec import DEFAULT_IMAGE as DEFAULT_IMAGE
from .quorumspec import QuorumSpec as QuorumSpec
from .quorumspec import SpecError as SpecError
from .quorumspec import parse_spec as parse_spec
from .tlsspec import SPARE_CRT, TLS_MOUNT, apply_to_pod, check_command, spare_args_command, start_args
from .unclean import MARKER_PREFIX, UNCLEAN_KEY

GROUP = "kraftkeeper.io"
VERSION = "v1alpha1"
PLURAL = "kraftquorums"
KIND = "KRaftQuorum"
DATA_MOUNT = "/data"
DATA_DIR = f"{DATA_MOUNT}/kraft"  # a sub-directory: a fresh ext4 volume has lost+found at its root
BOOTSTRAP_ANNOTATION = "kraftkeeper.io/bootstrap-voters"
BOOTSTRAP_MOUNT = "/etc/kraftkeeper/bootstrap"  # the NAME-bootstrap ConfigMap, read-only
BOOTSTRAP_KEY = "bootstrapped"  # value "true" once every voter has a storage UUID; never unset
IMAGE_UID = 10001  # the user the project's image runs as (Dockerfile)


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


def owner_reference_of(q: QuorumSpec) -> dict[str, Any]:
    """The owner reference of the resource ``q`` was parsed from (needs its uid)."""
    return owner_reference({"metadata": {"name": q.name, "uid": q.uid}})


def _meta(q: QuorumSpec, name: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": q.namespace, "labels": q.labels(), "ownerReferences": [dict(owner)]}


def bootstrap_configmap(q: QuorumSpec, owner: Mapping[str, Any], *, bootstrapped: bool) -> dict[str, Any]:
    """ConfigMap ``NAME-bootstrap``. Without ``bootstrapped`` it carries no data at all: the spec
    reconcile applies that form, so it never owns (and never removes) the key the daemon sets."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(q, q.bootstrap_configmap, owner),
    }
    if bootstrapped:
        obj["data"] = {BOOTSTRAP_KEY: "true"}
    return obj


def unclean_configmap(q: QuorumSpec, owner: Mapping[str, Any], data: Mapping[str, str]) -> dict[str, Any]:
    """ConfigMap ``NAME-bootstrap`` carrying only the unclean-recovery keys (unclean.py), applied
    under their own field manager so neither the spec reconcile nor the bootstrap flag's manager
    can remove them."""
    obj = bootstrap_configmap(q, owner, bootstrapped=False)
    obj["data"] = dict(data)
    return obj


def format_command(q: QuorumSpec) -> str:
    """The shell command that prepares the volume in the node container before the node starts.
    Replica id = pod ordinal + 1 (ids start at 1). ``--ignore-formatted`` keeps a formatted
    volume's identity; a fresh volume gets a new storage UUID, and ``--no-initial-controllers``
    once the mounted ConfigMap says the quorum has bootstrapped (module docstring).

    Then the KIP-704 style unclean recovery step (unclean.py): if the ConfigMap's
    ``unclean-recovery`` key (``"<id> <token> <uuid>..."``) names this replica id and the storage
    UUID in this volume's meta.properties, and the volume has no marker for the token yet, run
    ``kraftkeeper quorum recover-unclean`` on the (not yet started) data directory and write the
    marker, so that no restart ever repeats it. A failed recover-unclean fails the container
    before the node starts (it never starts half-recovered; its log says why). A request for
    another id or another UUID (e.g. this volume was replaced since) changes nothing."""
    d, b = DATA_DIR, BOOTSTRAP_MOUNT
    done = f'"{d}/{MARKER_PREFIX}$RTOKEN.done"'
    # Before the bootstrap an empty volume takes the storage UUID its certificate names (the
    # operator chose it: kubetls.py), so the node starts with a credential bound to its disk.
    # After it, never: a certificate may be stale (issued for the volume this one replaces), and
    # an empty disk under a current voter's UUID would be counted with a log it never had. The
    # disk then gets a random UUID, the node refuses its old certificate (exit, message naming
    # both UUIDs), and the operator issues one for the new disk (quorumtls.py).
    #
    # After the bootstrap an empty volume takes the UUID of the pod's *spare* certificate when it
    # has one (spares.py: a UUID no disk had, issued after this replica's node last started), so
    # its first start holds a certificate of its disk and joins at once; the operator accepts it
    # only for a replaced claim. A formatted volume keeps its UUID (the spare is then unused).
    crt = f"{TLS_MOUNT}/node.crt"  # this pod's own directory of the tls volume (tlsspec.py)
    spare = f"{TLS_MOUNT}/{SPARE_CRT}"
    initial = f"if [ -s {crt} ]; then set -- --storage-uuid-from-cert {crt}; fi; " if q.tls.enabled else ""
    after = (
        f'if [ "${{1:-}}" = --no-initial-controllers ] && [ -s {spare} ]; '
        f'then set -- "$@" --storage-uuid-from-cert {spare}; fi && '
        if q.tls.enabled
        else ""
    )
    return (
        "ID=$(( ${POD_NAME##*-} + 1 )) && set -- && "
        f'if [ "$(cat {b}/{BOOTSTRAP_KEY} 2>/dev/null)" = true ]; '
        f"then set -- --no-initial-controllers; else {initial}: ; fi && {after}"
        # Only an unclean recovery needs the volume formatted before the node starts (it reads
        # meta.properties); otherwise the node's own process formats it (start_command), which
        # saves the pod an interpreter start on a replaced disk's path.
        f"if [ -s {b}/{UNCLEAN_KEY} ]; then "
        f"kraftkeeper format --dir {d} --cluster-id {q.cluster_id} "
        '--node-id "$ID" --ignore-formatted "$@" || exit 1; '
        f"read -r RID RTOKEN RUUIDS < {b}/{UNCLEAN_KEY}; "
        "MINE=$(sed -n -e 's/^directory[.]id=//p' -e 's/^storage[.]id=//p' "
        f"{d}/meta.properties | head -n 1); "
        # The token names a file: only what the operator writes (hex) is accepted.
        'if [ "$RID" != "$ID" ] || [ -z "$RTOKEN" ] || [ -z "$MINE" ] || '
        '[ -n "$(printf %s "$RTOKEN" | tr -d 0-9a-f)" ]; then :; '
        f"elif [ -e {done} ]; then "
        'echo "unclean recovery $RTOKEN was done on this volume already; starting normally"; '
        'else case " $RUUIDS " in *" $MINE "*) '
        'echo "UNCLEAN RECOVERY $RTOKEN: replica $ID ($MINE) becomes the sole voter;'
        ' records committed only on the lost replicas are lost" && '
        f"kraftkeeper quorum recover-unclean --dir {d} || exit 1; "
        f"date -u +%Y-%m-%dT%H:%M:%SZ > {done}.tmp && mv {done}.tmp {done} && sync || exit 1 ;; "
        '*) echo "unclean recovery $RTOKEN names replica $ID with storage UUID(s) $RUUIDS,'
        ' but this volume is $MINE: not recovering" ;; '
        "esac; fi; fi"
    )


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _node_container(
    q: QuorumSpec, bootstrap_voters: int, env: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    """The quorum node container of the StatefulSet's pod template."""
    # The volume is prepared (format_command) by the node container's own shell right before the
    # node starts, not by an init container: every container of a pod costs the kubelet a create,
    # a start and up to a PLEG relist (1 s) to see it end, which a replaced disk's recovery waits
    # for. A failed preparation exits non-zero before the node starts, as the init container did.
    check = f"{check_command()}\n" if q.tls.enabled else ""
    spare = f"{spare_args_command()}\n" if q.tls.enabled else ""
    start = (
        f'echo "kraftkeeper: preparing $POD_NAME"; {check}{format_command(q)}\n{spare}'
        # `start --format-*` = `format --ignore-formatted "$@"` in the node's own process: a
        # volume of another cluster or node fails the start before any port opens.
        f'exec kraftkeeper start --format-cluster-id {q.cluster_id} --format-node-id "$ID" "$@" '
        f"--dir {DATA_DIR} --listen 0.0.0.0:{q.port} {start_args(q.tls)} "
        f'--advertise "$(POD_NAME).{q.headless}.{q.namespace}.svc:{q.port}" '
        f'--voters "{q.voters_arg(bootstrap_voters)}"'
    )
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
        "securityContext": _container_security(),
        # A node that refuses to start (its certificate names another disk, CORRUPT_LOG) says why
        # in its last lines, which the operator reads from the pod's status.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if q.resources:
        container["resources"] = dict(q.resources)
    return container


def statefulset(
    q: QuorumSpec, owner: Mapping[str, Any], *, replicas: int, bootstrap_voters: int
) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "HOME", "value": "/tmp"},  # the root filesystem is read-only
        # No system CA store in the node: it trusts its cluster CA only (given by file), and
        # aiohttp builds two default TLS contexts from the store when it is imported, 0.2-0.4 s of
        # every start (a replaced disk waits for it) parsing ~150 public CA certificates.
        {"name": "SSL_CERT_FILE", "value": "/dev/null"},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "data", "mountPath": DATA_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "bootstrap", "mountPath": BOOTSTRAP_MOUNT, "readOnly": True},
    ]
    container = _node_container(q, bootstrap_voters, env, mounts)
    pod_spec: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "fsGroup": IMAGE_UID,  # a fresh volume is root-owned: the kubelet hands it to this group
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            # Not optional: a pod without the flag must not start (it could format initially).
            {"name": "bootstrap", "configMap": {"name": q.bootstrap_configmap}},
            {"name": "tmp", "emptyDir": {}},
        ],
        "terminationGracePeriodSeconds": 30,
        # A node never calls the Kubernetes API: no token volume to project at the start of a
        # replaced disk's pod and to tear down at the end of the old one (and no credential).
        "automountServiceAccountToken": False,
    }
    apply_to_pod(pod_spec, q.name, q.tls)
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

"""Every Kubernetes API call the operator makes, in one place (handlers.py and quorums.py decide,
this module only talks to the API server).

:class:`KubeApi` wraps one ``kubernetes_asyncio`` client: server-side apply of owned objects,
reading and scaling the StatefulSet, writing ``status``, deleting the owned objects and pods, and
reading the ``NAME-bootstrap`` ConfigMap. :class:`ConfigMapRequestStore` keeps an unclean-recovery
request in that ConfigMap (unclean.py's ``RequestStore``), and :class:`KubeEventSink` turns
recovery events into Kubernetes Events on the KRaftQuorum.

Kubernetes Events take one path: :meth:`KubeApi.post_event` (or :meth:`KubeApi.notify`, which
logs a refusal instead of raising), awaited by the caller, never kopf's ``kopf.info`` /
``kopf.warn`` queue, whose Events an operator that stops before the queue drains loses.

Error policy, on purpose (:func:`api_error`): the API server refusing an object as invalid
(HTTP 400/422, or 500 "failed to create typed patch object" for a field the schema does not know)
is the spec's fault: ``kopf.PermanentError``, retrying cannot help. Anything else (unreachable,
409 conflict, 5xx) is ``kopf.TemporaryError``: kopf retries it after a delay. So is a call the
API server does not answer within :data:`API_CALL_TIMEOUT_S`: ``kubernetes_asyncio`` has no timeout
of its own, and one request left waiting would hold a handler, or the recovery daemon's pass, for
ever; bounded, it is a failed pass that the next one retries.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf
from kraftkeeper_reports.events import RecoveryEvent
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.timefmt import rfc3339

from ..telemetry import step_notice
from .manifests import GROUP, PLURAL, VERSION, QuorumSpec, owner_reference_of, unclean_configmap
from .ownership import check_owned, owned_by
from .unclean import UNCLEAN_DETAIL_KEY, UNCLEAN_KEY, UncleanRequest, request_from_configmap

log = logging.getLogger("kraftkeeper.operator")

FIELD_MANAGER = "kraftkeeper-operator"
# Owns only data.bootstrapped of the NAME-bootstrap ConfigMap: the spec reconcile (FIELD_MANAGER)
# applies that object without the key, and server-side apply removes a field only when the manager
# that owns it applies without it, so no re-apply can ever unset the flag.
BOOTSTRAP_FIELD_MANAGER = "kraftkeeper-operator-bootstrap"
# Owns only the unclean-recovery keys of the same ConfigMap, for the same reason.
UNCLEAN_FIELD_MANAGER = "kraftkeeper-operator-unclean"

_RETRY_DELAY_S = 5
# The bound of every API call (module docstring); read at call time, so tests can shorten it.
API_CALL_TIMEOUT_S = 30.0


def api_error(what: str, e: ApiException) -> kopf.PermanentError | kopf.TemporaryError:
    """The kopf error for an API server answer (module docstring: permanent vs temporary)."""
    body = e.body.decode() if isinstance(e.body, bytes) else str(e.body)
    try:
        message = json.loads(body).get("message", body)
    except (ValueError, AttributeError):
        message = body
    if e.status in (400, 422) or (e.status == 500 and "typed patch" in str(message)):
        return kopf.PermanentError(f"{what} refused by the API server: {message}")
    return kopf.TemporaryError(f"{what}: HTTP {e.status} {message}", delay=_RETRY_DELAY_S)


async def _bounded(what: str, call: Awaitable[Any]) -> Any:
    """``call`` within :data:`API_CALL_TIMEOUT_S`; past it a ``kopf.TemporaryError`` naming ``what``."""
    try:
        return await asyncio.wait_for(call, API_CALL_TIMEOUT_S)
    except TimeoutError:
        raise kopf.TemporaryError(
            f"{what}: no answer from the API server within {API_CALL_TIMEOUT_S:g}s", delay=_RETRY_DELAY_S
        ) from None


async def _call(what: str, call: Awaitable[Any], *, missing_ok: bool = False) -> Any:
    """Await one API call (bounded), mapping failures to kopf errors; a 404 gives None if
    ``missing_ok``."""
    try:
        return await _bounded(what, call)
    except ApiException as e:
        if missing_ok and e.status == 404:
            return None
        raise api_error(what, e) from e
    except OSError as e:
        raise kopf.TemporaryError(f"{what}: API unreachable: {e}", delay=_RETRY_DELAY_S) from e


class KubeApi:
    """The operator's Kubernetes API client (one per operator process)."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self.apps = k8s.AppsV1Api(api)
        self.core = k8s.CoreV1Api(api)
        self.policy = k8s.PolicyV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.networking = k8s.NetworkingV1Api(api)

    @classmethod
    async def connect(cls) -> KubeApi:
        """In-cluster service account if there is one, else the kubeconfig (``KUBECONFIG``)."""
        try:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            await k8s_config.load_kube_config()
        return cls(k8s.ApiClient())

    async def close(self) -> None:
        await self.api.close()

    async def apply(self, obj: dict[str, Any], field_manager: str = FIELD_MANAGER) -> None:
        """Server-side apply (create or update) one owned object."""
        kind, name, ns = obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"]
        kw: dict[str, Any] = {
            "field_manager": field_manager,
            "force": True,
            "_content_type": "application/apply-patch+yaml",
        }
        patchers: dict[str, Callable[..., Awaitable[Any]]] = {
            "StatefulSet": self.apps.patch_namespaced_stateful_set,
            "Service": self.core.patch_namespaced_service,
            "PodDisruptionBudget": self.policy.patch_namespaced_pod_disruption_budget,
            "ConfigMap": self.core.patch_namespaced_config_map,
            "Secret": self.core.patch_namespaced_secret,
            "NetworkPolicy": self.networking.patch_namespaced_network_policy,
        }
        await self._check_owned(obj)
        if kind == "Certificate":  # cert-manager's (kubetls.py)
            group, version = obj["apiVersion"].split("/")
            call = self.custom.patch_namespaced_custom_object(
                group, version, ns, "certificates", name, obj, **kw
            )
            await _call(f"{kind} {ns}/{name}", call)
            return
        if kind not in patchers:
            raise ValueError(f"apply: unsupported kind {kind}")
        await _call(f"{kind} {ns}/{name}", patchers[kind](name, ns, obj, **kw))

    async def read_meta(self, kind: str, ns: str, name: str, api_version: str = "") -> dict[str, Any] | None:
        """The ``metadata`` of one object (None if there is none)."""
        readers: dict[str, Callable[..., Awaitable[Any]]] = {
            "StatefulSet": self.apps.read_namespaced_stateful_set,
            "Service": self.core.read_namespaced_service,
            "PodDisruptionBudget": self.policy.read_namespaced_pod_disruption_budget,
            "ConfigMap": self.core.read_namespaced_config_map,
            "Secret": self.core.read_namespaced_secret,
            "NetworkPolicy": self.networking.read_namespaced_network_policy,
            "PersistentVolumeClaim": self.core.read_namespaced_persistent_volume_claim,
        }
        if kind == "Certificate":
            group, version = (api_version or "cert-manager.io/v1").split("/")
            call = self.custom.get_namespaced_custom_object(group, version, ns, "certificates", name)
        else:
            call = readers[kind](name, ns)
        got = await _call(f"{kind} {ns}/{name}", call, missing_ok=True)
        if got is None:
            return None
        data = got if isinstance(got, dict) else self.api.sanitize_for_serialization(got)
        meta = data.get("metadata") or {}
        return dict(meta)

    async def _check_owned(self, obj: dict[str, Any]) -> None:
        """Never patch an object another resource owns, or one we did not make (ownership.py)."""
        kind, meta = obj["kind"], obj["metadata"]
        existing = await self.read_meta(kind, meta["namespace"], meta["name"], obj.get("apiVersion", ""))
        check_owned(f"{kind} {meta['namespace']}/{meta['name']}", existing, meta)

    async def list_quorums(self, ns: str) -> list[dict[str, Any]]:
        """The KRaftQuorums of namespace ``ns`` (the API's JSON)."""
        call = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        got = await _call(f"listing KRaftQuorums in {ns}", call)
        return [dict(i) for i in (got or {}).get("items") or []]

    async def read_statefulset(self, ns: str, name: str) -> dict[str, Any] | None:
        obj = await _call(
            f"StatefulSet {ns}/{name}", self.apps.read_namespaced_stateful_set(name, ns), missing_ok=True
        )
        if obj is None:
            return None
        data: dict[str, Any] = self.api.sanitize_for_serialization(obj)
        return data

    async def scale_statefulset(self, ns: str, name: str, replicas: int) -> None:
        kw: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
        body = {"spec": {"replicas": replicas}}
        await _call(
            f"scaling StatefulSet {ns}/{name}", self.apps.patch_namespaced_stateful_set(name, ns, body, **kw)
        )

    async def patch_status(self, ns: str, name: str, status: dict[str, Any]) -> None:
        kw: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
        call = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, PLURAL, name, {"status": status}, **kw
        )
        await _call(f"status of KRaftQuorum {ns}/{name}", call)

    async def secret_data(self, ns: str, name: str) -> dict[str, str] | None:
        """A Secret's ``data`` (base64 values), None if it does not exist."""
        sec = await _call(f"Secret {ns}/{name}", self.core.read_namespaced_secret(name, ns), missing_ok=True)
        return None if sec is None else dict(sec.data or {})

    async def create_secret(self, obj: dict[str, Any]) -> bool:
        """Create a Secret only if it does not exist (False then): the CA is never replaced."""
        ns = obj["metadata"]["namespace"]
        try:
            body: Any = obj  # the client takes plain dicts as well as its models
            call = self.core.create_namespaced_secret(ns, body, field_manager=FIELD_MANAGER)
            await _bounded(f"creating Secret {ns}/{obj['metadata']['name']}", call)
        except ApiException as e:
            if e.status == 409:
                return False
            raise api_error(f"Secret {ns}/{obj['metadata']['name']}", e) from e
        except OSError as e:
            raise kopf.TemporaryError(f"creating a Secret: API unreachable: {e}", delay=_RETRY_DELAY_S) from e
        return True

    async def delete_secret(self, ns: str, name: str) -> None:
        """Delete a Secret by name (none: nothing to do)."""
        call = self.core.delete_namespaced_secret(name, ns)
        await _call(f"deleting Secret {ns}/{name}", call, missing_ok=True)

    async def configmap_data(self, ns: str, name: str) -> dict[str, str] | None:
        cm = await _call(
            f"ConfigMap {ns}/{name}", self.core.read_namespaced_config_map(name, ns), missing_ok=True
        )
        return None if cm is None else dict(cm.data or {})

    async def pod_uid(self, ns: str, name: str) -> str | None:
        """The pod's ``metadata.uid`` (a re-created pod of the same name has another), None if
        there is no pod."""
        pod = await _call(f"Pod {ns}/{name}", self.core.read_namespaced_pod(name, ns), missing_ok=True)
        uid = None if pod is None or pod.metadata is None else pod.metadata.uid
        return uid if isinstance(uid, str) else None

    async def pod_start_time(self, ns: str, name: str) -> dt.datetime | None:
        """When the pod's containers were started (``status.startTime``), None if no pod."""
        pod = await _call(f"Pod {ns}/{name}", self.core.read_namespaced_pod(name, ns), missing_ok=True)
        started = None if pod is None or pod.status is None else pod.status.start_time
        return started if isinstance(started, dt.datetime) else None

    async def list_pods(self, ns: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """The pods matching a label selector, as the API's JSON (camelCase keys)."""
        sel = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        got = await _call(
            f"listing Pods in {ns} ({sel})", self.core.list_namespaced_pod(ns, label_selector=sel)
        )
        data: dict[str, Any] = self.api.sanitize_for_serialization(got)
        return list(data.get("items") or [])

    async def delete_pod(self, ns: str, name: str) -> None:
        """Delete a pod (no pod: nothing to do; its StatefulSet creates it again)."""
        await _call(f"deleting Pod {ns}/{name}", self.core.delete_namespaced_pod(name, ns), missing_ok=True)

    async def delete_claim(self, ns: str, name: str, selector: Mapping[str, str]) -> bool:
        """Delete PVC ``name`` if it carries ``selector``'s labels (a claim of the quorum's
        StatefulSet, whose template sets them); False if it is gone or not the quorum's."""
        meta = await self.read_meta("PersistentVolumeClaim", ns, name)
        labels = (meta or {}).get("labels") or {}
        if meta is None or any(labels.get(k) != v for k, v in selector.items()):
            return False
        await _call(
            f"deleting PersistentVolumeClaim {ns}/{name}",
            self.core.delete_namespaced_persistent_volume_claim(name, ns),
            missing_ok=True,
        )
        return True

    async def delete_owned(self, ns: str, name: str, uid: str) -> None:
        """Delete the objects KRaftQuorum ``name`` (``uid``) owns, explicitly (no reliance on a
        garbage collector); an object of such a name that it does not own is left alone
        (ownership.py). PVCs are retained (manifests.py, PVC policy)."""
        pdb = self.policy.delete_namespaced_pod_disruption_budget
        for kind, obj_name, call in (
            ("StatefulSet", name, lambda n: self.apps.delete_namespaced_stateful_set(n, ns)),
            ("PodDisruptionBudget", name, lambda n: pdb(n, ns)),
            ("Service", name, lambda n: self.core.delete_namespaced_service(n, ns)),
            ("Service", f"{name}-headless", lambda n: self.core.delete_namespaced_service(n, ns)),
            ("ConfigMap", f"{name}-bootstrap", lambda n: self.core.delete_namespaced_config_map(n, ns)),
            ("NetworkPolicy", name, lambda n: self.networking.delete_namespaced_network_policy(n, ns)),
            ("Secret", f"{name}-tls", lambda n: self.core.delete_namespaced_secret(n, ns)),
            ("Secret", f"{name}-client", lambda n: self.core.delete_namespaced_secret(n, ns)),
            ("Secret", f"{name}-ca", lambda n: self.core.delete_namespaced_secret(n, ns)),
        ):
            if not owned_by(await self.read_meta(kind, ns, obj_name), uid):
                continue
            await _call(f"deleting {kind} {ns}/{obj_name}", call(obj_name), missing_ok=True)

    async def post_event(
        self, obj: QuorumSpec | Mapping[str, Any], *, warning: bool, reason: str, message: str
    ) -> None:
        """Create one Event on a KRaftQuorum (``obj``: its parsed spec or its body) and return
        once the API server has it (core/v1, as kubectl describe shows them). The operator's one
        Event path: awaited, so an Event said before a step is stored before that step, and an
        operator that stops right after cannot lose it (kopf's own poster queues Events and
        posts them later, so a stop loses what is queued). Raises the kopf error of a refusal."""
        target = event_target(obj)
        now = rfc3339()
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{target['name']}.", "namespace": target["namespace"]},
            "involvedObject": target,
            "type": "Warning" if warning else "Normal",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        ns = target["namespace"]
        await _call(f"Event {reason} on {ns}/{target['name']}", self.core.create_namespaced_event(ns, body))

    async def notify(
        self, obj: QuorumSpec | Mapping[str, Any], *, warning: bool, reason: str, message: str
    ) -> bool:
        """:meth:`post_event` for a notice whose loss must not stop the work it reports: a
        refusal is logged and dropped (False). The record is the status and the event log."""
        try:
            await self.post_event(obj, warning=warning, reason=reason, message=message)
        except (kopf.TemporaryError, kopf.PermanentError) as e:
            log.warning("Event %s not posted: %s", reason, e)
            return False
        return True

    async def delete_certificates(self, ns: str, names: list[str], uid: str) -> None:
        """cert-manager Certificates owned by ``uid`` (their Secrets are cert-manager's: owned by
        the Certificate only when cert-manager is told to); 404, also for a missing CRD, is
        nothing to do."""
        for n in names:
            try:
                meta = await self.read_meta("Certificate", ns, n)
            except kopf.PermanentError:  # no Certificate kind at all (cert-manager not installed)
                continue
            if not owned_by(meta, uid):
                continue
            call = self.custom.delete_namespaced_custom_object("cert-manager.io", "v1", ns, "certificates", n)
            await _call(f"deleting Certificate {ns}/{n}", call, missing_ok=True)


class ConfigMapRequestStore:
    """The unclean-recovery request in the ``NAME-bootstrap`` ConfigMap; restart = delete the pod
    (the StatefulSet re-creates it, and its node container reads the request before the node starts)."""

    def __init__(self, kube: KubeApi, q: QuorumSpec) -> None:
        self.kube = kube
        self.q = q
        self.where = f"{UNCLEAN_DETAIL_KEY} in ConfigMap {q.bootstrap_configmap}"

    async def load(self) -> UncleanRequest | None:
        return request_from_configmap(
            await self.kube.configmap_data(self.q.namespace, self.q.bootstrap_configmap)
        )

    async def save(self, request: UncleanRequest) -> None:
        data = {UNCLEAN_KEY: request.pod_line(), UNCLEAN_DETAIL_KEY: request.to_json()}
        await self.kube.apply(
            unclean_configmap(self.q, owner_reference_of(self.q), data), UNCLEAN_FIELD_MANAGER
        )

    async def restart(self, ordinal: int) -> None:
        pod = f"{self.q.name}-{ordinal}"
        await self.kube.delete_pod(self.q.namespace, pod)
        log.warning("%s: deleted pod %s to run the unclean recovery", self.q.cluster, pod)


def event_target(obj: QuorumSpec | Mapping[str, Any]) -> dict[str, Any]:
    """The ``involvedObject`` of an Event on a KRaftQuorum, from its parsed spec or its body."""
    if isinstance(obj, QuorumSpec):
        name, ns, uid = obj.name, obj.namespace, obj.uid
    else:
        meta = obj.get("metadata") or {}
        name, ns, uid = str(meta.get("name")), str(meta.get("namespace")), str(meta.get("uid") or "")
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KRaftQuorum",
        "name": name,
        "namespace": ns,
        "uid": uid,
    }


class KubeEventSink:
    """Recovery events as Kubernetes Events on the KRaftQuorum (failures and unclean recoveries
    as Warnings, telemetry.py ``step_notice``): ``emit`` keeps them and :meth:`flush` posts them
    through :meth:`KubeApi.notify`, which the controller awaits before the next step and before a
    failpoint, so a step's Event is stored before the operator can stop after it."""

    def __init__(self, kube: KubeApi, q: QuorumSpec) -> None:
        self.kube = kube
        self.q = q
        self.pending: list[tuple[bool, str, str]] = []  # (warning, reason, message)

    def emit(self, event: RecoveryEvent) -> None:
        self.pending.append(step_notice(event))

    async def flush(self) -> None:
        while self.pending:
            warning, reason, message = self.pending.pop(0)
            await self.kube.notify(self.q, warning=warning, reason=reason, message=message)

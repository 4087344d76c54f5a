"""kopf handlers for KRaftQuorum: thin glue between the Kubernetes API and the domain code.

* create / update (spec) / resume -> validate the spec (``manifests.parse_spec``), server-side
  apply the ``NAME-bootstrap`` ConfigMap (without its key), the StatefulSet, the two Services and
  the PodDisruptionBudget (owned by the resource), and (re)configure the per-resource
  :class:`RecoveryController`.
* a daemon per resource -> every ``KRAFTKEEPER_RECONCILE_INTERVAL`` seconds (default 2) runs one
  controller pass, writes ``status`` when it changed, sets ``bootstrapped: "true"`` in the
  ``NAME-bootstrap`` ConfigMap once every voter has a storage UUID (never unset; from then on a
  fresh volume is formatted with ``--no-initial-controllers``, see manifests.py), and finishes
  scale-downs: the StatefulSet shrinks only after the quorum's voter set already equals the new
  ids (reassign first, KIP-642).
* the same daemon, while the quorum is lost -> KIP-704 style unclean recovery when the resource
  allows it (unclean.py): the request goes into the ``NAME-bootstrap`` ConfigMap (field manager
  ``kraftkeeper-operator-unclean``) and the survivor's pod is deleted so that its init container
  runs ``kraftkeeper quorum recover-unclean`` once.
* delete -> the finalizer (``kraftkeeper.io/cleanup``, added by kopf because a delete handler
  exists) stops the daemon and deletes the owned objects explicitly, without relying on a garbage
  collector; PVCs are retained (see manifests.py for the PVC policy).

Error policy, on purpose:
* invalid spec -> ``kopf.PermanentError`` (retrying cannot help) after writing ``status.phase=Failed``
  and an ``Available=False, reason=InvalidSpec`` condition naming the field;
* the API server refusing an object as invalid (HTTP 400/422) -> PermanentError the same way;
* the API server unreachable / 409 / 5xx -> ``kopf.TemporaryError`` (retried with a delay);
* the quorum unreachable -> not an error at all: a status (QuorumLost), retried by the daemon.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from .controller import RecoveryController
from .manifests import (
    BOOTSTRAP_ANNOTATION,
    BOOTSTRAP_KEY,
    GROUP,
    PLURAL,
    VERSION,
    QuorumSpec,
    SpecError,
    bootstrap_configmap,
    client_service,
    endpoints,
    headless_service,
    owner_reference,
    owner_reference_of,
    parse_overrides,
    parse_spec,
    pod_disruption_budget,
    statefulset,
    unclean_configmap,
)
from .recovery import QuorumView, Recovery
from .telemetry import CallbackSink, EventLogSink, EventSink, FanOut, OperatorMetrics, StdoutEventSink
from .unclean import (
    STATUS_PREFIX,
    UNCLEAN_DETAIL_KEY,
    UNCLEAN_KEY,
    UncleanCoordinator,
    UncleanRequest,
    http_probe,
    request_from_configmap,
)

log = logging.getLogger("kraftkeeper.operator")
FIELD_MANAGER = "kraftkeeper-operator"
# Owns only data.bootstrapped of the NAME-bootstrap ConfigMap: the spec reconcile (FIELD_MANAGER)
# applies that object without the key, and server-side apply removes a field only when the manager
# that owns it applies without it, so no re-apply can ever unset the flag.
BOOTSTRAP_FIELD_MANAGER = "kraftkeeper-operator-bootstrap"
# Owns only the unclean-recovery keys of the same ConfigMap, for the same reason.
UNCLEAN_FIELD_MANAGER = "kraftkeeper-operator-unclean"


@dataclass
class Managed:
    """Per-resource state kept in the operator's memory (the truth is the quorum + the API)."""

    spec: QuorumSpec
    controller: RecoveryController
    unclean: UncleanCoordinator
    replicas: int
    endpoints: list[str]
    ever_available: bool = False
    bootstrap_flagged: bool = False  # data.bootstrapped written (re-written once after a restart)
    last_status: dict[str, Any] = field(default_factory=dict)


class OperatorState:
    def __init__(self) -> None:
        self.managed: dict[str, Managed] = {}
        self.metrics = OperatorMetrics()
        self.api: k8s.ApiClient | None = None
        self.overrides: dict[str, str] = {}
        self.interval = float(os.environ.get("KRAFTKEEPER_RECONCILE_INTERVAL", "2"))
        self.quorum_timeout = float(os.environ.get("KRAFTKEEPER_QUORUM_TIMEOUT", "3"))
        self.metrics_runner: Any = None


STATE = OperatorState()


# ---------------------------------------------------------------------------------------------
# API helpers


async def api_client() -> k8s.ApiClient:
    if STATE.api is None:
        try:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            await k8s_config.load_kube_config()
        STATE.api = k8s.ApiClient()
    return STATE.api


def _api_error(what: str, e: ApiException) -> Exception:
    body = e.body.decode() if isinstance(e.body, bytes) else str(e.body)
    try:
        message = json.loads(body).get("message", body)
    except (ValueError, AttributeError):
        message = body
    # Server-side apply answers 500 "failed to create typed patch object" for a field the
    # schema does not know (e.g. in the free-form spec.scheduling.affinity): also the spec's fault.
    if e.status in (400, 422) or (e.status == 500 and "typed patch" in str(message)):
        return kopf.PermanentError(f"{what} refused by the API server: {message}")
    return kopf.TemporaryError(f"{what}: HTTP {e.status} {message}", delay=5)


async def apply(obj: dict[str, Any], field_manager: str = FIELD_MANAGER) -> None:
    """Server-side apply (create or update) one owned object."""
    api = await api_client()
    kind, name, ns = obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"]
    kw: dict[str, Any] = {
        "field_manager": field_manager,
        "force": True,
        "_content_type": "application/apply-patch+yaml",
    }
    try:
        if kind == "StatefulSet":
            await k8s.AppsV1Api(api).patch_namespaced_stateful_set(name, ns, obj, **kw)
        elif kind == "Service":
            await k8s.CoreV1Api(api).patch_namespaced_service(name, ns, obj, **kw)
        elif kind == "PodDisruptionBudget":
            await k8s.PolicyV1Api(api).patch_namespaced_pod_disruption_budget(name, ns, obj, **kw)
        elif kind == "ConfigMap":
            await k8s.CoreV1Api(api).patch_namespaced_config_map(name, ns, obj, **kw)
        else:
            raise ValueError(f"apply: unsupported kind {kind}")
    except ApiException as e:
        raise _api_error(f"{kind} {ns}/{name}", e) from e
    except OSError as e:
        raise kopf.TemporaryError(f"{kind} {ns}/{name}: API unreachable: {e}", delay=5) from e


async def read_statefulset(ns: str, name: str) -> dict[str, Any] | None:
    api = await api_client()
    try:
        obj = await k8s.AppsV1Api(api).read_namespaced_stateful_set(name, ns)
        data: dict[str, Any] = api.sanitize_for_serialization(obj)
        return data
    except ApiException as e:
        if e.status == 404:
            return None
        raise _api_error(f"StatefulSet {ns}/{name}", e) from e


async def scale_statefulset(ns: str, name: str, replicas: int) -> None:
    api = await api_client()
    kw: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
    await k8s.AppsV1Api(api).patch_namespaced_stateful_set(name, ns, {"spec": {"replicas": replicas}}, **kw)


async def patch_status(ns: str, name: str, status: dict[str, Any]) -> None:
    api = await api_client()
    kw: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
    await k8s.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, name, {"status": status}, **kw
    )


# ---------------------------------------------------------------------------------------------
# Sinks and controllers


def _event_sink(q: QuorumSpec, body: Mapping[str, Any]) -> EventSink:
    ref: Any = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KRaftQuorum",
        "metadata": {"name": q.name, "namespace": q.namespace, "uid": q.uid},
    }

    def k8s_event(type_: str, message: str, detail: dict[str, Any]) -> None:
        reason = "".join(p.capitalize() for p in type_.split("_"))  # recovery_failed -> RecoveryFailed
        if type_ == "recovery_failed":
            kopf.warn(ref, reason=reason, message=f"{message}: {detail.get('reason', '')}")
        elif type_ == "unclean_recovery":
            text = f"UNCLEAN RECOVERY {message}: {detail.get('reason', '')}; {detail.get('warning', '')}"
            kopf.warn(ref, reason=reason, message=text)
        else:
            kopf.info(ref, reason=reason, message=message)

    log_sink: EventSink
    if q.event_log == "stdout":
        log_sink = StdoutEventSink(q.cluster)
    else:
        log_sink = EventLogSink(q.event_log, q.cluster)
    return FanOut(log_sink, CallbackSink(k8s_event))


class ConfigMapRequestStore:
    """The unclean-recovery request in the ``NAME-bootstrap`` ConfigMap; restart = delete the pod
    (the StatefulSet re-creates it, and its init container reads the request)."""

    def __init__(self, q: QuorumSpec) -> None:
        self.q = q

    async def load(self) -> UncleanRequest | None:
        api = await api_client()
        try:
            core = k8s.CoreV1Api(api)
            cm = await core.read_namespaced_config_map(self.q.bootstrap_configmap, self.q.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise _api_error(f"ConfigMap {self.q.namespace}/{self.q.bootstrap_configmap}", e) from e
        return request_from_configmap(cm.data)

    async def save(self, request: UncleanRequest) -> None:
        data = {UNCLEAN_KEY: request.pod_line(), UNCLEAN_DETAIL_KEY: request.to_json()}
        await apply(unclean_configmap(self.q, owner_reference_of(self.q), data), UNCLEAN_FIELD_MANAGER)

    async def restart(self, ordinal: int) -> None:
        api = await api_client()
        pod = f"{self.q.name}-{ordinal}"
        try:
            await k8s.CoreV1Api(api).delete_namespaced_pod(pod, self.q.namespace)
        except ApiException as e:
            if e.status != 404:  # no pod: the StatefulSet creates it, with the request mounted
                raise _api_error(f"deleting Pod {self.q.namespace}/{pod}", e) from e
        log.warning("%s: deleted pod %s to run the unclean recovery", self.q.cluster, pod)


def _known_voters(status: Mapping[str, Any]) -> list[tuple[int, str]]:
    out = []
    for v in status.get("voters") or []:
        try:
            if v.get("uuid"):
                out.append((int(v["id"]), str(v["uuid"])))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


async def configure(q: QuorumSpec, body: Mapping[str, Any], replicas: int) -> Managed:
    """Create or update the in-memory controller of one resource."""
    from quorum.client import QuorumClient

    key = q.cluster
    eps = endpoints(q, replicas, STATE.overrides)
    m = STATE.managed.get(key)
    desired = list(range(1, q.voters + 1))
    if m is None:
        records = []
        for d in (body.get("status") or {}).get("recoveries") or []:
            if str(d.get("recoveryId", "")).startswith(STATUS_PREFIX):
                continue  # an unclean recovery: its record lives in the ConfigMap
            try:
                records.append(Recovery.from_crd_status(d))
            except (KeyError, ValueError, TypeError) as e:
                log.warning("%s: ignoring unreadable status.recoveries item %r: %s", key, d, e)
        ctl = RecoveryController(
            QuorumClient(eps, timeout=STATE.quorum_timeout),
            q.policy,
            cluster=key,
            sink=_event_sink(q, body),
            metrics=STATE.metrics,
            records=records,
            desired_ids=desired,
        )
        # The voter set survives an operator restart in status (published while no leader answers).
        ctl.known_voters = _known_voters(body.get("status") or {})
        unclean = UncleanCoordinator(
            ConfigMapRequestStore(q),
            ctl.sink,
            cluster=key,
            probe=lambda k, ep: http_probe(k, ep, STATE.quorum_timeout),
            metrics=STATE.metrics,
        )
        m = Managed(q, ctl, unclean, replicas, eps, last_status=dict(body.get("status") or {}))
        STATE.managed[key] = m
        return m
    old_log = m.spec.event_log
    m.spec, m.replicas = q, replicas
    m.controller.set_policy(q.policy)
    m.controller.desired_ids = desired
    if eps != m.endpoints:
        old = m.controller.api
        m.controller.api = QuorumClient(eps, timeout=STATE.quorum_timeout)
        m.endpoints = eps
        close = getattr(old, "close", None)
        if close is not None:
            await close()
    if q.event_log != old_log:
        m.controller.sink = m.unclean.sink = _event_sink(q, body)
    m.unclean.store = ConfigMapRequestStore(q)
    return m


# ---------------------------------------------------------------------------------------------
# Handlers


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = "kraftkeeper.io/cleanup"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 120
    settings.networking.request_timeout = 60
    STATE.overrides = parse_overrides(os.environ.get("KRAFTKEEPER_ENDPOINT_OVERRIDES"))
    if STATE.overrides:
        log.warning("test hook KRAFTKEEPER_ENDPOINT_OVERRIDES in use: %s", STATE.overrides)
    await api_client()
    port = int(os.environ.get("KRAFTKEEPER_METRICS_PORT", "9090") or 0)
    if port > 0:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(
                body=generate_latest(STATE.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
            )

        app = web.Application()
        app.add_routes([web.get("/metrics", metrics)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, os.environ.get("KRAFTKEEPER_METRICS_HOST", "0.0.0.0"), port).start()
        STATE.metrics_runner = runner


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    for m in STATE.managed.values():
        close = getattr(m.controller.api, "close", None)
        if close is not None:
            await close()
    STATE.managed.clear()
    if STATE.metrics_runner is not None:
        await STATE.metrics_runner.cleanup()
        STATE.metrics_runner = None
    if STATE.api is not None:
        await STATE.api.close()
        STATE.api = None


def _invalid(patch: kopf.Patch, generation: int, message: str) -> None:
    patch.status["phase"] = "Failed"
    patch.status["observedGeneration"] = generation
    patch.status["conditions"] = [
        {
            "type": "Available",
            "status": "False",
            "reason": "InvalidSpec",
            "message": message,
            "lastTransitionTime": _now(),
        },
    ]


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# backoff: an unexpected error is retried after 5 s rather than kopf's default 60 s.
@kopf.on.resume(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.create(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", backoff=5)
async def reconcile(body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, logger: Any, **_: Any) -> None:
    generation = int(meta.get("generation") or 0)
    try:
        q = parse_spec(body)
    except SpecError as e:
        _invalid(patch, generation, str(e))
        kopf.warn(body, reason="InvalidSpec", message=str(e))
        STATE.managed.pop(f"{meta['namespace']}/{meta['name']}", None)
        raise kopf.PermanentError(f"invalid spec: {e}") from e
    owner = owner_reference(body)
    current = await read_statefulset(q.namespace, q.name)
    if current is None:
        replicas, bootstrap = q.voters, q.voters
    else:
        # Never shrink here: the daemon shrinks after the voters were reassigned (scale-down).
        replicas = max(int(current["spec"].get("replicas") or 0), q.voters)
        ann = (current["metadata"].get("annotations") or {}).get(BOOTSTRAP_ANNOTATION)
        bootstrap = int(ann) if ann and ann.isdigit() else q.voters
    try:
        for obj in (
            bootstrap_configmap(q, owner, bootstrapped=False),  # before the pods that mount it
            headless_service(q, owner),
            client_service(q, owner),
            pod_disruption_budget(q, owner),
            statefulset(q, owner, replicas=replicas, bootstrap_voters=bootstrap),
        ):
            await apply(obj)
    except kopf.PermanentError as e:
        _invalid(patch, generation, str(e))
        kopf.warn(body, reason="InvalidSpec", message=str(e))
        raise
    await configure(q, body, replicas)
    patch.status["observedGeneration"] = generation
    if (body.get("status") or {}).get("phase") in (None, "Failed", "Pending"):
        patch.status["phase"] = "Bootstrapping"
    msg = f"{q.voters} voters desired, StatefulSet at {replicas} replicas"
    kopf.info(body, reason="Reconciled", message=msg)
    logger.info("reconciled %s: %s", q.cluster, msg)


@kopf.on.delete(GROUP, VERSION, PLURAL, backoff=5)
async def delete(meta: kopf.Meta, logger: Any, **_: Any) -> None:
    ns, name = str(meta["namespace"]), str(meta["name"])
    m = STATE.managed.pop(f"{ns}/{name}", None)
    if m is not None:
        close = getattr(m.controller.api, "close", None)
        if close is not None:
            await close()
    STATE.metrics.forget(f"{ns}/{name}")
    api = await api_client()
    apps, core, policy = k8s.AppsV1Api(api), k8s.CoreV1Api(api), k8s.PolicyV1Api(api)
    for what, call in (
        ("StatefulSet", lambda: apps.delete_namespaced_stateful_set(name, ns)),
        ("PodDisruptionBudget", lambda: policy.delete_namespaced_pod_disruption_budget(name, ns)),
        ("Service", lambda: core.delete_namespaced_service(name, ns)),
        ("Service", lambda: core.delete_namespaced_service(f"{name}-headless", ns)),
        ("ConfigMap", lambda: core.delete_namespaced_config_map(f"{name}-bootstrap", ns)),
    ):
        try:
            await call()
        except ApiException as e:
            if e.status != 404:
                raise _api_error(f"deleting {what} of {ns}/{name}", e) from e
    logger.info("deleted the objects of %s/%s; PVCs are retained", ns, name)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10, initial_delay=0.5)
async def recovery_daemon(meta: kopf.Meta, stopped: kopf.DaemonStopped, logger: Any, **_: Any) -> None:
    key = f"{meta['namespace']}/{meta['name']}"
    while not stopped:
        try:
            await _daemon_pass(key)
        except asyncio.CancelledError:
            raise
        except Exception:  # the daemon must survive anything: next pass retries
            logger.exception("recovery pass of %s failed", key)
        await stopped.wait(STATE.interval)


def quorum_bootstrapped(view: QuorumView | None) -> bool:
    """The leader's view shows every voter with a storage UUID: the uuid-less bootstrap voters
    have all been replaced by real (id, UUID) voters (KIP-856), so no fresh directory may ever
    again be formatted as an initial one."""
    return view is not None and bool(view.voters) and all(v.uuid for v in view.voters)


async def _daemon_pass(key: str) -> None:
    m = STATE.managed.get(key)
    if m is None:
        return  # not configured (yet) or invalid spec
    st = await m.controller.reconcile()
    lost = st.condition("QuorumLost").status
    if st.view is not None and not lost:
        m.ever_available = True
    try:
        note = await m.unclean.step(m.controller, lost, m.endpoints)
    except Exception as e:  # the API or a pod unreachable: report, retry on the next pass
        log.exception("%s: unclean recovery step failed", key)
        note = f"unclean recovery step failed: {e}"
    if note:
        st.annotate_lost("UncleanRecoveryRequested" if m.unclean.outstanding() else None, note)
    status = st.to_crd_status(m.last_status, m.spec.generation)
    if m.unclean.request is not None:  # newest last, within the CRD's 20 items
        status["recoveries"] = [*status["recoveries"][-19:], m.unclean.request.to_crd_status()]
    if not m.ever_available:
        status["phase"] = "Bootstrapping"
    q = m.spec
    if not m.bootstrap_flagged and quorum_bootstrapped(st.view):
        # From now on a fresh volume is a replacement disk (or a new replica): formatted with
        # --no-initial-controllers by the pods' init container (manifests.py).
        await apply(bootstrap_configmap(q, owner_reference_of(q), bootstrapped=True), BOOTSTRAP_FIELD_MANAGER)
        m.bootstrap_flagged = True
        log.info(
            "%s: quorum bootstrapped; ConfigMap %s has %s=true", key, q.bootstrap_configmap, BOOTSTRAP_KEY
        )
    # Scale-down: the voters already are 1..N, so the extra pods hold no voter: shrink now.
    if m.replicas > q.voters and st.view is not None and st.view.target_voters is None:
        if sorted({v.id for v in st.view.voters}) == list(range(1, q.voters + 1)):
            await scale_statefulset(q.namespace, q.name, q.voters)
            log.info("%s: voters reassigned to 1..%d; StatefulSet scaled down", key, q.voters)
            await configure(q, {}, q.voters)
    comparable = {k: v for k, v in status.items() if k != "conditions"}
    prev = {k: v for k, v in m.last_status.items() if k in comparable}
    conds = [(c["type"], c["status"], c["reason"], c["message"]) for c in status["conditions"]]
    prev_conds = [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
        for c in m.last_status.get("conditions") or []
    ]
    if comparable != prev or conds != prev_conds:
        await patch_status(q.namespace, q.name, status)
        m.last_status = status

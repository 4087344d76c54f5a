"""Our engine's membership backend: the per-KRaftQuorum work for a quorum the operator runs, between
the resource's lifecycle (lifecycle.py, whose ``EngineMembership`` calls :func:`daemon_pass`) and
the domain code (controller.py, the core, unclean.py), with Kubernetes reached only through kube.py
and the status through crdstatus.py.

:class:`Managed` is what the operator keeps in memory for each resource our engine runs (in the
operator's shared context, context.py): the validated spec, the recovery controller and the
unclean-recovery coordinator. The truth stays in the quorum and the API server; this is a cache
that an operator restart rebuilds from ``status``.

:func:`daemon_pass` is one pass of the engine's backend: one controller pass, the unclean-recovery
step, ``status`` written when it changed (the recovery progress in it before every voter change,
crdstatus.py's progress store), ``bootstrapped: "true"`` set in the ``NAME-bootstrap``
ConfigMap once every voter has a storage UUID (never unset: from then on a fresh volume is
formatted with ``--no-initial-controllers``, manifests.py), and scale-downs finished (the
StatefulSet shrinks only after the quorum's voter set already equals the new ids: reassign first,
KIP-642).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from quorum.client import QuorumClient
from quorum.security.clientconfig import ClientConfig

from ..controller import ControllerStatus, RecoveryController
from ..core.recovery import QuorumView
from ..core.rotation import CertRotator
from ..core.survivor import Probe, probe_log_state
from ..telemetry import flush_sink
from .context import OperatorContext, event_sink
from .crdstatus import Beside, StatusProgressStore, StatusWriter, recoveries_status
from .damage import handle_damaged_logs
from .kube import BOOTSTRAP_FIELD_MANAGER, ConfigMapRequestStore
from .manifests import BOOTSTRAP_KEY, QuorumSpec, bootstrap_configmap, endpoints, owner_reference_of
from .podhealth import STARTING_FOR_S, STARTING_POLL_S, CrashLoops, node_starting
from .quorumtls import QuorumTls
from .spares import spare_pass
from .unclean import UncleanCoordinator, gone_replicas

log = logging.getLogger("kraftkeeper.operator")

# The longest wait between passes of a quorum that never came up (quorums._idle_backoff).
IDLE_BACKOFF_MAX_S = 60.0


class Prober:
    """Asks a replica for its log state (unclean.py's ``ProbeFn``) through the resource's current
    quorum client, which changes when the endpoints do."""

    def __init__(self, client: QuorumClient) -> None:
        self.client = client

    async def __call__(self, ordinal: int, endpoint: str) -> Probe:
        return await probe_log_state(self.client, ordinal, endpoint)


@dataclass
class Managed:
    """One KRaftQuorum as the operator keeps it in memory."""

    spec: QuorumSpec
    prober: Prober  # its client is the quorum's admin API (the controller's QuorumApi) too
    controller: RecoveryController
    unclean: UncleanCoordinator
    replicas: int
    endpoints: list[str]
    ever_available: bool = False
    bootstrap_flagged: bool = False  # data.bootstrapped written (re-written once after a restart)
    status: StatusWriter | None = None  # its status writes (crdstatus.py); set by configure
    client_config: ClientConfig | None = None  # the operator's admin credential (quorumtls.py)
    rotator: CertRotator | None = None  # node certificate renewal, one pod at a time
    crash_loops: CrashLoops | None = None  # the quorum pods' crash-loop episodes (podhealth.py)
    pods: list[dict[str, Any]] = field(default_factory=list)  # as last listed (_check_pods)
    # pod uid stopped on a damaged log -> what was done about it, or why nothing (damage.py)
    damaged_done: dict[str, str] = field(default_factory=dict)
    pods_unreadable: str | None = None  # why the pods could not be listed (logged once)
    pods_running: bool | None = None  # a quorum pod is Running (None: not known)
    idle_backoff: float = 0.0  # seconds to the next pass of a quorum that never came up (0: none)

    def request_status(self) -> dict[str, Any] | None:
        """The unclean request's ``status.recoveries`` item, if there is one."""
        request = self.unclean.request
        return None if request is None else request.to_crd_status()

    def recoveries_status(self) -> list[dict[str, Any]]:
        """``status.recoveries``: the disk replacements, then the unclean request."""
        return recoveries_status(self.controller.book.records, self.request_status())

    def beside(self) -> Beside:
        """What a progress save writes beside the records (crdstatus.py)."""
        return Beside(self.controller.committed_view, self.request_status())


async def configure(
    ctx: OperatorContext,
    q: QuorumSpec,
    body: Mapping[str, Any],
    replicas: int,
    client_config: ClientConfig | None = None,
) -> Managed:
    """Create or update the in-memory controller of one resource; ``client_config`` is the
    operator's admin credential for the quorum (None: plaintext, ``spec.tls.mode: Disabled``)."""
    key = q.cluster
    eps = endpoints(q, replicas, ctx.overrides)
    desired = list(range(1, q.voters + 1))
    m = ctx.managed.get(key)
    if m is None:
        writer = StatusWriter(ctx.kube, q.namespace, q.name, body.get("status") or {})
        progress = StatusProgressStore(writer, key)
        saved = await progress.load()
        client = QuorumClient(eps, timeout=ctx.quorum_timeout, client_config=client_config)
        ctl = RecoveryController(
            client,
            q.policy,
            cluster=key,
            sink=event_sink(q, ctx.kube),
            metrics=ctx.metrics,
            records=saved.records,
            persist=progress.save,
            desired_ids=desired,
        )
        # The voter set survives an operator restart in status (published while no leader answers).
        ctl.known_voters = saved.known.voters
        prober = Prober(client)
        store = ConfigMapRequestStore(ctx.kube, q)
        unclean = UncleanCoordinator(store, ctl.sink, cluster=key, probe=prober, metrics=ctx.metrics)
        m = Managed(q, prober, ctl, unclean, replicas, eps, status=writer)
        progress.beside = m.beside
        m.client_config = client_config
        _set_rotator(ctx, m)
        ctx.managed[key] = m
        return m
    old_log = m.spec.event_log
    m.spec, m.replicas = q, replicas
    m.controller.set_policy(q.policy)
    m.controller.desired_ids = desired
    if eps != m.endpoints or client_config != m.client_config:
        old = m.prober.client
        m.prober.client = QuorumClient(eps, timeout=ctx.quorum_timeout, client_config=client_config)
        m.controller.api, m.endpoints, m.client_config = m.prober.client, eps, client_config
        await old.close()
    _set_rotator(ctx, m)
    if q.event_log != old_log:
        m.controller.sink = m.unclean.sink = event_sink(q, ctx.kube)
    m.unclean.store = ConfigMapRequestStore(ctx.kube, q)
    return m


def _set_rotator(ctx: OperatorContext, m: Managed) -> None:
    """Renewal one pod at a time: Operator mode renews the certificates itself; with
    cert-manager only the restarts are the operator's (quorumtls.py ``due``)."""
    if not m.spec.tls.enabled:
        m.rotator = None
    elif m.rotator is None:
        m.rotator = ctx.quorum_tls(m.spec.cluster).rotator(
            ctx.kube, lambda: (m.spec, m.replicas), owner_reference_of(m.spec)
        )
        m.rotator.max_lag = m.spec.policy.max_lag


def quorum_bootstrapped(view: QuorumView | None) -> bool:
    """The leader's view shows every voter with a storage UUID: the uuid-less bootstrap voters
    have all been replaced by real (id, UUID) voters (KIP-856), so no fresh directory may ever
    again be formatted as an initial one."""
    return view is not None and bool(view.voters) and all(v.uuid for v in view.voters)


async def daemon_pass(ctx: OperatorContext, key: str) -> None:
    """One pass of a resource's daemon (module docstring)."""
    m = ctx.managed.get(key)
    if m is None:
        return  # not configured (yet) or invalid spec
    await _refresh_credential(ctx, m)
    loops = await _check_pods(ctx, m)
    m.controller.book.suspect_ids = loops.replica_ids()
    # With TLS on, only a disk the operator issued the current certificate of is taken as new
    # (recovery.py ``vouched``; none before its TLS objects are known).
    t = ctx.tls.get(m.spec.cluster) if m.spec.tls.enabled else None
    m.controller.book.vouched = None if not m.spec.tls.enabled else t.vouched(m.replicas) if t else {}
    st = await m.controller.reconcile()
    if t is not None and await _spares(ctx, m, t, st.view):
        # A replaced disk's pod took its spare, now its certificate: the recovery may take it.
        m.controller.book.vouched = t.vouched(m.replicas)
        st = await m.controller.reconcile()
    if loops.current:
        st.annotate_degraded("PodCrashLooping", loops.summary())
    lost = st.condition("QuorumLost").status
    if st.view is not None and not lost:
        m.ever_available = True
    try:
        gone = gone_replicas(None if m.pods_unreadable else m.pods, m.spec.name, m.replicas)
        note = await m.unclean.step(m.controller, lost, m.endpoints, gone)
    except Exception as e:  # the API or a pod unreachable: report, retry on the next pass
        log.exception("%s: unclean recovery step failed", key)
        note = f"unclean recovery step failed: {e}"
    await flush_sink(m.controller.sink)  # the unclean step's Events
    if note:
        st.annotate_lost("UncleanRecoveryRequested" if m.unclean.outstanding() else None, note)
    await _flag_bootstrapped(ctx, m, st.view)
    await _bind_disks(ctx, m, st.view)
    try:
        await handle_damaged_logs(ctx.kube, m.spec, m.pods, st.view, m.replicas, m.damaged_done)
    except (kopf.TemporaryError, kopf.PermanentError) as e:  # retried with the next pod change
        log.warning("%s: handling a damaged log: %s", m.spec.cluster, e)
    if m.rotator is not None and not lost:
        await m.rotator.step(st.view)
    await _finish_scale_down(ctx, m, st.view)
    await _write_status(ctx, m, st)
    m.idle_backoff = _idle_backoff(ctx, m, st)


def _idle_backoff(ctx: OperatorContext, m: Managed, st: ControllerStatus) -> float:
    """A quorum that never came up (no leader answers, no voter set was ever known, no pod of it
    Running: pods pending, or none, e.g. a ResourceQuota) is passed at a doubling interval up to
    :data:`IDLE_BACKOFF_MAX_S` instead of every ``interval``: nothing can change without a pod,
    and a pod appearing or changing wakes the daemon at once (podwatch.py). Measured: 97 such
    objects cost 23.8 API requests/s. Not for stand-in endpoints (KRAFTKEEPER_ENDPOINT_OVERRIDES):
    their processes are not pods, so no pod event would wake the daemon."""
    overridden = m.endpoints != endpoints(m.spec, m.replicas, {})
    if st.view is not None or m.controller.known_voters or m.pods_running is not False or overridden:
        return 0.0
    return min(IDLE_BACKOFF_MAX_S, max(ctx.interval, 2 * m.idle_backoff))


def next_pass_in(ctx: OperatorContext, key: str) -> float:
    """Seconds until the resource's next daemon pass (its idle back-off, a recovery deadline,
    or the interval; :data:`STARTING_POLL_S` while a node is coming up)."""
    m = ctx.managed.get(key)
    if m is None:
        return ctx.interval
    pause = m.idle_backoff or m.controller.wake_in(ctx.interval)
    if node_starting(m.pods, m.controller.now_ms(), STARTING_FOR_S):
        return min(pause, STARTING_POLL_S)
    return pause


async def _check_pods(ctx: OperatorContext, m: Managed) -> CrashLoops:
    """List the quorum's pods and follow their crash-loop episodes: a Warning Event when one
    starts, a Normal one when it ends (Ready again, or the pod replaced). A failed listing keeps
    what was known (logged once; the pods' troubles are a report, not a decision input we guess)."""
    q = m.spec
    if m.crash_loops is None:
        m.crash_loops = CrashLoops(q.name)
    pods = ctx.pod_watch(q.namespace).pods(q.name)
    try:
        if pods is None:  # the watch is not in sync (yet): list
            pods = await ctx.kube.list_pods(q.namespace, q.selector())
    except (kopf.TemporaryError, kopf.PermanentError) as e:
        if str(e) != m.pods_unreadable:
            log.warning("%s: cannot list the quorum's pods: %s", q.cluster, e)
            m.pods_unreadable = str(e)
        m.pods_running = None
        return m.crash_loops
    m.pods_unreadable = None
    m.pods = pods
    m.pods_running = any((p.get("status") or {}).get("phase") == "Running" for p in pods)
    started, ended = m.crash_loops.update(pods)
    for t in started:
        log.warning("%s: %s", q.cluster, t.describe())
        await ctx.kube.notify(q, warning=True, reason="PodCrashLooping", message=t.describe())
    for t in ended:
        log.info("%s: pod %s no longer crash-looping", q.cluster, t.pod)
        msg = f"pod {t.pod}: crash loop over"
        await ctx.kube.notify(q, warning=False, reason="PodRecovered", message=msg)
    return m.crash_loops


async def _bind_disks(ctx: OperatorContext, m: Managed, view: QuorumView | None) -> None:
    """Node certificates follow the disks (quorumtls.py ``bind_disks``)."""
    t = ctx.tls.get(m.spec.cluster)
    if t is None:
        return
    t.observe(view)
    try:
        await t.bind_disks(ctx.kube, m.spec, owner_reference_of(m.spec), m.pods, m.replicas)
    except (kopf.TemporaryError, kopf.PermanentError) as e:  # retried on the next pass
        log.warning("%s: binding certificates to disks: %s", m.spec.cluster, e)


async def _spares(ctx: OperatorContext, m: Managed, t: QuorumTls, view: QuorumView | None) -> bool:
    """The spare certificates (spares.py); True if one was promoted."""
    t.bootstrapped = m.bootstrap_flagged or quorum_bootstrapped(view)
    try:
        return await spare_pass(t, ctx.kube, m.spec, owner_reference_of(m.spec), m.pods, view, m.replicas)
    except (kopf.TemporaryError, kopf.PermanentError) as e:  # retried on the next pass
        log.warning("%s: spare certificates: %s", m.spec.cluster, e)
        return False


async def _refresh_credential(ctx: OperatorContext, m: Managed) -> None:
    """A renewed admin credential needs a new client (its TLS context holds the old one)."""
    t = ctx.tls.get(m.spec.cluster)
    if t is None or not await t.refresh(ctx.kube, m.spec):
        return
    old = m.prober.client
    m.prober.client = QuorumClient(m.endpoints, timeout=ctx.quorum_timeout, client_config=t.config)
    m.controller.api, m.client_config = m.prober.client, t.config
    await old.close()
    log.info("%s: the operator's admin credential was renewed", m.spec.cluster)


async def _flag_bootstrapped(ctx: OperatorContext, m: Managed, view: QuorumView | None) -> None:
    if m.bootstrap_flagged or not quorum_bootstrapped(view):
        return
    # From now on a fresh volume is a replacement disk (or a new replica): formatted with
    # --no-initial-controllers by the pods before their node starts (manifests.py).
    q = m.spec
    await ctx.kube.apply(
        bootstrap_configmap(q, owner_reference_of(q), bootstrapped=True), BOOTSTRAP_FIELD_MANAGER
    )
    m.bootstrap_flagged = True
    log.info(
        "%s: quorum bootstrapped; ConfigMap %s has %s=true", q.cluster, q.bootstrap_configmap, BOOTSTRAP_KEY
    )


async def _finish_scale_down(ctx: OperatorContext, m: Managed, view: QuorumView | None) -> None:
    """The voters already are 1..N, so the extra pods hold no voter: shrink now."""
    q = m.spec
    if m.replicas <= q.voters or view is None or view.target_voters is not None:
        return
    if sorted({v.id for v in view.voters}) == list(range(1, q.voters + 1)):
        await ctx.kube.scale_statefulset(q.namespace, q.name, q.voters)
        log.info("%s: voters reassigned to 1..%d; StatefulSet scaled down", q.cluster, q.voters)
        # Keep the admin credential: without it the new client spoke plaintext to TLS nodes.
        await configure(ctx, q, {}, q.voters, m.client_config)


async def _write_status(ctx: OperatorContext, m: Managed, st: ControllerStatus) -> None:
    """Write ``status`` only when something but a condition's timestamp changed."""
    assert m.status is not None
    await m.status.write_pass(st, m.spec.generation, m.recoveries_status(), ever_available=m.ever_available)

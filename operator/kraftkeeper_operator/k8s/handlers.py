"""kopf handlers for KRaftQuorum: glue only. Kubernetes API calls are in kube.py, the per-resource
work in quorums.py, the decisions in controller.py / recovery.py / unclean.py.

* startup -> builds the :class:`~.quorums.OperatorContext` (API client, settings, metrics server)
  and puts it into kopf's ``memo``, which kopf hands to every handler (no module-level state);
* create / update (spec) / resume -> validate the spec (``manifests.parse_spec``), server-side
  apply the ``NAME-bootstrap`` ConfigMap (without its key), the StatefulSet, the two Services and
  the PodDisruptionBudget (owned by the resource), and (re)configure the resource's controller;
* a daemon per resource -> :func:`~.quorums.daemon_pass` at ``KRAFTKEEPER_RECONCILE_INTERVAL``
  (default 2 s), or sooner when a recovery deadline falls due (``RecoveryController.wake_in``);
  unclean recovery (unclean.py) runs in that pass too;
* delete -> the finalizer (``kraftkeeper.io/cleanup``, added by kopf because a delete handler
  exists) stops managing the resource and deletes the owned objects explicitly, without relying on
  a garbage collector; PVCs are retained (see manifests.py for the PVC policy).

Error policy, on purpose:

* invalid spec -> ``kopf.PermanentError`` (retrying cannot help) after writing ``status.phase=Failed``
  and an ``Available=False, reason=InvalidSpec`` condition naming the field;
* the API server refusing an object as invalid (HTTP 400/422) -> PermanentError the same way;
* the API server unreachable / 409 / 5xx -> ``kopf.TemporaryError`` (kube.py; retried with a delay);
* the quorum unreachable -> not an error at all: a status (QuorumLost), retried by the daemon.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import failpoints
from ..kafka.watchdog import watched
from . import kafkaquorums  # noqa: F401  (its import registers the Kafka daemon with kopf)
from .kafkaspec import is_kafka, reconcile_kafka, unavailable_condition
from .kube import KubeApi
from .manifests import (
    BOOTSTRAP_ANNOTATION,
    GROUP,
    PLURAL,
    VERSION,
    SpecError,
    bootstrap_configmap,
    client_service,
    headless_service,
    owner_reference,
    parse_overrides,
    parse_spec,
    pod_disruption_budget,
    statefulset,
)
from .ownership import name_conflict, older_quorums
from .quorums import OperatorContext, configure, daemon_pass, next_pass_in
from .tlsobjects import network_policy

log = logging.getLogger("kraftkeeper.operator")
MEMO_KEY = "kraftkeeper"


def context(memo: kopf.Memo) -> OperatorContext:
    """The operator context the startup handler put into kopf's memo."""
    ctx = memo.get(MEMO_KEY)
    if not isinstance(ctx, OperatorContext):  # a handler ran before startup finished: kopf's bug
        raise kopf.TemporaryError("operator context not ready yet", delay=1)
    return ctx


async def _serve_metrics(ctx: OperatorContext) -> None:
    port = int(os.environ.get("KRAFTKEEPER_METRICS_PORT", "9090") or 0)
    if port <= 0:
        return

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(ctx.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, os.environ.get("KRAFTKEEPER_METRICS_HOST", "0.0.0.0"), port).start()
    ctx.metrics_runner = runner


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = "kraftkeeper.io/cleanup"
    # kopf would also post every handler log line as an Event, through its queue (lost when the
    # operator stops before it drains) and as a second copy of what we report: every Event goes
    # through KubeApi.post_event / notify, awaited, and the log stays in the log.
    settings.posting.enabled = False
    settings.watching.server_timeout = 120
    settings.networking.request_timeout = 60
    try:
        interval, quorum_timeout = OperatorContext.settings_from_env()
        overrides = parse_overrides(os.environ.get("KRAFTKEEPER_ENDPOINT_OVERRIDES"))
        failpoints.check()  # a test hook (KRAFTKEEPER_FAILPOINT): refuse a bad value at start
    except ValueError as e:  # a misconfigured deployment: retrying cannot help
        raise kopf.PermanentError(f"operator configuration: {e}") from e
    if overrides:
        log.warning("test hook KRAFTKEEPER_ENDPOINT_OVERRIDES in use: %s", overrides)
    ctx = OperatorContext(await KubeApi.connect(), overrides, interval, quorum_timeout)
    await _serve_metrics(ctx)
    memo[MEMO_KEY] = ctx


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    ctx = memo.get(MEMO_KEY)
    if isinstance(ctx, OperatorContext):
        await ctx.close()


def _invalid(patch: kopf.Patch, generation: int, message: str) -> None:
    patch.status["phase"] = "Failed"
    patch.status["observedGeneration"] = generation
    patch.status["conditions"] = [unavailable_condition("InvalidSpec", message)]


# backoff: an unexpected error is retried after 5 s rather than kopf's default 60 s.
@kopf.on.resume(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.create(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", backoff=5)
async def reconcile(
    body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, logger: Any, **_: Any
) -> None:
    ctx = context(memo)
    if is_kafka(body):  # an existing Kafka controller quorum: no objects, only membership (kafka/kube.py)
        await reconcile_kafka(ctx, body, patch)
        return
    generation = int(meta.get("generation") or 0)
    try:
        q = parse_spec(body)
    except SpecError as e:
        _invalid(patch, generation, str(e))
        await ctx.kube.notify(body, warning=True, reason="InvalidSpec", message=str(e))
        await ctx.forget(f"{meta['namespace']}/{meta['name']}")
        raise kopf.PermanentError(f"invalid spec: {e}") from e
    conflict = name_conflict(q.name, older_quorums(body, await ctx.kube.list_quorums(q.namespace)))
    if conflict is not None:
        _invalid(patch, generation, conflict)
        await ctx.kube.notify(body, warning=True, reason="NameConflict", message=conflict)
        raise kopf.PermanentError(conflict)
    owner = owner_reference(body)
    current = await ctx.kube.read_statefulset(q.namespace, q.name)
    if current is None:
        replicas, bootstrap = q.voters, q.voters
    else:
        # Never shrink here: the daemon shrinks after the voters were reassigned (scale-down).
        replicas = max(int(current["spec"].get("replicas") or 0), q.voters)
        ann = (current["metadata"].get("annotations") or {}).get(BOOTSTRAP_ANNOTATION)
        bootstrap = int(ann) if ann and ann.isdigit() else q.voters
    waiting: kopf.TemporaryError | None = None
    try:
        for obj in (
            bootstrap_configmap(q, owner, bootstrapped=False),  # before the pods that mount it
            headless_service(q, owner),
            client_service(q, owner),
            pod_disruption_budget(q, owner),
            network_policy(q, owner),
        ):
            await ctx.kube.apply(obj)
        try:  # the TLS Secrets before the pods that mount them (quorumtls.py)
            cfg = await ctx.quorum_tls(q.cluster).ensure(ctx.kube, q, owner, replicas)
        except kopf.TemporaryError as e:  # cert-manager has not issued yet: pods wait for it too
            waiting, cfg = e, None
        await ctx.kube.apply(statefulset(q, owner, replicas=replicas, bootstrap_voters=bootstrap))
    except kopf.PermanentError as e:
        _invalid(patch, generation, str(e))
        await ctx.kube.notify(body, warning=True, reason="InvalidSpec", message=str(e))
        raise
    if waiting is not None:
        raise waiting
    await configure(ctx, q, body, replicas, cfg)
    patch.status["observedGeneration"] = generation
    if (body.get("status") or {}).get("phase") in (None, "Failed", "Pending"):
        patch.status["phase"] = "Bootstrapping"
    msg = f"{q.voters} voters desired, StatefulSet at {replicas} replicas"
    await ctx.kube.notify(body, warning=False, reason="Reconciled", message=msg)
    logger.info("reconciled %s: %s", q.cluster, msg)


@kopf.on.delete(GROUP, VERSION, PLURAL, backoff=5)
async def delete(meta: kopf.Meta, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    ctx = context(memo)
    ns, name = str(meta["namespace"]), str(meta["name"])
    await ctx.forget(f"{ns}/{name}")
    uid = str(meta["uid"])
    await ctx.kube.delete_owned(ns, name, uid)
    # cert-manager Certificates, whatever the mode was: a 404 (or no CRD) is nothing to do
    await ctx.kube.delete_certificates(
        ns, [f"{name}-operator", f"{name}-client", *(f"{name}-node-{i}" for i in range(1, 10))], uid
    )
    logger.info("deleted the objects of %s/%s; PVCs are retained", ns, name)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10, initial_delay=0.5)
async def recovery_daemon(
    meta: kopf.Meta, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: Any, **_: Any
) -> None:
    ctx = context(memo)
    key = f"{meta['namespace']}/{meta['name']}"
    while not stopped:
        try:
            # The pass runs as its own task (kafka/watchdog.py ``watched``, with no budget: every
            # API call is bounded in kube.py, every quorum call by the quorum timeout), so a
            # cancellation of the daemon itself (kopf stopping it, after ``stopped``) is told apart
            # from one that leaks out of a pass: the first propagates and ends the daemon; the
            # second is a PassCancelled, a failed pass. Passed on as CancelledError it would end
            # the daemon for good: kopf never restarts a daemon that returned.
            await watched(key, lambda: daemon_pass(ctx, key), _no_limit, _no_limit)
        except Exception:  # the daemon must survive anything: next pass retries
            logger.exception("recovery pass of %s failed", key)
        await _sleep(ctx, key, stopped, next_pass_in(ctx, key))


def _no_limit() -> float:
    return math.inf


async def _sleep(ctx: OperatorContext, key: str, stopped: kopf.DaemonStopped, seconds: float) -> None:
    """Until the next pass is due, the daemon is stopped, or the resource's pods changed
    (``OperatorContext.wake``: a quorum in its idle back-off starts at once)."""
    wake = ctx.wake_event(key)
    if wake.is_set():  # pods changed during the pass: look again now
        wake.clear()
        return
    waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait(seconds))]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    wake.clear()

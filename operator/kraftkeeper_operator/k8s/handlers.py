"""kopf handlers for KRaftQuorum: glue only, each calling a plain domain function. Kubernetes API
calls are in kube.py, the per-resource work in engine.py / kafkaspec.py (create, update, resume),
lifecycle.py (the daemon) and quorums.py / kafkaquorums.py (a pass of each membership backend),
the decisions in controller.py and the core.

* startup -> builds the :class:`~.context.OperatorContext` (API client, settings, metrics server)
  and puts it into kopf's ``memo``, which kopf hands to every handler (no module-level state);
* create / update (spec) / resume -> :func:`~.engine.reconcile_engine` (validate the spec,
  server-side apply the resource's objects, (re)configure its controller), or for ``spec.kafka``
  :func:`~.kafkaspec.reconcile_kafka` (validate only: no objects);
* one daemon per resource -> :func:`~.lifecycle.run_lifecycle`: the passes of its membership
  backend (our engine or Kafka) at ``KRAFTKEEPER_RECONCILE_INTERVAL`` (default 2 s), or sooner
  when a recovery deadline falls due (``RecoveryController.wake_in``) or its pods change;
  unclean recovery (unclean.py) runs in the engine's pass;
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

import logging
import os
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import failpoints
from .context import OperatorContext
from .engine import reconcile_engine
from .kafkaspec import is_kafka, reconcile_kafka
from .kube import KubeApi
from .lifecycle import run_lifecycle
from .manifests import GROUP, PLURAL, VERSION, parse_overrides

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


# backoff: an unexpected error is retried after 5 s rather than kopf's default 60 s.
@kopf.on.resume(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.create(GROUP, VERSION, PLURAL, backoff=5)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", backoff=5)
async def reconcile(
    body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, logger: Any, **_: Any
) -> None:
    ctx = context(memo)
    if is_kafka(body):  # an existing Kafka controller quorum: no objects, only membership
        await reconcile_kafka(ctx, body, patch)
        return
    await reconcile_engine(ctx, body, meta, patch, logger)


@kopf.on.delete(GROUP, VERSION, PLURAL, backoff=5)
async def delete(meta: kopf.Meta, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    ctx = context(memo)
    ns, name = str(meta["namespace"]), str(meta["name"])
    await ctx.forget(f"{ns}/{name}")
    uid = str(meta["uid"])
    await ctx.kube.delete_owned(ns, name, uid)
    # cert-manager Certificates, whatever the mode was: a 404 (or no CRD) is nothing to do
    await ctx.kube.delete_certificates(
        ns,
        [
            f"{name}-operator",
            f"{name}-client",
            *(f"{name}-node-{i}{s}" for i in range(1, 10) for s in ("", "-spare")),
        ],
        uid,
    )
    logger.info("deleted the objects of %s/%s; PVCs are retained", ns, name)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10, initial_delay=0.5)
async def recovery_daemon(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: Any, **_: Any
) -> None:
    """The one daemon of a KRaftQuorum, whichever its membership backend (lifecycle.py); kopf
    stops it when the resource is deleted."""
    ctx = memo.get(MEMO_KEY)
    while not isinstance(ctx, OperatorContext):  # startup has not finished yet
        await stopped.wait(0.5)
        if stopped:
            return
        ctx = memo.get(MEMO_KEY)
    await run_lifecycle(ctx, body, stopped, logger)

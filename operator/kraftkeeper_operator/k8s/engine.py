"""A KRaftQuorum run by our engine: the create / update / resume handler's work (handlers.py calls
:func:`reconcile_engine`; a resource with ``spec.kafka`` goes to kafkaspec.py's
``reconcile_kafka`` instead).

The spec is validated (``manifests.parse_spec``); then the ``NAME-bootstrap`` ConfigMap (without
its key), the two Services, the PodDisruptionBudget, the NetworkPolicy, the TLS Secrets and the
StatefulSet are server-side applied (owned by the resource), and the resource's controller is
(re)configured (quorums.py ``configure``); its daemon (lifecycle.py) does the rest. The
StatefulSet never shrinks here: the daemon shrinks it once the voters were reassigned
(scale-down, KIP-642).

Error policy: an invalid spec or an object the API server refuses as invalid is ``Failed`` with
an ``InvalidSpec`` condition naming the field (crdstatus.py ``refuse_spec``) and a
``kopf.PermanentError``; a name that makes an object name of an older quorum in the namespace is
``Failed`` with ``NameConflict``; cert-manager not having issued yet is a ``kopf.TemporaryError``
after everything else was applied.
"""

from __future__ import annotations

from typing import Any

import kopf

from .context import OperatorContext
from .crdstatus import refuse_spec
from .manifests import (
    BOOTSTRAP_ANNOTATION,
    SpecError,
    bootstrap_configmap,
    client_service,
    headless_service,
    owner_reference,
    parse_spec,
    pod_disruption_budget,
    statefulset,
)
from .ownership import name_conflict, older_quorums
from .quorums import configure
from .tlsobjects import network_policy


async def reconcile_engine(
    ctx: OperatorContext, body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, logger: Any
) -> None:
    """The create / update / resume handler for a resource our engine runs (module docstring)."""
    generation = int(meta.get("generation") or 0)
    try:
        q = parse_spec(body)
    except SpecError as e:
        await ctx.forget(f"{meta['namespace']}/{meta['name']}")
        raise await refuse_spec(ctx.kube, body, patch, str(e)) from e
    conflict = name_conflict(q.name, older_quorums(body, await ctx.kube.list_quorums(q.namespace)))
    if conflict is not None:
        raise await refuse_spec(ctx.kube, body, patch, conflict, event="NameConflict")
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
    except kopf.PermanentError as e:  # the API server refused an object as invalid
        await refuse_spec(ctx.kube, body, patch, str(e))
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
